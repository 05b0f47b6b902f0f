//! Why a ledger cannot be opened, created or used.

use super::layout::{MAX_DEVICES, MAX_SLOTS};
use std::io;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LedgerError {
    #[error("ledger {path}: cannot {op}: {source}")]
    Io { path: PathBuf, op: &'static str, source: io::Error },
    #[error("ledger {path}: cannot create its shared memory ({need} bytes): {why}")]
    NoSpace { path: PathBuf, need: usize, why: String },
    #[error("ledger {path}: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("ledger {path}: the file was deleted or replaced while processes still use the ledger (shared memory id {shmid}), and they cannot be reached from here; accounting cannot be trusted, so GPU memory is refused until they exit")]
    Replaced { path: PathBuf, shmid: i32 },
    #[error("ledger {path}: cannot have it from its keeper ({socket}): {why}")]
    Unserved { path: PathBuf, socket: PathBuf, why: String },
    #[error("ledger {path}: in use by processes of another IPC namespace; processes that share a ledger must share an IPC namespace")]
    OtherIpcNamespace { path: PathBuf },
    #[error("ledger {path}: in use by processes of an older fgpu (ledger format {found}; this fgpu uses format {expected}); stop them or set FGPU_LEDGER to another file")]
    Version { path: PathBuf, found: u32, expected: u32 },
    #[error("ledger {path}: no process uses it")]
    NotInUse { path: PathBuf },
    #[error("ledger {path}: all {MAX_SLOTS} process slots are in use")]
    Full { path: PathBuf },
    #[error("ledger {path}: {free} process slots are free but locked by a process that holds none of them (one lock over many slots); any user who can open a ledger shared with other users can block it this way; share it only with users you trust, or give each its own ledger")]
    SlotsLocked { path: PathBuf, free: usize },
    #[error("ledger {path}: all {MAX_DEVICES} device entries are in use")]
    TooManyDevices { path: PathBuf },
}
