//! Device memory the driver holds for this process that no hooked call announced: module
//! code and static data loaded after the context was measured (`cuModuleLoad*`,
//! `cuLibraryLoad*`, kernels loaded lazily at their first launch, the default since CUDA
//! 12.2), and whatever else the driver keeps for the process.
//!
//! Right after module and library loads (`module.rs`), and at most every [`INTERVAL_NS`] at
//! `cuMemGetInfo`, synchronisation points and reservations of 64 MiB or more, this
//! process's usage as NVML reports it (by host PID) is compared with what the ledger counts
//! for it; what NVML shows beyond that is counted too, as context memory (it shows in
//! `fgpu status` under the context, in every "used" figure, and holds later allocations to
//! the cap). It is only ever added, never taken back early: memory being freed, and
//! reservations made before the driver is called, make the ledger read *higher* than NVML,
//! never lower. Two things could still make it read lower, and both stop the comparison:
//! a reservation about to be corrected upwards (a context, array, pitch, pool or graph whose
//! real size is only known afterwards) in flight ([`settling`]), and any change of this
//! process's ledger word while NVML was being asked (an allocation freed in between would
//! otherwise be counted twice; the word's change count tells even a free that restored the
//! same figure). What was added goes back with the last context of the process on that
//! device.

use crate::host_pid::Match;
use crate::hooks::nvml::query;
use crate::state::{Active, Dev};
use fgpu_core::log::{self, Level};
use fgpu_core::log_at;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// How often a process compares its NVML usage with the ledger (one NVML query per device).
pub const INTERVAL_NS: u64 = 500_000_000;
/// Smaller differences are left alone (NVML reports whole MiB on some drivers).
const SLACK: u64 = 2 << 20;

/// Runs a reserve-call-settle sequence whose settlement may raise the count: no comparison
/// with NVML runs meanwhile, nor across it (the generation moves), so the driver's memory
/// is never counted twice.
pub fn settling<R>(active: &Active, body: impl FnOnce() -> R) -> R {
    struct InFlight<'a>(&'a Active);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.settle_generation.fetch_add(1, SeqCst);
            self.0.settling.fetch_sub(1, SeqCst);
        }
    }
    active.settling.fetch_add(1, SeqCst);
    let _in_flight = InFlight(active);
    body()
}

/// Counts what NVML shows this process holding beyond the ledger's count, at most every
/// [`INTERVAL_NS`].
pub fn count_untracked(active: &Active) {
    let now = log::monotonic_ns();
    let last = active.last_untracked_check.load(Relaxed);
    if now.saturating_sub(last) < INTERVAL_NS || active.last_untracked_check.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
        return;
    }
    check(active, last);
}

/// [`count_untracked`] at once: after a module or library load, whose memory is what this
/// counts.
pub fn count_untracked_now(active: &Active) {
    let last = active.last_untracked_check.swap(log::monotonic_ns(), Relaxed);
    check(active, last);
}

/// Before a large reservation: what the driver took unannounced must count before more is
/// granted (at most every [`INTERVAL_NS`]).
pub fn before_reserving(active: &Active, bytes: u64) {
    if bytes >= LARGE {
        count_untracked(active);
    }
}

/// Reservations from this size on look at NVML first (at most every [`INTERVAL_NS`]).
const LARGE: u64 = 64 << 20;

fn check(active: &Active, last: u64) {
    let Some(slot) = active.slot_if_joined() else { return };
    let pid = match query::own_host_pid() {
        Some(pid) => pid,
        None => match match_without_service(active, slot) {
            Match::HostPid(pid) => pid,
            Match::Ambiguous => return warn_unattributable(active),
            Match::Nothing => return,
        },
    };
    for dev in active.registered_devices() {
        if !compare(active, dev, slot, pid) {
            // Try again at the next chance rather than an interval later.
            active.last_untracked_check.store(last, Relaxed);
            return;
        }
    }
}

/// One device; false when a settlement got in the way (try again later).
fn compare(active: &Active, dev: &Dev, slot: fgpu_core::ledger::SlotId, pid: u32) -> bool {
    if active.settling.load(SeqCst) != 0 {
        return false;
    }
    let generation = active.settle_generation.load(SeqCst);
    let before = active.ledger.holding(slot, dev.id);
    let Some(handle) = query::handle_for(&dev.uuid) else { return true };
    let Some(mine) = query::compute_processes(handle).and_then(|list| list.into_iter().find(|p| p.pid == pid)).map(|p| p.used_gpu_memory) else {
        return true;
    };
    // NVML_VALUE_NOT_AVAILABLE and other nonsense are ignored.
    if mine > dev.total {
        return true;
    }
    let after = active.ledger.holding(slot, dev.id);
    if after != before || active.settling.load(SeqCst) != 0 || active.settle_generation.load(SeqCst) != generation {
        return false;
    }
    let counted = after.held();
    if mine > counted + SLACK {
        let extra = mine - counted;
        fgpu_core::crash_point!("untracked.measured");
        active.force_add(dev, extra);
        fgpu_core::crash_point!("untracked.charged");
        active.ledger.add_context(slot, dev.id, extra as i64);
        *active.untracked.lock().entry(dev.ordinal).or_insert(0) += extra;
        log_at!(Level::Debug, "device {}: the driver holds {extra} bytes for this process that no call announced (modules, lazily loaded kernels); counted", dev.ordinal);
    }
    true
}

/// Gives back what was added for `ordinal` once this process has no context left on it.
pub fn forget_if_no_context(active: &Active, ordinal: i32) {
    let has_context = active.primary.lock().contains_key(&ordinal) || active.contexts.lock().values().any(|(o, _)| *o == ordinal);
    if has_context {
        return;
    }
    if let Some(extra) = active.untracked.lock().remove(&ordinal) {
        super::context::forget(active, ordinal, extra);
    }
}

/// No service answers: find this process in NVML's list by what it holds (`host_pid.rs`).
fn match_without_service(active: &Active, slot: fgpu_core::ledger::SlotId) -> Match {
    if active.host_pid.failure().is_none() {
        return Match::Nothing; // the service may still answer
    }
    let snapshot = active.ledger.snapshot(Some(slot));
    // Someone in the host's namespace (`fgpu status`, the exporter) may have filled it in.
    if let Some(pid) = snapshot.processes.iter().find(|p| p.slot == slot).and_then(|p| p.host_pid) {
        return Match::HostPid(pid);
    }
    let claimed: Vec<u32> = snapshot.processes.iter().filter(|p| p.slot != slot).filter_map(|p| p.host_pid).collect();
    // NVML gives host PIDs. A PID that names one of the ledger's processes in this
    // namespace (this process's own, 1 perhaps) would come from an NVML answering in the
    // caller's namespace instead: it proves nothing about the host PID, so it is left out
    // (at worst the match waits).
    let here: Vec<u32> = snapshot.processes.iter().filter_map(|p| p.pid_here).collect();
    let mut outcome = Match::Nothing;
    for dev in active.registered_devices() {
        let Some(listed) = query::handle_for(&dev.uuid).and_then(query::compute_processes) else { continue };
        let listed: Vec<(u32, u64)> = listed.into_iter().filter(|p| !here.contains(&p.pid)).map(|p| (p.pid, p.used_gpu_memory)).collect();
        match active.host_pid.match_nvml(&listed, active.ledger.slot_used(slot, dev.id), &claimed) {
            Match::HostPid(pid) => {
                active.ledger.set_host_pid(slot, pid);
                return Match::HostPid(pid);
            }
            Match::Ambiguous => outcome = Match::Ambiguous,
            Match::Nothing => {}
        }
    }
    outcome
}

/// Without a host PID NVML's figure for this process cannot be found: say so once, with
/// the fix, instead of letting such memory pass the cap silently.
fn warn_unattributable(active: &Active) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(why) = active.host_pid.failure() else { return };
    if WARNED.swap(true, SeqCst) {
        return;
    }
    log_at!(
        Level::Warn,
        "this process's host PID is unknown ({why}): memory the driver takes without an allocation call (module code, lazily loaded kernels) cannot be counted against the cap; run `fgpu service` on the host and mount its socket ({}) into the container, or run it with --pid=host",
        fgpu_core::hostpid::DEFAULT_SOCKET
    );
}
