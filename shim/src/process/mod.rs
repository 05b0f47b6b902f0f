//! This process under fgpu, the layer under the accounting and the compute limiter: its
//! mode ([`Mode`]: capped, not, or closed by a broken configuration), decided once from
//! the configuration and the ledger and built on the first call that needs it
//! (`lifecycle.rs`, which also starts it over in a forked child), and, when capped, its
//! account in the ledger ([`Account`]: the configuration, the ledger, the slot, the
//! devices and the PIDs NVML knows it by). The layers above read it through functions.
//!
//! * [`lifecycle`]: built once, leaked, forgotten in a forked child ([`PerProcess`]).
//! * [`fork`]: the one fork handler, in which each [`PerProcess`] is forgotten.
//! * [`config`]: the configuration as the shim takes it.
//! * [`account`]: the account, and the moves of its count in the ledger.
//! * [`devices`]: the devices used, registered on first use.
//! * [`nvml_pid`]: which PID NVML knows this process by.

pub mod account;
pub mod config;
pub mod devices;
pub mod fork;
pub mod lifecycle;
pub mod nvml_pid;

use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use account::Account;
use fgpu_core::ledger::Ledger;
use fgpu_core::log::{self, Level};
use fgpu_core::log_at;
use lifecycle::PerProcess;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// What the shim does in this process. `On` holds what a capped process carries: here its
/// [`Account`]; in the accounting's mode (`crate::accounting::mode`), its records too.
pub enum Mode<On = Account> {
    /// No cap is configured: every call passes straight through.
    Off,
    /// Capped and counted.
    On(On),
    /// The configuration or the ledger is broken: device memory is refused (fail closed).
    Closed(String),
}

impl<T: 'static> Mode<T> {
    /// The same mode, with what a capped process carries made by `on` from this one's.
    pub fn map<U>(&'static self, on: impl FnOnce(&'static T) -> U) -> Mode<U> {
        match self {
            Mode::Off => Mode::Off,
            Mode::On(carried) => Mode::On(on(carried)),
            Mode::Closed(why) => Mode::Closed(why.clone()),
        }
    }
}

static MODE: PerProcess<Mode> = PerProcess::new();
/// The ledger descriptor and segment, so a forked child can drop its inherited copies.
static LEDGER_FD: AtomicI32 = AtomicI32::new(-1);
static LEDGER_MAP: AtomicPtr<u8> = AtomicPtr::new(null_mut());

/// The mode of this process, built on first use.
#[inline]
pub fn mode() -> &'static Mode {
    match MODE.get() {
        Some(mode) => mode,
        None => MODE.get_or_build(build_and_note_the_ledger, after_fork_in_child),
    }
}

/// [`build`], noting where the ledger's descriptor and segment are for a forked child.
fn build_and_note_the_ledger() -> Mode {
    let mode = build();
    if let Mode::On(account) = &mode {
        LEDGER_FD.store(account.ledger().raw_fd(), Ordering::Relaxed);
        LEDGER_MAP.store(account.ledger().mapping().0, Ordering::Relaxed);
    }
    mode
}

fn build() -> Mode {
    let config = match config::load() {
        Ok(config) => config,
        Err(e) => {
            let message = format!("{e}; GPU memory allocations in this process are refused until this is fixed");
            log_at!(Level::Error, "{message}");
            return Mode::Closed(message);
        }
    };
    log::set_level(config.log);
    if !config.is_active() {
        log_at!(Level::Debug, "no cap configured (FGPU_LIMIT and FGPU_COMPUTE unset, no limit or compute in {}); not capping", fgpu_core::config::CONFIG_PATH);
        return Mode::Off;
    }
    if let Some(why) = &config.ledger_error {
        let message = format!("{why}; GPU memory allocations in this process are refused until this is fixed");
        log_at!(Level::Error, "{message}");
        return Mode::Closed(message);
    }
    if let Some(note) = &config.ledger_note {
        log_at!(Level::Warn, "{note}");
    }
    match Ledger::open(&config.ledger, config.ledger_sharing) {
        Ok(ledger) => {
            ledger.set_still_held(Box::new(nvml_still_lists));
            log_at!(Level::Debug, "ledger {} opened", config.ledger.display());
            Mode::On(Account::new(config, ledger))
        }
        Err(e) => {
            let message = format!("{e}; GPU memory allocations in this process are refused until this is fixed");
            log_at!(Level::Error, "{message}");
            Mode::Closed(message)
        }
    }
}

/// The driver's word on a process of the ledger that died: NVML still lists it on a GPU,
/// so the driver may still hold its memory (`fgpu_core::ledger::dying`). It is looked for
/// by the PID NVML gives it here: its host PID on a driver that gives host PIDs (or in the
/// host's namespace), its own PID on one that gives PIDs as this namespace sees them, if
/// it was in this namespace (`fgpu_core::nvmlpids`).
fn nvml_still_lists(dead: &fgpu_core::ledger::DeadProcess) -> bool {
    use fgpu_core::nvmlpids::NvmlPids;
    let Mode::On(account) = mode() else { return false };
    let same_ns = dead.pidns == fgpu_core::pidns::own_pidns();
    let behaviour = if fgpu_core::pidns::in_host_pidns() { NvmlPids::HostNamespace } else { account.nvml_pid().behaviour() };
    let pid = match behaviour {
        NvmlPids::HostNamespace if same_ns => dead.pid,
        NvmlPids::HostNamespace | NvmlPids::Host if dead.host_pid != 0 => dead.host_pid,
        b if b.lists_in_caller_namespace() && same_ns => dead.pid,
        _ => return false,
    };
    // Every GPU NVML lists: the dead process may have held memory on one this process has
    // not used yet (a context being created has none registered).
    let Ok(uuids) = driver().nvml_all_uuids() else { return false };
    uuids.iter().filter_map(|text| fgpu_core::uuid::DeviceUuid::parse(text)).any(|uuid| {
        driver().nvml_device_by_uuid(&uuid).and_then(|device| driver().nvml_compute_processes(device)).is_some_and(|listed| listed.iter().any(|p| p.pid == pid))
    })
}

/// A forked child is a new process: it must not share its parent's slot (it would keep the
/// parent looking alive) or its accounting. Drop the inherited ledger descriptor and mapping
/// (either one keeps the parent's liveness lock alive) and start over on the child's first
/// CUDA call. Only async-signal-safe calls here.
fn after_fork_in_child() {
    MODE.forget_in_child();
    let fd = LEDGER_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: closes the child's copy of the ledger descriptor; the leaked parent state
        // that also names it is never used again in the child.
        unsafe { libc::close(fd) };
    }
    let map = LEDGER_MAP.swap(null_mut(), Ordering::Relaxed);
    if !map.is_null() {
        // SAFETY: detaches the child's copy of the ledger segment (shmdt is a plain system
        // call, safe after fork); nothing in the child uses the parent's state (MODE was
        // reset above) and so nothing reads through it again.
        unsafe { libc::shmdt(map.cast()) };
    }
}
