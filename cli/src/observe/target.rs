//! One ledger to show ([`Target`]), where it came from, and how it was found.

use fgpu_core::resolve::ProcessDir;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a ledger to show came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--ledger FILE`.
    Argument,
    /// `FGPU_LEDGER` in this environment.
    Env,
    /// `ledger =` in the configuration file.
    ConfigFile,
    /// Nothing set: the built-in default.
    Default,
    /// Found mapped by running processes.
    Scan,
}

impl Origin {
    pub fn as_str(&self) -> &'static str {
        match self {
            Origin::Argument => "argument",
            Origin::Env => "environment",
            Origin::ConfigFile => "config-file",
            Origin::Default => "default",
            Origin::Scan => "scan",
        }
    }
}

/// One ledger to show.
#[derive(Debug, Clone)]
pub struct Target {
    /// The path as its processes see it.
    pub path: PathBuf,
    /// Where fgpu resolves it: the path itself, or `/proc/PID/root` + the path for a ledger
    /// found mapped by a process (resolved inside that root, never through it).
    pub open_path: PathBuf,
    pub origin: Origin,
    /// PIDs (as seen here) that map the file; only for scanned ledgers.
    pub mapped_by: Vec<u32>,
    /// `ipc:NAMESPACE-INODE:shm:SEGMENT-ID`; only for scanned ledgers.
    pub identity: Option<String>,
    /// A problem found while scanning.
    pub problem: Option<String>,
    /// For a scanned ledger: the process it was found through, and its segment.
    pub found: Option<Arc<Found>>,
}

/// A ledger found mapped by a process.
#[derive(Debug)]
pub struct Found {
    /// `/proc/PID` of a process that maps the segment, opened before it was looked at.
    pub process: Arc<ProcessDir>,
    pub shmid: i32,
    /// The segment lives in another IPC namespace than this process's (that process's).
    pub other_ipc: bool,
}

impl Target {
    pub fn plain(path: PathBuf, origin: Origin) -> Target {
        Target { open_path: path.clone(), path, origin, mapped_by: Vec::new(), identity: None, problem: None, found: None }
    }
}
