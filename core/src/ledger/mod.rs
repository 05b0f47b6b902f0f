//! The ledger: one record per container (or per `fgpu run`, or per user) of each GPU's cap
//! and of what every process holds on it, shared by all of them.
//!
//! * **Storage** (`store.rs`): a System V shared-memory segment of fixed size holds the data;
//!   the ledger's path names a lock file that holds the locks and a hint to the segment. No
//!   process can shrink the segment, so none can make another fault on it, and deleting or
//!   replacing the file cannot start a second ledger beside the first.
//! * **One word per process and device** ([`Holding`]): reserved bytes, unspent credit and a
//!   change count, changed by one compare-and-swap. A device's total is the sum over the
//!   live slots; there is no second counter. So a process killed at any instruction leaves
//!   a ledger that is exact once its slot is dropped, with no repair, whoever else lives on.
//! * **Credit**: a process reserves up to [`CREDIT_CHUNK`] ahead and spends it with one
//!   compare-and-swap on its own slot, taking no lock and making no system call. Raising a
//!   device's total (a refill) is the only step that checks the cap: it sums the slots under
//!   a lock the kernel drops if its holder dies (`refill_lock`), so two processes never pass
//!   the cap together. Before any refusal the other processes' credit is taken back and dead
//!   processes are dropped. "Used" figures leave credit out.
//! * **Liveness** comes from a lock per slot that the kernel drops when the owner dies
//!   (see `lock.rs`): no PIDs are compared, so PID reuse and PID namespaces do not matter.
//! * **Layout** is fixed and versioned (`layout.rs`); a segment of another version is never
//!   attached.
//! * **Compute share** (`compute.rs`): per device the ledger's share of the GPU's time and
//!   the bucket that holds its processes to it together.

pub mod compute;
pub mod default_path;
mod devices;
pub mod dying;
mod error;
pub mod layout;
#[allow(unsafe_code)]
mod lock;
mod lock_file;
#[allow(unsafe_code)]
pub mod maps;
mod memory;
mod reclaim;
#[allow(unsafe_code)]
mod segment;
pub mod shm_usage;
mod slots;
mod snapshot;
#[allow(unsafe_code)]
pub mod store;
mod verify;

use crate::pidns;
use crate::uuid::DeviceUuid;
pub use dying::DeadProcess;
pub use error::LedgerError;
use layout::*;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Mutex;
use store::Store;
pub use store::{Sharing, Trust};

/// How long a request that does not fit waits, at most, for the memory of dying processes
/// (dead, but the driver may still hold what they had: `dying.rs`) before it is refused.
pub const DYING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The driver's word on a dead process (the shim asks NVML): whether it still holds its
/// memory.
pub type StillHeld = dyn Fn(&DeadProcess) -> bool + Send + Sync;

/// Credit a process reserves at once for its next allocations (see [`Ledger::reserve`]).
pub const CREDIT_CHUNK: u64 = 16 << 20;

/// How often, at most, [`Ledger::reclaim_if_due`] scans for dead processes. Refusals,
/// `cuMemGetInfo`, NVML memory and process queries and `fgpu status` always scan.
pub const SCAN_INTERVAL_NS: u64 = 100_000_000;

/// Index of a process slot in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(pub usize);

/// Index of a device entry in the ledger (not a CUDA or NVML index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(pub usize);

/// An allocation that would pass the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub requested: u64,
    pub cap: u64,
    /// What the ledger's processes hold (credit left out).
    pub used: u64,
    /// The cap was not the reason: the ledger's refill lock stayed held past its deadline.
    pub lock_timeout: bool,
}

/// What [`Ledger::register_device`] found or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub device: DeviceId,
    /// The cap the ledger holds for this device.
    pub ledger_cap: u64,
}

/// An attached ledger.
pub struct Ledger {
    store: Store,
    /// OFD locks belong to the open file, which all threads share: these make the refill
    /// lock exclusive between threads too.
    refill: [Mutex<()>; MAX_DEVICES],
    /// The last word this process wrote per device, in its own memory: a compare-and-swap
    /// that starts from it needs no load of the shared line first (which would fetch the
    /// line shared, then again to own it). Only a guess: a stale or torn one just fails the
    /// swap, which answers the true value.
    guesses: [[AtomicU64; 2]; MAX_DEVICES],
    /// The driver's word on dead processes, when the opener can ask it.
    still_held: std::sync::OnceLock<Box<StillHeld>>,
}

impl Ledger {
    fn with_store(store: Store) -> Ledger {
        Ledger { store, refill: Default::default(), guesses: Default::default(), still_held: std::sync::OnceLock::new() }
    }

    /// Opens the ledger at `path` as one of its processes, creating its lock file and
    /// segment if needed.
    pub fn open(path: &Path, sharing: Sharing) -> Result<Ledger, LedgerError> {
        Store::open(path, sharing).map(Self::with_store)
    }

    /// A ledger shared on purpose, by every user who can open it.
    pub fn open_or_create(path: &Path) -> Result<Ledger, LedgerError> {
        Self::open(path, Sharing::Shared)
    }

    /// Opens a ledger some process uses to look at it (`fgpu status`, `doctor`, `run`):
    /// creates, chmods, writes and waits for nothing; see [`Trust`] for what it may do.
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        Store::observe_path(path).map(Self::with_store)
    }

    /// Looks at a ledger whose lock file the caller opened read-only (resolved where its
    /// processes reach it: `crate::resolve`), in segment `shmid` if known, from the IPC
    /// namespace `ipc_ns` (a `/proc/PID/ns/ipc` file) when its processes are in another.
    pub fn observe_file(file: std::fs::File, path: &Path, shmid: Option<i32>, ipc_ns: Option<&std::fs::File>) -> Result<Ledger, LedgerError> {
        match ipc_ns {
            None => Store::observe_file(file, path, shmid).map(Self::with_store),
            Some(ns) => store::in_ipc_namespace(ns, || Store::observe_file(file, path, shmid).map(Self::with_store)).map_err(|source| LedgerError::Io {
                path: path.to_path_buf(),
                op: "enter the IPC namespace of its processes",
                source,
            })?,
        }
    }

    /// Lets the ledger ask the driver whether it still holds a dead process's memory (the
    /// shim asks NVML); without it only the process's own state is looked at (`dying.rs`).
    pub fn set_still_held(&self, check: Box<StillHeld>) {
        let _ = self.still_held.set(check);
    }

    /// What this opener may do: a member's, or an observer's verdict on the ledger.
    pub fn trust(&self) -> &Trust {
        &self.store.trust
    }

    pub fn path(&self) -> &Path {
        &self.store.path
    }

    /// Where the lock file was reached from, when the path no longer names it.
    pub fn adopted_from(&self) -> Option<&Path> {
        self.store.adopted_from.as_deref()
    }

    /// The shared-memory id of the segment.
    pub fn shmid(&self) -> i32 {
        self.store.shmid
    }

    /// The descriptor holding this process's locks (a forked child closes its copy).
    pub fn raw_fd(&self) -> i32 {
        self.store.file.as_raw_fd()
    }

    /// The lock file, open for as long as the ledger (what `fstat` says of its owner).
    pub fn lock_file(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.store.file)
    }

    /// The attached segment (address, length). A forked child detaches its copy.
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.store.base.as_ptr(), SEGMENT_SIZE)
    }

    /// Whether the ledger's path still names the lock file its processes lock; `Some(why)`
    /// when it does not (deleted or replaced). The path is looked up in the caller's own
    /// file system: ask only of a ledger the caller named, never of one whose path another
    /// user's processes wrote (the answer would tell them what exists here).
    pub fn file_problem(&self) -> Option<String> {
        let mine = store::identity(&self.store.file).ok()?;
        match std::fs::symlink_metadata(self.path()) {
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                ((meta.dev(), meta.ino()) != mine)
                    .then(|| format!("{} was replaced by another file; this ledger's processes still lock the old one", self.path().display()))
            }
            Err(_) => Some(format!("{} was deleted; this ledger's processes still lock the deleted file", self.path().display())),
        }
    }

    fn header(&self) -> &Header {
        self.store.header()
    }

    #[inline]
    fn device(&self, id: DeviceId) -> &DeviceEntry {
        self.store.device(id.0)
    }

    #[inline]
    fn slot(&self, id: SlotId) -> &Slot {
        self.store.slot(id.0)
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.store.file.as_fd()
    }

    fn with_init_lock<T>(&self, f: impl FnOnce() -> T) -> Result<T, LedgerError> {
        lock::ofd_lock_timed(self.fd(), INIT_LOCK).map_err(|e| LedgerError::Io { path: self.path().to_path_buf(), op: "lock", source: e })?;
        let out = f();
        lock::ofd_unlock(self.fd(), INIT_LOCK);
        Ok(out)
    }
}

/// One device as [`Ledger::snapshot`] saw it.
#[derive(Debug, Clone)]
pub struct DeviceView {
    pub id: DeviceId,
    /// Its UUID and kind, as recorded (`devices.rs`).
    pub uuid: DeviceUuid,
    pub cap: u64,
    /// Held by the ledger's processes (their unspent credit left out).
    pub used: u64,
    /// The most ever reserved at once, credit included.
    pub peak: u64,
    pub refusals: u64,
    pub total_memory: u64,
}

impl DeviceView {
    /// `GPU-…`, or `MIG-…` for a MIG device.
    pub fn uuid_string(&self) -> String {
        self.uuid.to_string()
    }
}

/// One process slot as [`Ledger::snapshot`] saw it.
#[derive(Debug, Clone)]
pub struct ProcessView {
    pub slot: SlotId,
    /// PID in the owner's own namespace.
    pub pid: u32,
    /// PID as the caller's namespace sees it, if visible.
    pub pid_here: Option<u32>,
    pub host_pid: Option<u32>,
    /// Whether the kernel vouches for `host_pid` (the caller is in the host's PID namespace
    /// and the slot's lock holder is that process); otherwise it is what the slot states.
    pub host_pid_vouched: bool,
    /// Dead, but the driver may still hold its memory: its bytes stay counted (`dying.rs`).
    pub dying: bool,
    pub name: String,
    /// False: the owner died and the next scan will return its memory.
    pub alive: bool,
    pub started_unix_ms: u64,
    /// Bytes held per ledger device index, contexts included.
    pub used: Vec<u64>,
    /// Bytes reserved against the cap per device: held plus unspent credit.
    pub reserved: Vec<u64>,
    pub context: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub path: PathBuf,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
