//! What `fgpu doctor` looks at ([`Facts`]), gathered from a [`System`]: the front and the
//! shim beside it (their ELF facts and a trial load of each), what is preloaded, the cap's
//! configuration, the driver, the ledger in effect, the PID namespace and the shared memory
//! ledgers take.

pub use super::system::LedgerFact;
use super::system::{HostPidError, System, TrialError};
use crate::driver::probe::{DriverProbe, ProbeError};
use crate::elf::{ElfError, ElfInfo};
use crate::observe::ledgers::{self, Origin};
use crate::shimpath::{self, ShimError};
use fgpu_core::config::{Config, ConfigError};
use fgpu_core::ledger::shm_usage::ShmUsage;
use fgpu_core::nvmlpids::NvmlPids;
use std::path::{Path, PathBuf};

pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// Symbols whose definition marks a library as a CUDA / NVML interposer.
pub const INTERPOSER_SYMBOLS: [&str; 3] = ["cuMemAlloc_v2", "cuMemAlloc", "nvmlDeviceGetMemoryInfo"];

/// One library named in `LD_PRELOAD` or /etc/ld.so.preload.
#[derive(Debug, Clone, PartialEq)]
pub struct PreloadEntry {
    pub path: String,
    /// "LD_PRELOAD" or "/etc/ld.so.preload".
    pub source: &'static str,
    pub exists: bool,
    pub is_fgpu: bool,
    /// Defines CUDA or NVML entry points (and is not fgpu).
    pub interposes: bool,
}

/// Everything the checks look at.
pub struct Facts {
    pub shim: Result<shimpath::Found, ShimError>,
    /// The front's ELF facts, once it is found.
    pub shim_elf: Option<Result<ElfInfo, ElfError>>,
    /// The ELF facts of the shim proper (`libfgpu_shim.so`, beside the front), which the
    /// front loads; `None` when the front is not found or the shim is not there.
    pub companion_elf: Option<Result<ElfInfo, ElfError>>,
    pub own_machine: Option<u16>,
    pub glibc: Option<String>,
    /// Outcome of starting `sh -c true` with the front, then the shim, preloaded.
    pub shim_trial: Option<Result<(), TrialError>>,
    pub preloads: Vec<PreloadEntry>,
    pub config: Result<Config, ConfigError>,
    pub driver: Result<DriverProbe, ProbeError>,
    pub ledger_path: PathBuf,
    pub ledger_origin: Origin,
    pub ledger: LedgerFact,
    pub host_pidns: bool,
    /// Outside the host's PID namespace: the host PID from `fgpu service`, or why not.
    pub host_pid: Result<u32, HostPidError>,
    /// Which PIDs NVML gives here, as told by its lists and the ledger's processes.
    pub nvml_pids: NvmlPids,
    /// The System V shared memory this IPC namespace uses, of the kernel's limits (every
    /// ledger is one segment); `None` when it cannot be read.
    pub shm: Option<ShmUsage>,
}

fn split_preload(text: &str) -> impl Iterator<Item = &str> {
    text.split([':', ' ', '\n', '\t']).filter(|e| !e.is_empty())
}

/// Reads the entries of `LD_PRELOAD` and /etc/ld.so.preload.
pub fn preload_entries(system: &dyn System, ld_preload: Option<&str>, ld_so_preload: Option<&str>, shim: Option<&Path>) -> Vec<PreloadEntry> {
    let mut out = Vec::new();
    let ld_so: String = ld_so_preload.unwrap_or("").lines().map(|l| l.split('#').next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let sources = [("LD_PRELOAD", ld_preload.unwrap_or("")), (LD_SO_PRELOAD, ld_so.as_str())];
    for (source, text) in sources {
        for entry in split_preload(text) {
            let path = Path::new(entry);
            let exists = system.is_file(path);
            let same_as_shim = shim.is_some_and(|s| system.canonicalize(path).as_deref() == Some(s));
            let is_fgpu = same_as_shim || path.file_name() == Some(std::ffi::OsStr::new(shimpath::FRONT_NAME));
            let interposes =
                exists && !is_fgpu && system.read_elf(path).map(|i| i.defined.iter().any(|s| INTERPOSER_SYMBOLS.contains(&s.as_str()))).unwrap_or(false);
            out.push(PreloadEntry { path: entry.to_string(), source, exists, is_fgpu, interposes });
        }
    }
    out
}

/// A trial load of the front, then of the shim proper, which the front loads from its own
/// directory on a process's first CUDA or NVML call: it must be there and load here too
/// (tried preloaded, as the front is).
fn trial_load(system: &dyn System, front: &Path) -> Result<(), TrialError> {
    system.trial_load(front)?;
    let shim = shimpath::companion(front);
    if !system.is_file(&shim) {
        return Err(TrialError::CompanionMissing(shim));
    }
    system.trial_load(&shim).map_err(|why| TrialError::Companion { shim, why: Box::new(why) })
}

/// Gathers the facts from `system`.
pub fn gather(system: &dyn System) -> Facts {
    let shim = system.locate_front();
    let shim_path = shim.as_ref().ok().map(|f| f.path.clone());
    let shim_elf = shim_path.as_deref().map(|p| system.read_elf(p));
    let companion_elf = shim_path.as_deref().map(shimpath::companion).filter(|c| system.is_file(c)).map(|c| system.read_elf(&c));
    let shim_trial = match (&shim_path, &shim_elf) {
        (Some(p), Some(Ok(_))) => Some(trial_load(system, p)),
        _ => None,
    };
    let ld_preload = system.env("LD_PRELOAD");
    let ld_so_preload = system.read_to_string(Path::new(LD_SO_PRELOAD));
    let (target, _) = ledgers::in_effect(system.config_sources());
    let driver = system.driver();
    let nvml_pids = system.nvml_pids(driver.as_ref().ok(), &target.open_path);
    Facts {
        shim,
        shim_elf,
        companion_elf,
        own_machine: system.own_machine(),
        glibc: system.glibc(),
        shim_trial,
        preloads: preload_entries(system, ld_preload.as_deref(), ld_so_preload.as_deref(), shim_path.as_deref()),
        // Not Config::load(): its warnings are findings here, not lines on stderr.
        config: Config::from_sources(system.config_sources()),
        driver,
        ledger: system.ledger(&target.open_path),
        ledger_path: target.path,
        ledger_origin: target.origin,
        host_pidns: system.in_host_pidns(),
        host_pid: system.host_pid(),
        nvml_pids,
        shm: system.shm(),
    }
}
