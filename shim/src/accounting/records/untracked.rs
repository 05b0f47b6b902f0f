//! Device memory the driver holds for this process that no hooked call announced: module
//! code and static data loaded after the context was measured (`cuModuleLoad*`,
//! `cuLibraryLoad*`, kernels loaded lazily at their first launch, the default since CUDA
//! 12.2), and whatever else the driver keeps for the process.
//!
//! Right after module and library loads (`hooks/module.rs`), and at most every [`INTERVAL_NS`] at
//! `cuMemGetInfo`, synchronisation points and reservations of 64 MiB or more, this
//! process's usage as NVML reports it is compared with what the ledger counts for it; what
//! NVML shows beyond that is counted too, as context memory (it shows in `fgpu status`
//! under the context, in every "used" figure, and holds later allocations to the cap). It
//! is only ever added, never taken back early: memory being freed, and reservations made
//! before the driver is called, make the ledger read *higher* than NVML, never lower. Two
//! things could still make it read lower, and both stop the comparison: a reservation about
//! to be corrected upwards (a context, array, pitch, pool or graph whose real size is only
//! known afterwards) in flight ([`settling`]), and any change of this process's ledger word
//! while NVML was being asked (an allocation freed in between would otherwise be counted
//! twice; the word's change count tells even a free that restored the same figure). What
//! was added goes back with the last context of the process on that device.
//!
//! Which entry of NVML's list is this process depends on the PIDs the driver gives, found
//! out from the same list (`process/nvml_pid.rs`): its `getpid()` where the driver gives PIDs as its
//! namespace sees them (current drivers, and the host's namespace), its host PID where the
//! driver gives host PIDs (from the host's `fgpu service`, or matched). Where no entry has a
//! figure for it (a driver that lists a container's processes without their memory, or not
//! at all), a module load is measured on the whole device instead, before and after the
//! load, less what this process's own count moved meanwhile ([`around_load`]); memory the
//! driver takes outside a load (kernels loaded lazily) cannot be seen then, and one line
//! says so, with the remedy.

use crate::abi::cuda::{CUdevice, CUresult, CUDA_SUCCESS};
use crate::accounting::nvml_look;
use crate::accounting::records::contexts::Contexts;
use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use crate::process::account::Account;
use crate::process::devices::Dev;
use fgpu_core::ledger::SlotId;
use fgpu_core::log::{self, Level};
use fgpu_core::log_at;
use fgpu_core::nvmlpids::NvmlPids;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};

/// How often a process compares its NVML usage with the ledger (one NVML query per device).
pub const INTERVAL_NS: u64 = 500_000_000;
/// Smaller differences are left alone (NVML reports whole MiB on some drivers).
const SLACK: u64 = 2 << 20;
/// Reservations from this size on look at NVML first (at most every [`INTERVAL_NS`]).
const LARGE: u64 = 64 << 20;

/// Whether a look found several entries that could be this process.
static AMBIGUOUS: AtomicBool = AtomicBool::new(false);

/// Memory counted beyond what the calls announced, and what keeps the comparison that
/// finds it from racing a settlement.
#[derive(Default)]
pub struct Untracked {
    /// Per device: what was added (given back with the process's last context there).
    extra: Mutex<HashMap<CUdevice, u64>>,
    /// Reserve-call-settle sequences in flight, and how many have ended.
    settling: AtomicU64,
    generation: AtomicU64,
    last_check: AtomicU64,
}

/// One device's usage before a module load, where NVML has no figure of this process's own.
struct DeviceWide {
    ordinal: i32,
    used: u64,
    own: u64,
    generation: u64,
}

fn device_used(dev: &Dev) -> Option<u64> {
    driver().nvml_memory(driver().nvml_device_by_uuid(&dev.uuid)?).map(|m| m.used)
}

impl Untracked {
    /// Runs a reserve-call-settle sequence whose settlement may raise the count: no
    /// comparison with NVML runs meanwhile, nor across it (the generation moves), so the
    /// driver's memory is never counted twice. The count goes down again when `body`
    /// returns or unwinds.
    pub fn settling<R>(&self, body: impl FnOnce() -> R) -> R {
        struct InFlight<'a>(&'a Untracked);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.generation.fetch_add(1, SeqCst);
                self.0.settling.fetch_sub(1, SeqCst);
            }
        }
        self.settling.fetch_add(1, SeqCst);
        let _in_flight = InFlight(self);
        body()
    }

    /// Whether no settlement is in flight.
    pub fn quiet(&self) -> bool {
        self.settling.load(SeqCst) == 0
    }

    /// Counts what NVML shows this process holding beyond the ledger's count, at most every
    /// [`INTERVAL_NS`].
    pub fn count(&self, account: &Account, contexts: &Contexts) {
        let now = log::monotonic_ns();
        let last = self.last_check.load(Relaxed);
        if now.saturating_sub(last) < INTERVAL_NS || self.last_check.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
            return;
        }
        self.check(account, contexts, last);
    }

    /// [`Untracked::count`] at once: after a module or library load, whose memory is what
    /// this counts.
    pub fn count_now(&self, account: &Account, contexts: &Contexts) {
        let last = self.last_check.swap(log::monotonic_ns(), Relaxed);
        self.check(account, contexts, last);
    }

    /// Before a large reservation: what the driver took unannounced must count before more
    /// is granted (at most every [`INTERVAL_NS`]).
    pub fn before_reserving(&self, account: &Account, contexts: &Contexts, bytes: u64) {
        if account.nvml_pid().host_known().is_none() {
            // Picks the host's service's answer up if it has come (no wait; nothing once known).
            let _ = account.own_host_pid();
        }
        if bytes >= LARGE {
            self.count(account, contexts);
        }
    }

    fn check(&self, account: &Account, contexts: &Contexts, last: u64) {
        let Some(slot) = account.slot_if_joined() else { return };
        // Picks up the service's answer if it has come.
        let _ = account.own_host_pid();
        for dev in account.registered_devices() {
            if !self.compare(account, contexts, dev, slot) {
                // Try again at the next chance rather than an interval later.
                self.last_check.store(last, Relaxed);
                return;
            }
        }
        say_what_cannot_be_counted(account, false);
    }

    /// One device; false when a settlement got in the way (try again later).
    fn compare(&self, account: &Account, contexts: &Contexts, dev: &Dev, slot: SlotId) -> bool {
        if !self.quiet() {
            return false;
        }
        let generation = self.generation.load(SeqCst);
        let before = account.ledger().holding(slot, dev.id);
        let Some(handle) = driver().nvml_device_by_uuid(&dev.uuid) else { return true };
        let Some(entries) = nvml_look::compute_entries(handle) else { return true };
        let listed = contexts.holds_on(dev.ordinal).then(|| before.held());
        if nvml_look::identify(account, dev.id, &entries, listed).is_some_and(|v| v.ambiguous) {
            AMBIGUOUS.store(true, Relaxed);
        }
        let Some(pid) = account.nvml_pid().memory_pid() else { return true };
        let Some(mine) = entries.iter().find(|e| e.pid == pid).and_then(|e| e.used) else { return true };
        // NVML_VALUE_NOT_AVAILABLE and other nonsense are ignored.
        if mine > dev.total {
            return true;
        }
        let after = account.ledger().holding(slot, dev.id);
        if after != before || !self.quiet() || self.generation.load(SeqCst) != generation {
            return false;
        }
        let counted = after.held();
        if mine > counted + SLACK {
            self.charge(account, dev, mine - counted, "NVML's figure for this process");
        }
        true
    }

    /// Counts `extra` bytes the driver holds for this process beyond the ledger's count.
    fn charge(&self, account: &Account, dev: &Dev, extra: u64, how: &str) {
        fgpu_core::crash_point!("untracked.measured");
        account.force_add(dev, extra);
        fgpu_core::crash_point!("untracked.charged");
        account.add_context(dev, extra as i64);
        *self.extra.lock().entry(dev.ordinal).or_insert(0) += extra;
        log_at!(
            Level::Debug,
            "device {}: the driver holds {extra} bytes for this process that no call announced (modules, lazily loaded kernels; {how}); counted",
            dev.ordinal
        );
    }

    /// Runs a module or library load and counts what it took: from NVML's figure for this
    /// process where it has one, else from the device's usage before and after the load,
    /// less what this process's own count moved meanwhile (a load racing this process's
    /// own reservations is not measured this way: its memory would count twice).
    pub fn around_load(&self, account: &Account, contexts: &Contexts, load: impl FnOnce() -> CUresult) -> CUresult {
        let slot = account.slot_if_joined();
        let baseline: Vec<DeviceWide> = match slot {
            Some(slot) if account.nvml_pid().memory_pid().is_none() && self.quiet() => account
                .registered_devices()
                .filter(|d| contexts.holds_on(d.ordinal))
                .filter_map(|d| {
                    let generation = self.generation.load(SeqCst);
                    Some(DeviceWide { ordinal: d.ordinal, used: device_used(d)?, own: account.ledger().holding(slot, d.id).held(), generation })
                })
                .collect(),
            _ => Vec::new(),
        };
        let rc = load();
        if rc != CUDA_SUCCESS {
            return rc;
        }
        self.count_now(account, contexts);
        let Some(slot) = slot else { return rc };
        if account.nvml_pid().memory_pid().is_some() {
            return rc; // the look just taken found this process's own figure
        }
        if !baseline.is_empty() {
            say_what_cannot_be_counted(account, true);
        }
        for before in baseline {
            let Some(dev) = account.known_device(before.ordinal) else { continue };
            if !self.quiet() || self.generation.load(SeqCst) != before.generation {
                log_at!(
                    Level::Debug,
                    "device {}: a module load raced this process's own reservations; its memory is not measured on the whole device",
                    dev.ordinal
                );
                continue;
            }
            let Some(used) = device_used(dev) else { continue };
            let own = account.ledger().holding(slot, dev.id).held();
            let extra = (used as i128 - before.used as i128) - (own as i128 - before.own as i128);
            if extra > SLACK as i128 && (extra as u64) <= dev.total {
                self.charge(account, dev, extra as u64, "the device's usage before and after a module load");
            }
        }
        rc
    }

    /// Gives back what was added for `ordinal` once this process has no context left on it.
    pub fn forget_if_no_context(&self, account: &Account, contexts: &Contexts, ordinal: CUdevice) {
        if contexts.any_on(ordinal) {
            return;
        }
        let extra = self.extra.lock().remove(&ordinal);
        if let Some(extra) = extra {
            account.forget_context(ordinal, extra);
        }
    }
}

/// Where NVML gives no figure for this process, one line says what cannot be counted and
/// what fixes it, instead of letting such memory pass the cap silently. `measured_around`
/// says a module load was just measured on the whole device for want of that figure.
fn say_what_cannot_be_counted(account: &Account, measured_around: bool) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.load(Relaxed) || account.nvml_pid().memory_pid().is_some() {
        return;
    }
    let behaviour = account.nvml_pid().behaviour();
    let ambiguous = AMBIGUOUS.load(Relaxed);
    if matches!(behaviour, NvmlPids::Host) || (behaviour == NvmlPids::Unknown && ambiguous) {
        if !ambiguous {
            return; // the next look may still match it
        }
        // While the service may still answer, it may still tell.
        let Some(why) = account.nvml_pid().failure() else { return };
        if SAID.swap(true, SeqCst) {
            return;
        }
        log_at!(
            Level::Warn,
            "this process's host PID is unknown ({why}) and several processes in NVML's list could be it: memory the driver takes without an allocation call (module code, lazily loaded kernels) is measured on the whole device around module loads at best, until one look tells them apart; run `fgpu service` on the host and mount its socket ({}) into the container, or run it with --pid=host",
            fgpu_core::hostpid::DEFAULT_SOCKET
        );
        return;
    }
    let what = match behaviour {
        NvmlPids::CallerNoMemory => "NVML lists this container's processes without their memory (a driver that translates PIDs into the container's namespace in its process list but not in its memory query)",
        NvmlPids::Absent => "NVML lists none of this container's processes",
        NvmlPids::Unknown if measured_around => "NVML's list has no entry that can be this process",
        _ => return,
    };
    if SAID.swap(true, SeqCst) {
        return;
    }
    log_at!(
        Level::Warn,
        "{what}: memory the driver takes without an allocation call is counted only around module loads, measured on the whole device, and kernels loaded lazily are not counted; run the container with --pid=host for an exact figure (`fgpu doctor` tells which PIDs NVML gives here)"
    );
}
