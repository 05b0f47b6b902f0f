//! `fgpu doctor`: is a cap applied to programs started here, and if not, why and what to do.
//!
//! Split in two: [`gather`] collects facts from the system (files, environment, a trial
//! load of the shim in a child process, the driver libraries loaded in another child
//! without the shim preloaded); [`assess`] turns facts into findings and is unit-tested
//! with made-up facts.

use crate::args::DoctorArgs;
use crate::driver_probe::DriverProbe;
#[cfg(test)]
use crate::driver_probe::{LibraryProbe, ProbedDevice};
use crate::elf::{self, ElfInfo};
use crate::ledgers::{self, Origin};
use crate::shimpath::{self, ShimError};
use fgpu_core::config::{Config, ConfigError, LimitSource, CONFIG_PATH};
use fgpu_core::ledger::shm_usage::ShmUsage;
use fgpu_core::ledger::{Ledger, LedgerError};
use fgpu_core::limit::{format_bytes, Amount, LimitSpec};
use fgpu_core::nvmlpids::{Entry, Identifier, Look, Member, NvmlPids};
use fgpu_core::view::MemoryView;
use serde::Serialize;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// Symbols whose definition marks a library as a CUDA / NVML interposer.
pub const INTERPOSER_SYMBOLS: [&str; 3] = ["cuMemAlloc_v2", "cuMemAlloc", "nvmlDeviceGetMemoryInfo"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Info,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// shim, preload, cap, driver, ledger, shm, pidns or interposer.
    pub check: &'static str,
    pub level: Level,
    pub message: String,
    /// What to do about it, for warnings and failures.
    pub advice: Option<String>,
}

fn finding(check: &'static str, level: Level, message: impl Into<String>, advice: Option<String>) -> Finding {
    Finding { check, level, message: message.into(), advice }
}

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

/// Everything [`assess`] looks at.
pub struct Facts {
    pub shim: Result<shimpath::Found, ShimError>,
    pub shim_elf: Option<Result<ElfInfo, String>>,
    pub own_machine: Option<u16>,
    pub glibc: Option<String>,
    /// Outcome of starting `sh -c true` with the shim preloaded: Err holds what went wrong.
    pub shim_trial: Option<Result<(), String>>,
    pub preloads: Vec<PreloadEntry>,
    pub config: Result<Config, ConfigError>,
    pub driver: Result<DriverProbe, String>,
    pub ledger_path: PathBuf,
    pub ledger_origin: Origin,
    pub ledger: LedgerFact,
    pub host_pidns: bool,
    /// Outside the host's PID namespace: the host PID from `fgpu service`, or why not.
    pub host_pid: Result<u32, String>,
    /// Which PIDs NVML gives here, as told by its lists and the ledger's processes.
    pub nvml_pids: NvmlPids,
    /// The System V shared memory this IPC namespace uses, of the kernel's limits (every
    /// ledger is one segment); `None` when it cannot be read.
    pub shm: Option<ShmUsage>,
}

fn describe_amount(a: Amount) -> String {
    match a {
        Amount::Bytes(b) => format_bytes(b),
        Amount::Percent(p) => format!("{p}% of the GPU's memory"),
    }
}

/// "30% of the GPU's time on every GPU".
fn describe_share(share: &fgpu_core::compute::ShareSpec) -> String {
    let spec = &share.spec;
    let time = |a: Amount| match a {
        Amount::Percent(p) => format!("{p}% of the GPU's time"),
        Amount::Bytes(b) => format_bytes(b),
    };
    let mut parts: Vec<String> = spec.per_device.iter().zip(&spec.keys).map(|((_, a), key)| format!("{} on {key}", time(*a))).collect();
    if let Some(d) = spec.default {
        parts.push(format!("{} on every {}GPU", time(d), if spec.per_device.is_empty() { "" } else { "other " }));
    }
    parts.join(", ")
}

/// "8 GiB on every GPU", "16 GiB on gpu-1a2b, 4 GiB on every other GPU".
pub fn describe_spec(spec: &LimitSpec) -> String {
    let mut parts: Vec<String> = spec.per_device.iter().zip(&spec.keys).map(|((_, a), key)| format!("{} on {key}", describe_amount(*a))).collect();
    if let Some(d) = spec.default {
        parts.push(format!("{} on every {}GPU", describe_amount(d), if spec.per_device.is_empty() { "" } else { "other " }));
    }
    parts.join(", ")
}

/// The sentence of the "no cap yet" finding that says the installation itself is sound.
const NO_CAP_YET: &str = "That is not a failure: the other checks say what works.";

/// Whether the findings say that no cap is configured (and nothing failed because of it).
fn no_cap_yet(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.check == "cap" && f.level == Level::Info && f.message.contains(NO_CAP_YET))
}

pub fn assess(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();

    // 1. The front and the shim it loads.
    let shim_ok = match &f.shim {
        Err(e) => {
            out.push(finding(
                "shim",
                Level::Fail,
                format!("The front, libfgpu.so, cannot be found: {e}"),
                Some("Install libfgpu.so and libfgpu_shim.so beside the fgpu binary (or in ../lib/fgpu), or set FGPU_SHIM to the path of libfgpu.so.".into()),
            ));
            false
        }
        Ok(found) => {
            let path = found.path.display();
            let here = f.own_machine.map(elf::machine_name).unwrap_or_else(|| "this machine".into());
            let glibc = f.glibc.clone().unwrap_or_else(|| "unknown".into());
            match (&f.shim_elf, &f.shim_trial) {
                (Some(Err(e)), _) => {
                    out.push(finding(
                        "shim",
                        Level::Fail,
                        format!("{path} is not a loadable shared library: {e}."),
                        Some("Reinstall fgpu; the file is damaged or is not fgpu's libfgpu.so.".into()),
                    ));
                    false
                }
                (Some(Ok(info)), _) if !info.class64 || Some(info.machine) != f.own_machine => {
                    let built = if info.class64 { elf::machine_name(info.machine) } else { format!("{} (32-bit)", elf::machine_name(info.machine)) };
                    out.push(finding(
                        "shim",
                        Level::Fail,
                        format!("{path} is built for {built}, but this machine runs {here}: it cannot be loaded here."),
                        Some(format!("Install the {here} build of fgpu.")),
                    ));
                    false
                }
                (Some(Ok(info)), _) if newer_glibc(info, f.glibc.as_deref()).is_some() => {
                    let need = newer_glibc(info, f.glibc.as_deref()).unwrap_or_default();
                    out.push(finding(
                        "shim",
                        Level::Fail,
                        format!("{path} needs glibc {need}, but this system has glibc {glibc}: it cannot be loaded here."),
                        Some("Install the fgpu build made for older glibc (the release is built against glibc 2.17), or build it on this system.".into()),
                    ));
                    false
                }
                (_, Some(Err(why))) => {
                    out.push(finding(
                        "shim",
                        Level::Fail,
                        format!("{path} does not load here: {why}"),
                        Some("Reinstall fgpu, or build it on this system.".into()),
                    ));
                    false
                }
                (elf_info, _) => {
                    let need = elf_info.as_ref().and_then(|r| r.as_ref().ok()).and_then(elf::newest_glibc_needed);
                    let need = need.map(|n| format!(", needs glibc {n}; this system has {glibc}")).unwrap_or_default();
                    let how = if found.from_env { " (from FGPU_SHIM)" } else { "" };
                    out.push(finding("shim", Level::Ok, format!("The front {path}{how} and the shim beside it load here ({here}{need})."), None));
                    true
                }
            }
        }
    };

    // 2. Is it preloaded?
    let mut preloaded = false;
    for p in f.preloads.iter().filter(|p| !p.exists) {
        out.push(finding(
            "preload",
            if p.is_fgpu { Level::Fail } else { Level::Warn },
            format!("{} names {}, which does not exist; the dynamic loader skips it with an error in every program.", p.source, p.path),
            Some(format!("Correct or remove the entry in {}.", p.source)),
        ));
    }
    for p in f.preloads.iter().filter(|p| p.exists && p.is_fgpu) {
        preloaded = true;
        let scope = if p.source == LD_SO_PRELOAD { "for every program on this system" } else { "for programs started from this environment" };
        out.push(finding("preload", Level::Ok, format!("{} is preloaded {scope} (through {}).", p.path, p.source), None));
    }
    if !preloaded {
        out.push(finding(
            "preload",
            Level::Warn,
            "libfgpu.so is not preloaded here: programs started from this environment are not capped unless they are started with `fgpu run`.",
            Some("Start jobs with `fgpu run --limit SIZE -- COMMAND`, or set LD_PRELOAD to the path of libfgpu.so (in a container image, write it to /etc/ld.so.preload).".into()),
        ));
    }

    // 3. Which cap applies. A device key is checked as the shim checks it: against every
    // GPU NVML lists (the probe's list).
    let config = f.config.clone().and_then(|config| {
        config.check_device_keys(|| match &f.driver {
            Ok(d) if d.nvml.loaded && d.nvml.error.is_none() => Ok(d.devices.iter().map(|d| d.uuid.clone()).collect()),
            Ok(d) => Err(d.nvml.error.clone().unwrap_or_else(|| "NVML cannot be loaded".into())),
            Err(e) => Err(e.clone()),
        })?;
        Ok(config)
    });
    if let Ok(config) = &config {
        for warning in &config.warnings {
            out.push(finding(
                "cap",
                Level::Warn,
                format!("{warning}. The cap is not affected."),
                Some("Set FGPU_LOG (or `log` in the file) to quiet, error, warn, info or debug.".into()),
            ));
        }
    }
    match &config {
        Err(e) => out.push(finding("cap", Level::Fail, format!("The cap is not valid, so none applies: {e}"), Some(config_advice(e)))),
        // Nothing configured yet (a fresh installation): nothing has failed, and nothing is
        // capped. Said as information with the next step, not as a failure.
        Ok(config) if !config.is_active() => out.push(finding(
            "cap",
            Level::Info,
            format!("No cap is configured yet (FGPU_LIMIT and FGPU_COMPUTE are not set and {CONFIG_PATH} sets no limit or compute share), so GPU programs started here are not capped. {}", NO_CAP_YET),
            Some(format!("Cap one job with `fgpu run --limit 8G -- COMMAND` (or `--compute 30%`). To cap every program of a machine or image, write `limit = 8G` to {CONFIG_PATH} (owned by root, mode 644) and preload libfgpu.so (/etc/ld.so.preload); for containers, `fgpu cdi generate`.")),
        )),
        Ok(config) if !config.is_capped() => out.push(finding(
            "cap",
            if preloaded { Level::Info } else { Level::Fail },
            format!("No memory cap is configured, only a compute share{}.", if preloaded { "" } else { ", and libfgpu.so is not preloaded here, so nothing enforces it" }),
            None,
        )),
        Ok(config) => {
            let from = match config.limit_source() {
                Some(LimitSource::File) => format!("from {CONFIG_PATH}: {}", describe_spec(config.file_limit.as_ref().unwrap())),
                Some(LimitSource::Env) => format!("from FGPU_LIMIT in the environment: {}", describe_spec(config.env_limit.as_ref().unwrap())),
                _ => format!(
                    "from both {CONFIG_PATH} ({}) and FGPU_LIMIT ({}); on each GPU the smaller applies",
                    describe_spec(config.file_limit.as_ref().unwrap()),
                    describe_spec(config.env_limit.as_ref().unwrap())
                ),
            };
            if preloaded {
                out.push(finding("cap", Level::Ok, format!("The cap comes {from}."), None));
            } else {
                out.push(finding(
                    "cap",
                    Level::Fail,
                    format!("A cap is configured ({from}), but libfgpu.so is not preloaded here, so nothing enforces it."),
                    Some("Preload libfgpu.so (LD_PRELOAD or /etc/ld.so.preload), or start the job with `fgpu run`.".into()),
                ));
            }
            if let Ok(driver) = &f.driver {
                for d in &driver.devices {
                    match config.cap_for(&d.uuid, d.total_bytes) {
                        Some(cap) => {
                            let note = if MemoryView::new(Some(cap), None, d.total_bytes).above_device() && d.total_bytes > 0 { ", more than the GPU has: programs are told its own size and the driver's limit applies" } else { "" };
                            out.push(finding("cap", Level::Info, format!("GPU {} ({}, {}, {}): capped at {}{note}.", d.index, d.name, d.uuid, format_bytes(d.total_bytes), format_bytes(cap)), None))
                        }
                        None => out.push(finding(
                            "cap",
                            Level::Warn,
                            format!("GPU {} ({}) is not capped: no entry of the limit matches its UUID and there is no `*=SIZE` entry.", d.index, d.uuid),
                            Some("Add `*=SIZE` to the limit, or an entry for this GPU's UUID.".into()),
                        )),
                    }
                }
            }
        }
    }

    // 3b. The compute share.
    if let Ok(config) = &config {
        let specs = [(&config.file_compute, CONFIG_PATH.to_string()), (&config.env_compute, "FGPU_COMPUTE in the environment".to_string())];
        let given: Vec<String> = specs.iter().filter_map(|(spec, from)| spec.as_ref().map(|s| format!("{} (from {from})", describe_share(s)))).collect();
        if !given.is_empty() {
            let level = if preloaded { Level::Ok } else { Level::Fail };
            let both = if given.len() == 2 { "; on each GPU the smaller applies" } else { "" };
            out.push(finding("compute", level, format!("A compute share is configured: {}{both}. It is a ceiling on the part of each GPU's time the kernels of this ledger's processes occupy together (docs/compute.md).", given.join(" and ")), None));
        }
    }

    // 4. The driver.
    match &f.driver {
        Err(e) => out.push(finding("driver", Level::Warn, format!("The driver libraries could not be checked: {e}"), None)),
        Ok(d) => {
            if d.cuda.loaded {
                let version = d.cuda.cuda_version.map(|v| format!(", CUDA driver API {}.{}", v / 1000, (v % 1000) / 10)).unwrap_or_default();
                let count = d.cuda.device_count.map(|c| format!(", {c} GPU{}", if c == 1 { "" } else { "s" })).unwrap_or_default();
                match &d.cuda.error {
                    None => out.push(finding("driver", Level::Ok, format!("libcuda.so.1 loads{version}{count}."), None)),
                    Some(e) => out.push(finding(
                        "driver",
                        Level::Warn,
                        format!("libcuda.so.1 loads{version}, but {e}."),
                        Some("Check that the GPU is visible here (nvidia-smi; in a container: --gpus or the NVIDIA container toolkit).".into()),
                    )),
                }
            } else {
                out.push(finding(
                    "driver",
                    Level::Warn,
                    format!(
                        "libcuda.so.1 cannot be loaded: {}. No CUDA program can run here, capped or not.",
                        d.cuda.error.as_deref().unwrap_or("unknown error")
                    ),
                    Some("Install the NVIDIA driver, or in a container make the GPU available (--gpus, the NVIDIA container toolkit).".into()),
                ));
            }
            if d.nvml.loaded {
                let version = d.nvml.driver_version.as_ref().map(|v| format!(", driver {v}")).unwrap_or_default();
                let count = d.nvml.device_count.map(|c| format!(", {c} GPU{}", if c == 1 { "" } else { "s" })).unwrap_or_default();
                match &d.nvml.error {
                    None => out.push(finding("driver", Level::Ok, format!("libnvidia-ml.so.1 loads{version}{count}."), None)),
                    Some(e) => out.push(finding("driver", Level::Warn, format!("libnvidia-ml.so.1 loads{version}, but {e}."), None)),
                }
            } else {
                out.push(finding(
                    "driver",
                    Level::Warn,
                    format!(
                        "libnvidia-ml.so.1 cannot be loaded: {}. nvidia-smi and monitoring tools will not work here.",
                        d.nvml.error.as_deref().unwrap_or("unknown error")
                    ),
                    None,
                ));
            }
        }
    }

    // 5. The ledger.
    let origin = match f.ledger_origin {
        Origin::Env => "from FGPU_LEDGER",
        Origin::ConfigFile => "from /etc/fgpu/fgpu.conf",
        _ => "the default",
    };
    let lp = f.ledger_path.display();
    match &f.ledger {
        LedgerFact::Healthy { devices, processes } => out.push(finding("ledger", Level::Ok, format!("The ledger {lp} ({origin}) is healthy: {devices} GPU(s), {processes} live process(es)."), None)),
        LedgerFact::Missing { dir_problem: None, .. } => out.push(finding("ledger", Level::Ok, format!("The ledger {lp} ({origin}) is not in use; the first capped process creates it."), None)),
        LedgerFact::FileReplaced(why) => out.push(finding(
            "ledger",
            Level::Warn,
            format!("The ledger {lp} ({origin}) is in use, but {why}. New processes reach the old file through a running member's /proc/PID/fd where they may, and refuse GPU memory where they may not."),
            Some("Do not delete or replace a ledger's file while its processes run; the ledger is whole again once they have all exited.".into()),
        )),
        LedgerFact::Missing { dir, dir_problem: Some(p) } => out.push(finding(
            "ledger",
            Level::Fail,
            format!("The ledger {lp} ({origin}) does not exist and capped processes cannot create it: {p}."),
            Some(format!("Make {} writable for the users who run GPU jobs, or set FGPU_LEDGER to a writable place.", dir.display())),
        )),
        LedgerFact::Broken(e) => out.push(finding("ledger", Level::Fail, format!("The ledger cannot be used: {e}"), Some("Stop the capped processes that use it, then remove the file; or set FGPU_LEDGER to another file.".into()))),
    }

    // 5b. Room for ledgers: each is one System V segment.
    if let Some(usage) = &f.shm {
        out.push(shm_finding(usage, matches!(f.ledger, LedgerFact::Healthy { .. })));
    }

    // 6. PID namespace, and which PIDs NVML gives here (docs/configuration.md).
    if f.host_pidns {
        out.push(finding(
            "pidns",
            Level::Info,
            "This is the host PID namespace: PIDs that fgpu status shows are host PIDs, the same as nvidia-smi shows. Every driver gives host PIDs here, so which PIDs it gives a container cannot be told from here: run `fgpu doctor` in the container while a capped process runs there.",
            None,
        ));
    } else {
        out.push(finding(
            "pidns",
            Level::Info,
            "This is not the host PID namespace (a container): fgpu status shows PIDs as seen here; nvidia-smi on the host shows other (host) PIDs. Run `fgpu status --all` as root on the host to see both.",
            None,
        ));
        out.push(pid_behaviour_finding(f));
    }
    // 7. Other interposers.
    let others: Vec<&PreloadEntry> = f.preloads.iter().filter(|p| p.interposes).collect();
    if others.is_empty() {
        out.push(finding("interposer", Level::Ok, "No other CUDA interposer is preloaded.", None));
    }
    for p in others {
        let what = if Path::new(&p.path).file_name().is_some_and(|n| n.as_bytes().starts_with(b"libvgpu")) { " (HAMi-core)" } else { "" };
        out.push(finding(
            "interposer",
            Level::Fail,
            format!("{}{what}, preloaded through {}, also intercepts CUDA memory calls: allocations it handles itself may never reach fgpu, so fgpu's cap is not guaranteed.", p.path, p.source),
            Some(format!("Use one of the two: remove {} from {}, or stop preloading fgpu.", p.path, p.source)),
        ));
    }

    if !shim_ok {
        // A preloaded front or a shim that cannot load does nothing; say so with the cap finding.
        for finding in out.iter_mut().filter(|x| x.check == "cap" && x.level == Level::Ok) {
            finding.level = Level::Fail;
            finding.message.push_str(" But fgpu's libraries cannot be loaded (see above), so the cap does not apply.");
        }
    }
    out
}

/// What the doctor says of the System V shared memory in use: a ledger is one segment, so
/// at `kernel.shmmni` segments (or `kernel.shmall` pages) no new ledger can be made, and
/// capped processes that need one are refused GPU memory. `in_use`: the ledger in effect
/// exists already (its processes join it without a new segment).
fn shm_finding(usage: &ShmUsage, in_use: bool) -> Finding {
    let page = fgpu_core::sys::page_size();
    let figures = format!(
        "{} of kernel.shmmni {} shared-memory segments and {} of kernel.shmall {} pages in use in this IPC namespace",
        usage.segments, usage.max_segments, usage.pages, usage.max_pages
    );
    let who = if usage.segments > 0 { format!(" ({})", usage.owners()) } else { String::new() };
    let advice = Some("Find the segments with `ipcs -m` and remove the unused ones with `ipcrm`, or raise the limit (`sysctl kernel.shmmni=N`).".to_string());
    match usage.limit_reached(fgpu_core::ledger::layout::SEGMENT_SIZE as u64, page) {
        Some(limit) => {
            let level = if in_use { Level::Warn } else { Level::Fail };
            let effect = if in_use {
                "The ledger in effect exists, so its new processes still join it; but no new ledger can be made here (a `fgpu run`, another user's first GPU process), and those are refused GPU memory."
            } else {
                "No ledger can be made here, so capped processes are refused GPU memory."
            };
            let limit = limit.replacen("this IPC namespace", "This IPC namespace", 1);
            finding("shm", level, format!("{limit}{who}: {figures}. {effect}"), advice)
        }
        None if usage.segments * 10 >= usage.max_segments * 9 => {
            finding("shm", Level::Warn, format!("Shared memory is nearly full: {figures}{who}; each ledger needs one more segment."), advice)
        }
        None => finding("shm", Level::Ok, format!("Room for ledgers: {figures}."), None),
    }
}

/// What the doctor says about the PIDs NVML gives a container, and what it needs.
fn pid_behaviour_finding(f: &Facts) -> Finding {
    let service = fgpu_core::hostpid::SERVICE_DIR;
    let counted = "memory the driver takes without an allocation call (module code, lazily loaded kernels) is counted against the cap, and the compute share reads this process's own utilisation samples";
    match (f.nvml_pids, &f.host_pid) {
        (NvmlPids::Caller, _) => finding(
            "pidns",
            Level::Ok,
            format!("NVML gives PIDs as this namespace sees them, with their memory (NVML PIDs: caller, as current drivers): {counted}. Neither `fgpu service` nor --pid=host is needed."),
            None,
        ),
        (NvmlPids::Host, Ok(pid)) => finding(
            "pidns",
            Level::Ok,
            format!("NVML gives host PIDs (NVML PIDs: host, as older drivers), and the host's fgpu service answers: this process is host PID {pid}, so {counted}."),
            None,
        ),
        (NvmlPids::Host, Err(why)) => finding(
            "pidns",
            Level::Warn,
            format!("NVML gives host PIDs (NVML PIDs: host, as older drivers), and host PIDs are unknown here ({why}): a process is then found in NVML's list by what it holds, which fails while several could be it, and until then memory the driver takes without an allocation call cannot be counted against the cap."),
            Some(format!("Run `fgpu service` on the host and mount {service} into the container (read-only), or run the container with --pid=host.")),
        ),
        (NvmlPids::CallerNoMemory | NvmlPids::Absent, _) => {
            let what = if f.nvml_pids == NvmlPids::Absent {
                "NVML lists none of this namespace's processes (NVML PIDs: none)"
            } else {
                "NVML lists this namespace's processes under the PIDs it sees but without their memory (NVML PIDs: caller-no-memory)"
            };
            finding(
                "pidns",
                Level::Warn,
                format!("{what}: no per-process figure is usable, so module memory is measured on the whole device around each load (exact only while nothing else on the GPU changes meanwhile) and kernels loaded lazily are not counted."),
                Some("Run the container with --pid=host: in the host's namespace every driver gives each process's memory. (`fgpu service` does not help here: NVML takes no host PIDs from inside the container.)".into()),
            )
        }
        (_, Ok(pid)) => finding(
            "pidns",
            Level::Ok,
            format!("The host's fgpu service answers: this process is host PID {pid}. Which PIDs NVML gives here cannot be told yet (NVML PIDs: unknown): no process of this ledger that this namespace sees holds GPU memory. With host PIDs the service's answer is used; with PIDs as this namespace sees them nothing is needed."),
            None,
        ),
        (_, Err(why)) => finding(
            "pidns",
            Level::Warn,
            format!("Host PIDs are unknown here ({why}), and which PIDs NVML gives cannot be told yet (NVML PIDs: unknown): no process of this ledger that this namespace sees holds GPU memory. Drivers that give PIDs as this namespace sees them need nothing; drivers that give host PIDs need the host's PID of each process for memory the driver takes without an allocation call (module code, lazily loaded kernels) to count against the cap."),
            Some(format!("Run `fgpu doctor` again while a capped process runs here; if it says host PIDs, run `fgpu service` on the host and mount {service} into the container (read-only), or run the container with --pid=host.")),
        ),
    }
}

/// Which PIDs NVML gives here, from the probe's lists and the ledger's live processes.
fn nvml_pids_here(driver: &Result<DriverProbe, String>, ledger: &Path, server: Option<&Path>) -> NvmlPids {
    if fgpu_core::pidns::in_host_pidns() {
        return NvmlPids::HostNamespace;
    }
    let (Ok(driver), Ok(ledger)) = (driver, Ledger::open_existing_at(ledger, server)) else { return NvmlPids::Unknown };
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

fn newer_glibc(info: &ElfInfo, running: Option<&str>) -> Option<String> {
    let need = elf::newest_glibc_needed(info)?;
    let have = elf::glibc_version(running?)?;
    (elf::glibc_version(&need)? > have).then_some(need)
}

fn config_advice(e: &ConfigError) -> String {
    match e {
        ConfigError::BadLimitEnv { .. } => "Set FGPU_LIMIT to a size such as 8G, a percentage such as 50%, or GPU-<uuid>=8G,*=4G.".into(),
        ConfigError::Untrusted { .. } => format!("chown root:root {CONFIG_PATH} && chmod 644 {CONFIG_PATH}"),
        ConfigError::AmbiguousKey { .. } | ConfigError::UncheckedKey { .. } => {
            "Give more of the GPU's UUID (`nvidia-smi -L` lists them), enough to name one GPU.".into()
        }
        _ => format!("Correct {CONFIG_PATH} (lines `limit = 8G`, `ledger = PATH`, `log = warn`)."),
    }
}

// ---------------------------------------------------------------- gathering facts

fn split_preload(text: &str) -> impl Iterator<Item = &str> {
    text.split([':', ' ', '\n', '\t']).filter(|e| !e.is_empty())
}

/// Reads the entries of `LD_PRELOAD` and /etc/ld.so.preload.
pub fn preload_entries(ld_preload: Option<&str>, ld_so_preload: Option<&str>, shim: Option<&Path>) -> Vec<PreloadEntry> {
    let mut out = Vec::new();
    let ld_so: String = ld_so_preload.unwrap_or("").lines().map(|l| l.split('#').next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let sources = [("LD_PRELOAD", ld_preload.unwrap_or("")), (LD_SO_PRELOAD, ld_so.as_str())];
    for (source, text) in sources {
        for entry in split_preload(text) {
            let path = Path::new(entry);
            let exists = path.is_file();
            let same_as_shim = shim.is_some_and(|s| std::fs::canonicalize(path).ok().as_deref() == Some(s));
            let is_fgpu = same_as_shim || path.file_name() == Some(std::ffi::OsStr::new(shimpath::FRONT_NAME));
            let interposes = exists && !is_fgpu && elf::read(path).map(|i| i.defined.iter().any(|s| INTERPOSER_SYMBOLS.contains(&s.as_str()))).unwrap_or(false);
            out.push(PreloadEntry { path: entry.to_string(), source, exists, is_fgpu, interposes });
        }
    }
    out
}

/// Starts `sh -c true` with the shim preloaded: ld.so prints an error and ignores the
/// library when it cannot load it, so success means a clean exit with nothing on stderr.
fn trial_load(shim: &Path) -> Result<(), String> {
    let out = Command::new("/bin/sh")
        .args(["-c", "true"])
        .env("LD_PRELOAD", shim)
        .env("FGPU_LOG", "quiet")
        .env_remove("FGPU_LIMIT")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot start /bin/sh to try it: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shim_text = shim.display().to_string();
    let relevant: Vec<&str> = stderr.lines().filter(|l| !out.status.success() || l.contains(&shim_text)).collect();
    if out.status.success() && relevant.is_empty() {
        Ok(())
    } else if relevant.is_empty() {
        Err(format!("a program started with it preloaded failed ({})", out.status))
    } else {
        Err(relevant.join(" ").trim().to_string())
    }
}

/// The shim proper, which the front loads from its own directory on a process's first CUDA
/// or NVML call: it must be there and load here too (tried preloaded, as the front is).
fn trial_load_companion(front: &Path) -> Result<(), String> {
    let shim = shimpath::companion(front);
    if !shim.is_file() {
        return Err(format!("{} is missing beside it; {} loads it on a process's first CUDA or NVML call", shim.display(), shimpath::FRONT_NAME));
    }
    trial_load(&shim).map_err(|why| format!("{}, which it loads on a process's first CUDA or NVML call: {why}", shim.display()))
}

/// Runs `fgpu __driver-probe` without the shim in `LD_PRELOAD` and reads its JSON (a shim in
/// /etc/ld.so.preload is loaded there too, and the probe goes around it: `driver_probe.rs`).
pub(crate) fn probe_driver() -> Result<DriverProbe, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the fgpu binary: {e}"))?;
    let out = Command::new(exe)
        .arg("__driver-probe")
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot start the probe: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("loading the driver libraries crashed the probe ({}): {}", out.status, stderr.trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the probe printed something unexpected: {e}"))
}

fn ledger_fact(path: &Path, server: Option<&Path>) -> LedgerFact {
    match Ledger::open_existing_at(path, server) {
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
            let writable = std::ffi::CString::new(existing.as_os_str().as_bytes())
                // SAFETY: access(2) on a valid NUL-terminated path.
                .map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0)
                .unwrap_or(false);
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

/// Asks the host's `fgpu service` this process's host PID, as the shim does (with a wait:
/// a tool may).
fn ask_host_pid() -> Result<u32, String> {
    if fgpu_core::pidns::in_host_pidns() {
        return Ok(std::process::id());
    }
    let path = std::env::var_os(fgpu_core::hostpid::ENV_SOCKET).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(fgpu_core::hostpid::DEFAULT_SOCKET));
    match fgpu_core::hostpid::Request::send(&path)?.wait(std::time::Duration::from_secs(2)) {
        fgpu_core::hostpid::Answer::HostPid(pid) => Ok(pid),
        fgpu_core::hostpid::Answer::Failed(why) => Err(why),
        fgpu_core::hostpid::Answer::Pending => Err("no answer".into()),
    }
}

pub fn gather() -> Facts {
    let shim = shimpath::locate();
    let shim_path = shim.as_ref().ok().map(|f| f.path.clone());
    let shim_elf = shim_path.as_deref().map(elf::read);
    let shim_trial = match (&shim_path, &shim_elf) {
        (Some(p), Some(Ok(_))) => Some(trial_load(p).and_then(|()| trial_load_companion(p))),
        _ => None,
    };
    let ld_preload = std::env::var("LD_PRELOAD").ok();
    let ld_so_preload = std::fs::read_to_string(LD_SO_PRELOAD).ok();
    let (target, _) = ledgers::in_effect(&fgpu_core::config::OsSources);
    let driver = probe_driver();
    let host_pid = ask_host_pid();
    let nvml_pids = nvml_pids_here(&driver, &target.open_path, target.server.as_deref());
    Facts {
        shim,
        shim_elf,
        own_machine: elf::own_machine(),
        glibc: elf::running_glibc(),
        shim_trial,
        preloads: preload_entries(ld_preload.as_deref(), ld_so_preload.as_deref(), shim_path.as_deref()),
        // Not Config::load(): its warnings are findings here, not lines on stderr.
        config: Config::from_sources(&fgpu_core::config::OsSources),
        driver,
        ledger: ledger_fact(&target.open_path, target.server.as_deref()),
        ledger_path: target.path,
        ledger_origin: target.origin,
        host_pidns: fgpu_core::pidns::in_host_pidns(),
        host_pid,
        nvml_pids,
        shm: ShmUsage::here(),
    }
}

#[derive(Serialize)]
struct DoctorJson<'a> {
    schema: u32,
    /// True when a cap applies to programs started here. False with exit status 1 when a
    /// check failed, false with exit status 0 when no cap is configured yet.
    cap_applies: bool,
    /// Which PIDs NVML gives here: host-namespace, host, caller, caller-no-memory, none or
    /// unknown (`fgpu_core::nvmlpids`, docs/configuration.md).
    nvml_pids: &'static str,
    findings: &'a [Finding],
}

pub fn doctor(args: &DoctorArgs) -> i32 {
    let facts = gather();
    let findings = assess(&facts);
    let failed = findings.iter().any(|f| f.level == Level::Fail);
    let unconfigured = no_cap_yet(&findings);
    if args.json {
        let json = DoctorJson { schema: 1, cap_applies: !failed && !unconfigured, nvml_pids: facts.nvml_pids.label(), findings: &findings };
        println!("{}", serde_json::to_string_pretty(&json).expect("findings serialise"));
    } else {
        for f in &findings {
            let tag = match f.level {
                Level::Ok => "ok  ",
                Level::Info => "info",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{tag}  {}", f.message);
            if let Some(advice) = &f.advice {
                println!("      What to do: {advice}");
            }
        }
        println!();
        if failed {
            println!("A cap would NOT apply to GPU programs started here (see FAIL above).");
        } else if unconfigured {
            println!("fgpu works here, and no cap is configured yet: see \"What to do\" above for the next step.");
        } else {
            println!("A cap applies to GPU programs started here.");
        }
    }
    i32::from(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_core::limit::parse_limit;

    fn good_facts() -> Facts {
        let info =
            ElfInfo { class64: true, little_endian: true, machine: 62, needed_versions: vec![("libc.so.6".into(), "GLIBC_2.17".into())], defined: vec![] };
        Facts {
            shim: Ok(shimpath::Found { path: "/usr/lib/fgpu/libfgpu.so".into(), from_env: false }),
            shim_elf: Some(Ok(info)),
            own_machine: Some(62),
            glibc: Some("2.36".into()),
            shim_trial: Some(Ok(())),
            preloads: vec![PreloadEntry { path: "/usr/lib/fgpu/libfgpu.so".into(), source: "LD_PRELOAD", exists: true, is_fgpu: true, interposes: false }],
            config: Ok(Config {
                file_limit: None,
                env_limit: Some(parse_limit("8G").unwrap()),
                file_compute: None,
                env_compute: None,
                ledger: "/tmp/fgpu-0/ledger".into(),
                ledger_origin: fgpu_core::config::LedgerOrigin::Default,
                ledger_sharing: fgpu_core::ledger::Sharing::User,
                ledger_note: None,
                ledger_error: None,
                ledger_server: None,
                log: fgpu_core::log::Level::Warn,
                warnings: vec![],
            }),
            driver: Ok(DriverProbe {
                cuda: LibraryProbe { loaded: true, cuda_version: Some(12080), device_count: Some(1), ..Default::default() },
                nvml: LibraryProbe { loaded: true, driver_version: Some("570.1".into()), device_count: Some(1), ..Default::default() },
                devices: vec![ProbedDevice {
                    index: 0,
                    uuid: "GPU-12345678-0000-0000-0000-000000000000".into(),
                    name: "H100".into(),
                    total_bytes: 80 << 30,
                    ..Default::default()
                }],
            }),
            ledger_path: "/tmp/.fgpu-ledger".into(),
            ledger_origin: Origin::Default,
            ledger: LedgerFact::Missing { dir: "/tmp".into(), dir_problem: None },
            host_pidns: true,
            host_pid: Err("not asked".into()),
            nvml_pids: NvmlPids::HostNamespace,
            shm: Some(ShmUsage { segments: 2, max_segments: 4096, pages: 150, max_pages: 1 << 40, by_owner: vec![(0, 2)] }),
        }
    }

    fn fails(f: &Facts) -> Vec<(&'static str, String)> {
        assess(f).into_iter().filter(|x| x.level == Level::Fail).map(|x| (x.check, x.message)).collect()
    }

    #[test]
    fn a_good_setup_passes_and_says_where_the_cap_comes_from() {
        let f = good_facts();
        assert!(fails(&f).is_empty(), "{:?}", fails(&f));
        let all = assess(&f);
        let cap = all.iter().find(|x| x.check == "cap").unwrap();
        assert!(cap.message.contains("FGPU_LIMIT") && cap.message.contains("8 GiB on every GPU"), "{}", cap.message);
        assert!(all.iter().any(|x| x.message.contains("capped at 8 GiB.")));
        let mut f = good_facts();
        f.config = Ok(Config { env_limit: Some(parse_limit("200G").unwrap()), ..f.config.unwrap() });
        assert!(assess(&f).iter().any(|x| x.message.contains("capped at 200 GiB, more than the GPU has")));
        assert!(all.iter().any(|x| x.message.contains("CUDA driver API 12.8")));
        assert!(all.iter().any(|x| x.message.contains("driver 570.1")));
    }

    #[test]
    fn a_compute_share_alone_is_a_configuration_and_is_described() {
        let mut f = good_facts();
        f.config = Ok(Config { env_limit: None, env_compute: Some(fgpu_core::compute::parse_share("30%").unwrap()), ..f.config.unwrap() });
        assert!(fails(&f).is_empty(), "{:?}", fails(&f));
        let all = assess(&f);
        let compute = all.iter().find(|x| x.check == "compute").unwrap();
        assert_eq!(compute.level, Level::Ok);
        assert!(compute.message.contains("30% of the GPU's time on every GPU (from FGPU_COMPUTE in the environment)"), "{}", compute.message);
        assert!(all.iter().any(|x| x.check == "cap" && x.message.contains("No memory cap is configured, only a compute share")));
        f.preloads.clear();
        assert!(fails(&f).iter().any(|(c, _)| *c == "compute"), "{:?}", fails(&f));
    }

    #[test]
    fn each_failure_is_named() {
        let mut f = good_facts();
        f.shim = Err(ShimError::NotFound(vec!["/a/libfgpu.so".into()]));
        assert!(fails(&f).iter().any(|(c, m)| *c == "shim" && m.contains("cannot be found")));

        let mut f = good_facts();
        if let Some(Ok(info)) = &mut f.shim_elf {
            info.machine = 183;
        }
        assert!(fails(&f).iter().any(|(_, m)| m.contains("built for AArch64")), "{:?}", fails(&f));

        let mut f = good_facts();
        if let Some(Ok(info)) = &mut f.shim_elf {
            info.needed_versions.push(("libc.so.6".into(), "GLIBC_2.38".into()));
        }
        assert!(fails(&f).iter().any(|(_, m)| m.contains("needs glibc 2.38") && m.contains("2.36")), "{:?}", fails(&f));

        let mut f = good_facts();
        f.shim_trial = Some(Err("ERROR: ld.so: object cannot be preloaded".into()));
        let failed = fails(&f);
        assert!(failed.iter().any(|(c, _)| *c == "shim"));
        assert!(failed.iter().any(|(c, m)| *c == "cap" && m.contains("does not apply")), "{failed:?}");

        let mut f = good_facts();
        f.config = Ok(Config {
            file_limit: None,
            env_limit: None,
            file_compute: None,
            env_compute: None,
            ledger: "/x".into(),
            ledger_origin: fgpu_core::config::LedgerOrigin::Env,
            ledger_sharing: fgpu_core::ledger::Sharing::Private,
            ledger_note: None,
            ledger_error: None,
            ledger_server: None,
            log: fgpu_core::log::Level::Warn,
            warnings: vec![],
        });
        // No cap configured yet is no failure: information, with the next step.
        assert!(fails(&f).is_empty(), "{:?}", fails(&f));
        let all = assess(&f);
        assert!(no_cap_yet(&all), "{all:?}");
        assert!(
            all.iter().any(|x| x.check == "cap" && x.level == Level::Info && x.advice.as_deref().is_some_and(|a| a.contains("fgpu run --limit 8G"))),
            "{all:?}"
        );

        let mut f = good_facts();
        f.config = Config::from_sources(&BadEnv);
        assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("FGPU_LIMIT=\"lots\"")), "{:?}", fails(&f));

        let mut f = good_facts();
        f.preloads.clear();
        assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("not preloaded")));

        let mut f = good_facts();
        f.ledger = LedgerFact::Broken("ledger /x: not an fgpu ledger (unknown header)".into());
        assert!(fails(&f).iter().any(|(c, m)| *c == "ledger" && m.contains("not an fgpu ledger")));

        let mut f = good_facts();
        f.preloads.push(PreloadEntry { path: "/usr/lib/libvgpu.so".into(), source: LD_SO_PRELOAD, exists: true, is_fgpu: false, interposes: true });
        assert!(fails(&f).iter().any(|(c, m)| *c == "interposer" && m.contains("HAMi-core")));
    }

    struct BadEnv;
    impl fgpu_core::config::Sources for BadEnv {
        fn env(&self, name: &str) -> Option<String> {
            (name == "FGPU_LIMIT").then(|| "lots".to_string())
        }
        fn config_file(&self) -> Result<Option<fgpu_core::config::ConfigFile>, ConfigError> {
            Ok(None)
        }
    }

    #[test]
    fn warnings_do_not_fail() {
        let mut f = good_facts();
        f.driver = Ok(DriverProbe {
            cuda: LibraryProbe { error: Some("libcuda.so.1: cannot open shared object file".into()), ..Default::default() },
            ..Default::default()
        });
        f.host_pidns = false;
        assert!(fails(&f).is_empty());
        let all = assess(&f);
        assert!(all.iter().any(|x| x.level == Level::Warn && x.message.contains("libcuda.so.1 cannot be loaded")));
        assert!(all.iter().any(|x| x.message.contains("not the host PID namespace")));
    }

    /// Each PID behaviour gets its finding: what it means, and the remedy where one is
    /// needed (docs/configuration.md).
    #[test]
    fn the_pid_behaviour_is_named_with_its_remedy() {
        let mut f = good_facts();
        f.host_pidns = false;
        let pid_finding = |f: &Facts| assess(f).into_iter().rfind(|x| x.check == "pidns").unwrap();
        let cases = [
            (NvmlPids::Caller, Err("no service".to_string()), Level::Ok, "NVML PIDs: caller", None),
            (NvmlPids::Host, Ok(4242), Level::Ok, "host PID 4242", None),
            (NvmlPids::Host, Err("no service".to_string()), Level::Warn, "NVML PIDs: host", Some("fgpu service")),
            (NvmlPids::CallerNoMemory, Ok(4242), Level::Warn, "NVML PIDs: caller-no-memory", Some("--pid=host")),
            (NvmlPids::Absent, Err("no service".to_string()), Level::Warn, "NVML PIDs: none", Some("--pid=host")),
            (NvmlPids::Unknown, Err("no service".to_string()), Level::Warn, "Host PIDs are unknown here", Some("fgpu service")),
            (NvmlPids::Unknown, Ok(4242), Level::Ok, "The host's fgpu service answers: this process is host PID 4242", None),
        ];
        for (behaviour, host_pid, level, says, advice) in cases {
            f.nvml_pids = behaviour;
            f.host_pid = host_pid;
            let x = pid_finding(&f);
            assert_eq!(x.level, level, "{behaviour:?}: {x:?}");
            assert!(x.message.contains(says), "{behaviour:?}: {x:?}");
            match advice {
                Some(a) => assert!(x.advice.as_deref().unwrap_or("").contains(a), "{behaviour:?}: {x:?}"),
                None => assert!(x.advice.is_none(), "{behaviour:?}: {x:?}"),
            }
        }
        // In the host's namespace it says it cannot tell.
        f.host_pidns = true;
        f.nvml_pids = NvmlPids::HostNamespace;
        assert!(pid_finding(&f).message.contains("cannot be told from here"));
        assert!(fails(&f).is_empty());
    }

    #[test]
    fn a_bad_log_level_is_a_warning_and_the_cap_still_applies() {
        let mut f = good_facts();
        if let Ok(config) = &mut f.config {
            config.warnings.push(r#"FGPU_LOG="bogus" is not a log level (quiet, error, warn, info, debug); ignored, logging at warn"#.into());
        }
        assert!(fails(&f).is_empty(), "{:?}", fails(&f));
        assert!(assess(&f).iter().any(|x| x.level == Level::Warn && x.check == "cap" && x.message.contains("FGPU_LOG=\"bogus\"")));
    }

    #[test]
    fn an_ambiguous_device_key_fails_as_in_the_shim() {
        let mut f = good_facts();
        if let Ok(d) = &mut f.driver {
            d.devices.push(ProbedDevice {
                index: 1,
                uuid: "GPU-12345678-1111-0000-0000-000000000000".into(),
                name: "H100".into(),
                total_bytes: 80 << 30,
                ..Default::default()
            });
        }
        f.config = Ok(Config { env_limit: Some(parse_limit("GPU-1234=2G").unwrap()), ..f.config.unwrap() });
        assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("\"GPU-1234\" is ambiguous") && m.contains("GPU-12345678-1111")), "{:?}", fails(&f));
        f.config = Ok(Config { env_limit: Some(parse_limit("GPU-12345678-1=2G").unwrap()), ..f.config.unwrap() });
        assert!(fails(&f).is_empty(), "{:?}", fails(&f));
        // Without NVML the prefix cannot be checked: the shim refuses it, so does the doctor.
        f.driver = Ok(DriverProbe {
            nvml: LibraryProbe { error: Some("libnvidia-ml.so.1: cannot open shared object file".into()), ..Default::default() },
            ..Default::default()
        });
        assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("cannot be listed")), "{:?}", fails(&f));
    }

    #[test]
    fn describes_caps() {
        assert_eq!(describe_spec(&parse_limit("8G").unwrap()), "8 GiB on every GPU");
        assert_eq!(describe_spec(&parse_limit("GPU-1a=16G,*=25%").unwrap()), "16 GiB on GPU-1a, 25% of the GPU's memory on every other GPU");
    }

    #[test]
    fn preload_entries_are_classified() {
        let entries = preload_entries(Some("/nonexistent/libfgpu.so /usr/lib/x.so"), Some("# comment\n/nonexistent/libvgpu.so\n"), None);
        assert_eq!(entries.len(), 3);
        assert!(entries[0].is_fgpu && !entries[0].exists);
        assert_eq!(entries[2].source, LD_SO_PRELOAD);
        let f = Facts { preloads: entries, ..good_facts() };
        let failed = fails(&f);
        assert!(failed.iter().any(|(c, m)| *c == "preload" && m.contains("/nonexistent/libfgpu.so, which does not exist")), "{failed:?}");
    }

    /// F5 of the second security review: a user who made segments up to kernel.shmmni keeps
    /// every new ledger from being made; the doctor names the limit and who holds them.
    #[test]
    fn shared_memory_at_its_limit_is_a_failure_that_names_it() {
        let full = ShmUsage { segments: 8, max_segments: 8, pages: 8, max_pages: 1 << 40, by_owner: vec![(4242, 7), (0, 1)] };
        let f = Facts { shm: Some(full.clone()), ..good_facts() };
        let failed = fails(&f);
        let shm = failed.iter().find(|(check, _)| *check == "shm").unwrap_or_else(|| panic!("{failed:?}"));
        assert!(shm.1.contains("kernel.shmmni (8)") && shm.1.contains("uid 4242 holds 7, uid 0 holds 1"), "{}", shm.1);
        let joined = Facts { shm: Some(full), ledger: LedgerFact::Healthy { devices: 1, processes: 1 }, ..good_facts() };
        assert_eq!(assess(&joined).iter().find(|x| x.check == "shm").unwrap().level, Level::Warn, "its own ledger still takes processes");
        let fine = assess(&good_facts());
        assert_eq!(fine.iter().find(|x| x.check == "shm").unwrap().level, Level::Ok);
    }
}
