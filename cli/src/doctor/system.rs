//! The seam between `fgpu doctor` and the machine it looks at: [`System`] is everything the
//! doctor asks of it (files, the environment, trial loads in child processes, the driver
//! probe, the ledger, the host's service), [`Host`] the machine itself. The facts are
//! gathered through it (`facts.rs`), so the tests gather them from a fake one.

use crate::driver::probe::{DriverProbe, ProbeError};
use crate::elf::{self, ElfError, ElfInfo};
use crate::shimpath::{self, ShimError};
use fgpu_core::config::Sources;
use fgpu_core::ledger::shm_usage::ShmUsage;
use fgpu_core::ledger::{Ledger, LedgerError};
use fgpu_core::nvmlpids::{Entry, Identifier, Look, Member, NvmlPids};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the doctor found of the ledger.
#[derive(Debug)]
pub enum LedgerFact {
    Missing {
        dir: PathBuf,
        dir_problem: Option<String>,
    },
    Healthy {
        devices: usize,
        processes: usize,
    },
    /// In use, but its file was deleted or replaced while its processes run.
    FileReplaced(String),
    Broken(String),
}

/// Why a library does not load in a program started with it preloaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrialError {
    #[error("cannot start /bin/sh to try it: {0}")]
    CannotStart(String),
    #[error("a program started with it preloaded failed ({0})")]
    Failed(String),
    /// What the dynamic loader printed about it.
    #[error("{0}")]
    Loader(String),
    #[error("{} is missing beside it; {} loads it on a process's first CUDA or NVML call", .0.display(), shimpath::FRONT_NAME)]
    CompanionMissing(PathBuf),
    #[error("{}, which it loads on a process's first CUDA or NVML call: {why}", shim.display())]
    Companion { shim: PathBuf, why: Box<TrialError> },
}

/// Why the host PID of this process is not known.
#[derive(Debug, thiserror::Error)]
pub enum HostPidError {
    /// No request could be sent to the service.
    #[error("{0}")]
    Send(fgpu_core::hostpid::SendError),
    /// The service's own answer.
    #[error("{0}")]
    Failed(String),
    #[error("no answer")]
    NoAnswer,
}

/// What the doctor asks of the machine.
pub trait System {
    /// Where the front is: `FGPU_SHIM`, or the search beside `fgpu` (`shimpath`).
    fn locate_front(&self) -> Result<shimpath::Found, ShimError>;
    /// The ELF facts of a file.
    fn read_elf(&self, path: &Path) -> Result<ElfInfo, ElfError>;
    /// Whether a program started with `library` preloaded runs, and no loader complains.
    fn trial_load(&self, library: &Path) -> Result<(), TrialError>;
    fn is_file(&self, path: &Path) -> bool;
    fn canonicalize(&self, path: &Path) -> Option<PathBuf>;
    /// A variable of this process's environment.
    fn env(&self, name: &str) -> Option<String>;
    fn read_to_string(&self, path: &Path) -> Option<String>;
    /// The environment and configuration file a capped process started here reads.
    fn config_sources(&self) -> &dyn Sources;
    /// The driver, as `fgpu __driver-probe` sees it without the shim.
    fn driver(&self) -> Result<DriverProbe, ProbeError>;
    /// This process's host PID, from the host's `fgpu service` outside its PID namespace.
    fn host_pid(&self) -> Result<u32, HostPidError>;
    fn in_host_pidns(&self) -> bool;
    /// What the ledger at `path` is: healthy, missing, replaced or broken.
    fn ledger(&self, path: &Path) -> LedgerFact;
    /// Which PIDs NVML gives here, from the probe's lists and the ledger's live processes.
    fn nvml_pids(&self, driver: Option<&DriverProbe>, ledger: &Path) -> NvmlPids;
    /// The ELF machine this process runs as.
    fn own_machine(&self) -> Option<u16>;
    /// The glibc this process runs with.
    fn glibc(&self) -> Option<String>;
    fn shm(&self) -> Option<ShmUsage>;
}

/// The machine the doctor runs on.
pub struct Host;

impl System for Host {
    fn locate_front(&self) -> Result<shimpath::Found, ShimError> {
        shimpath::locate()
    }

    fn read_elf(&self, path: &Path) -> Result<ElfInfo, ElfError> {
        elf::read(path)
    }

    /// Starts `sh -c true` with the library preloaded: ld.so prints an error and ignores the
    /// library when it cannot load it, so success means a clean exit with nothing on stderr.
    fn trial_load(&self, library: &Path) -> Result<(), TrialError> {
        let out = Command::new("/bin/sh")
            .args(["-c", "true"])
            .env("LD_PRELOAD", library)
            .env("FGPU_LOG", "quiet")
            .env_remove("FGPU_LIMIT")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| TrialError::CannotStart(e.to_string()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let library_text = library.display().to_string();
        let relevant: Vec<&str> = stderr.lines().filter(|l| !out.status.success() || l.contains(&library_text)).collect();
        if out.status.success() && relevant.is_empty() {
            Ok(())
        } else if relevant.is_empty() {
            Err(TrialError::Failed(out.status.to_string()))
        } else {
            Err(TrialError::Loader(relevant.join(" ").trim().to_string()))
        }
    }

    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn canonicalize(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }

    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn read_to_string(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    fn config_sources(&self) -> &dyn Sources {
        &fgpu_core::config::OsSources
    }

    fn driver(&self) -> Result<DriverProbe, ProbeError> {
        crate::driver::probe::probe_driver()
    }

    /// Asks the host's `fgpu service` as the shim does (with a wait: a tool may).
    fn host_pid(&self) -> Result<u32, HostPidError> {
        if fgpu_core::pidns::in_host_pidns() {
            return Ok(std::process::id());
        }
        let path = std::env::var_os(fgpu_core::hostpid::ENV_SOCKET).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(fgpu_core::hostpid::DEFAULT_SOCKET));
        match fgpu_core::hostpid::Request::send(&path).map_err(HostPidError::Send)?.wait(std::time::Duration::from_secs(2)) {
            fgpu_core::hostpid::Answer::HostPid(pid) => Ok(pid),
            fgpu_core::hostpid::Answer::Failed(why) => Err(HostPidError::Failed(why)),
            fgpu_core::hostpid::Answer::Pending => Err(HostPidError::NoAnswer),
        }
    }

    fn in_host_pidns(&self) -> bool {
        fgpu_core::pidns::in_host_pidns()
    }

    fn ledger(&self, path: &Path) -> LedgerFact {
        match Ledger::open_existing(path) {
            Ok(ledger) => {
                if let Some(why) = ledger.file_problem() {
                    return LedgerFact::FileReplaced(why);
                }
                let snap = ledger.snapshot(None);
                LedgerFact::Healthy { devices: snap.devices.len(), processes: snap.processes.iter().filter(|p| p.alive).count() }
            }
            Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                // The shim creates missing directories; the first existing ancestor must be writable.
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
                let existing = dir.ancestors().find(|a| a.exists()).unwrap_or(Path::new("/")).to_path_buf();
                let writable = fgpu_core::sys::files::access(&existing, libc::W_OK | libc::X_OK).is_ok();
                let dir_problem = (!writable).then(|| format!("{} is not writable by this user", existing.display()));
                LedgerFact::Missing { dir: existing, dir_problem }
            }
            Err(LedgerError::NotInUse { .. }) => {
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
                LedgerFact::Missing { dir, dir_problem: None }
            }
            Err(LedgerError::Replaced { .. }) => {
                LedgerFact::FileReplaced(format!("{} was deleted or replaced while its processes still use the ledger", path.display()))
            }
            Err(e) => LedgerFact::Broken(e.to_string()),
        }
    }

    fn nvml_pids(&self, driver: Option<&DriverProbe>, ledger: &Path) -> NvmlPids {
        if fgpu_core::pidns::in_host_pidns() {
            return NvmlPids::HostNamespace;
        }
        let (Some(driver), Ok(ledger)) = (driver, Ledger::open_existing(ledger)) else { return NvmlPids::Unknown };
        let snap = ledger.snapshot(None);
        for device in &snap.devices {
            let Some(probed) = driver.devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(&device.uuid_string())) else { continue };
            let others: Vec<Member> = snap
                .processes
                .iter()
                .filter(|p| p.alive)
                .map(|p| Member { here: p.pid_here, host: p.host_pid, counted: p.used.get(device.id.0).copied().unwrap_or(0) })
                .collect();
            let entries: Vec<Entry> = probed.compute_processes.iter().map(|(pid, used)| Entry::new(*pid, *used)).collect();
            let verdict = Identifier::default().look(&Look { at_ns: 0, own: None, others: &others, entries: &entries });
            if verdict.behaviour != NvmlPids::Unknown {
                return verdict.behaviour;
            }
        }
        NvmlPids::Unknown
    }

    fn own_machine(&self) -> Option<u16> {
        elf::own_machine()
    }

    fn glibc(&self) -> Option<String> {
        elf::running_glibc()
    }

    fn shm(&self) -> Option<ShmUsage> {
        ShmUsage::here()
    }
}
