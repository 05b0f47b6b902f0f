//! The compute limiter: holds the kernels of a process, together with the other processes
//! of its ledger, to the ledger's share of each GPU's time (`FGPU_COMPUTE`). The policy
//! (bucket, chunk sizes, NVML samples) is `fgpu_core::compute`; the shared state is the
//! ledger's (`fgpu_core::ledger::compute`); the hooks that call in are
//! `hooks/launch.rs` (kernel launches), `hooks/graph.rs` (graph launches), `hooks/pool.rs`
//! (synchronisation) and `hooks/context.rs` (contexts going away). See `docs/compute.md`.
//!
//! * [`chunks`]: launches are admitted in chunks of about 5 ms of estimated GPU time, one
//!   open chunk per thread and stream. A launch inside a chunk costs a few loads and stores
//!   on the thread's own data; a chunk's first launch waits until the ledger's bucket holds
//!   a chunk's worth and the process's admitted work in flight is small, charges the
//!   chunk's estimate, and records an event (a marker) on the launch's stream, which also
//!   ends the chunk before it.
//! * [`sampler`]: a thread per process that sees markers complete, polls NVML's
//!   per-process samples, charges what was measured and refunds the estimates.
//!
//! A process whose configuration names no compute share pays one relaxed load per launch.

pub mod chunks;
pub mod sampler;

use crate::abi::cuda::*;
use crate::accounting::account::Account;
use crate::accounting::devices::{Dev, MAX_ORDINALS};
use crate::accounting::process::{self, Active, Mode};
use fgpu_core::compute::{self as policy, admit_threshold, charge_keeping_rest, format_share, overdrawn, Carry};
use fgpu_core::ledger::{DeviceId, SlotId};
use fgpu_core::log::Level;
use fgpu_core::log_at;
use fgpu_core::uuid::format_gpu_uuid;
use fgpu_core::view::Kept;
use parking_lot::Mutex;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

pub use chunks::Unit;

/// The limiter of this process, once built (null before, and again in a forked child).
static LIMITER: AtomicPtr<Limiter> = AtomicPtr::new(null_mut());
/// Set once this process is known to have no compute share: launches pass straight on.
static NO_SHARE: AtomicBool = AtomicBool::new(false);
static BUILD: Mutex<()> = Mutex::new(());
/// Moves on at every fork: thread-local chunks of another generation are stale.
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// A device's share as this process is held to it.
pub struct DevShare {
    pub ordinal: CUdevice,
    pub id: DeviceId,
    pub uuid: [u8; 16],
    /// The ledger's share, when it has one: its bucket is shared by all its processes.
    pub ledger_share: Option<u64>,
    /// This process's own share, when the ledger has none or a larger one: a bucket of
    /// its own as well, so it is held to the smaller of the two.
    pub own: Option<(u64, AtomicU64)>,
    /// Refunds each bucket (the ledger's, this process's own) could not take yet.
    carry: [Carry; 2],
}

impl DevShare {
    /// The buckets to satisfy: (share, clock now).
    pub fn buckets(&self, limiter: &Limiter) -> impl Iterator<Item = (u64, u64)> + '_ {
        let shared = self.ledger_share.map(|s| (s, limiter.account.ledger.compute_clock(self.id)));
        let own = self.own.as_ref().map(|(s, clock)| (*s, clock.load(Ordering::Acquire)));
        shared.into_iter().chain(own)
    }

    /// Admits a chunk estimated at `gpu_ns`: charges it to every bucket of this device if
    /// each holds a chunk's worth now (`admit_threshold`), or charges nothing and returns
    /// false. Each bucket is tested and charged in one compare-and-swap, so processes of
    /// the ledger admitting at the same instant never overdraw it between them. Refunds
    /// kept for later ([`Carry`]) are spent on the charge as in [`DevShare::charge`].
    pub fn admit(&self, limiter: &Limiter, gpu_ns: u64, now: u64) -> bool {
        let gpu = gpu_ns.min(i64::MAX as u64) as i64;
        // This process's own bucket first (nobody else charges it), then the ledger's.
        let mut own_charged = None;
        if let Some((share, clock)) = &self.own {
            let amount = self.carry[1].spend(gpu);
            let threshold = admit_threshold(*share);
            if clock.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| policy::admit(v, now, amount as u64, *share, threshold)).is_err() {
                self.carry[1].keep((gpu - amount) as u64, *share);
                return false;
            }
            own_charged = Some((amount, *share, clock));
        }
        if let Some(share) = self.ledger_share {
            let amount = self.carry[0].spend(gpu);
            if limiter.account.ledger.compute_admit(self.id, amount as u64, share, admit_threshold(share), now).is_err() {
                self.carry[0].keep((gpu - amount) as u64, share);
                if let Some((charged, own_share, clock)) = own_charged {
                    // Undo the own bucket's charge: what was charged goes back through it,
                    // what the carry paid goes back to the carry.
                    let mut rest = 0;
                    let _ = clock.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                        let (next, r) = charge_keeping_rest(v, now, -charged, own_share);
                        rest = r;
                        Some(next)
                    });
                    self.carry[1].keep(rest + (gpu - charged) as u64, own_share);
                }
                return false;
            }
        }
        true
    }

    /// Whether any bucket of this device is overdrawn now (`fgpu_core::compute::overdrawn`).
    pub fn overdrawn(&self, limiter: &Limiter, now: u64) -> bool {
        self.buckets(limiter).any(|(_, clock)| overdrawn(clock, now))
    }

    /// Charges `gpu_ns` (negative: a refund) to every bucket of this device. A refund that
    /// a bucket cannot take at once is kept and taken off its next charges.
    pub fn charge(&self, limiter: &Limiter, gpu_ns: i64, now: u64) {
        if gpu_ns == 0 {
            return;
        }
        if let Some(share) = self.ledger_share {
            let amount = self.carry[0].spend(gpu_ns);
            if amount != 0 {
                let (_, rest) = limiter.account.ledger.compute_charge(self.id, amount, share, now);
                self.carry[0].keep(rest, share);
            }
        }
        if let Some((share, clock)) = &self.own {
            let amount = self.carry[1].spend(gpu_ns);
            if amount != 0 {
                let mut rest = 0;
                let _ = clock.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    let (next, r) = charge_keeping_rest(v, now, amount, *share);
                    rest = r;
                    Some(next)
                });
                self.carry[1].keep(rest, *share);
            }
        }
    }
}

/// One per process, leaked.
pub struct Limiter {
    pub active: &'static Active,
    pub account: &'static Account,
    pub slot: SlotId,
    pub generation: u32,
    devices: [OnceLock<Option<DevShare>>; MAX_ORDINALS],
    pub registry: Mutex<chunks::Registry>,
    sampler: Once,
}

/// The limiter, or `None` when this process has no compute share (the usual case, and the
/// one that must cost nothing: one relaxed load once decided).
#[inline(always)]
pub fn limiter() -> Option<&'static Limiter> {
    if NO_SHARE.load(Ordering::Relaxed) {
        return None;
    }
    let current = LIMITER.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: LIMITER only ever holds pointers from Box::leak, never freed.
        return Some(unsafe { &*current });
    }
    build()
}

/// The limiter if one was built already (hooks that only tidy up never build one).
pub fn existing() -> Option<&'static Limiter> {
    let current = LIMITER.load(Ordering::Acquire);
    // SAFETY: as in `limiter`.
    (!current.is_null()).then(|| unsafe { &*current })
}

#[cold]
fn build() -> Option<&'static Limiter> {
    let _guard = BUILD.lock();
    let current = LIMITER.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: as in `limiter`.
        return Some(unsafe { &*current });
    }
    let active = match process::mode() {
        Mode::On(active) if active.account().config.has_compute() => active,
        // No share configured, or a broken configuration: there every context is refused
        // (fail closed), so no kernel can run to be limited.
        _ => {
            NO_SHARE.store(true, Ordering::Relaxed);
            return None;
        }
    };
    let slot = active.account().slot()?;
    crate::fork::on_child(after_fork_in_child);
    let limiter: &'static Limiter = Box::leak(Box::new(Limiter {
        active,
        account: active.account(),
        slot,
        generation: GENERATION.load(Ordering::Relaxed),
        devices: [const { OnceLock::new() }; MAX_ORDINALS],
        registry: Mutex::new(chunks::Registry::default()),
        sampler: Once::new(),
    }));
    LIMITER.store(limiter as *const Limiter as *mut Limiter, Ordering::Release);
    Some(limiter)
}

/// A forked child starts over: its parent's limiter (whose sampler thread does not exist
/// in the child) is dropped from sight, and its locks may be held by threads that are gone.
/// Only async-signal-safe work here.
fn after_fork_in_child() {
    LIMITER.store(null_mut(), Ordering::Release);
    GENERATION.fetch_add(1, Ordering::Relaxed);
    if BUILD.is_locked() {
        // SAFETY: the thread that held BUILD does not exist in the child.
        unsafe { BUILD.force_unlock() };
    }
}

impl Limiter {
    /// The share of a device this process is held to, `None` when it has none there.
    pub fn device(&self, dev: &Dev) -> Option<&DevShare> {
        let index = usize::try_from(dev.ordinal).ok().filter(|i| *i < MAX_ORDINALS)?;
        self.devices[index].get_or_init(|| self.share_of(dev)).as_ref()
    }

    /// A registered device by ordinal, if its share is known already.
    pub fn known(&self, ordinal: CUdevice) -> Option<&DevShare> {
        self.devices.get(usize::try_from(ordinal).ok()?)?.get()?.as_ref()
    }

    pub fn shares(&self) -> impl Iterator<Item = &DevShare> {
        self.devices.iter().filter_map(|d| d.get().and_then(Option::as_ref))
    }

    fn share_of(&self, dev: &Dev) -> Option<DevShare> {
        let uuid = format_gpu_uuid(&dev.uuid);
        let own = self.account.config.share_for(&uuid);
        let ledger = match self.account.ledger.register_compute(dev.id, own.unwrap_or(0), Some(self.slot)) {
            Ok(share) => share,
            Err(e) => {
                // The ledger cannot be read: hold to this process's own share alone.
                log_at!(Level::Error, "{e}; the compute share on {uuid} is applied to this process alone");
                0
            }
        };
        let own = own?;
        let kept = Kept::Share { asked: own, ledger };
        if let Some(line) = kept.message(&uuid, self.account.ledger.path()) {
            log_at!(Level::Warn, "{line}");
        }
        let ledger_share = (ledger != 0).then_some(ledger);
        let own_bucket = (ledger == 0 || own < ledger).then(|| (own, AtomicU64::new(0)));
        log_at!(Level::Debug, "device {} is {uuid}: compute share {}", dev.ordinal, format_share(kept.held_to()));
        Some(DevShare { ordinal: dev.ordinal, id: dev.id, uuid: dev.uuid, ledger_share, own: own_bucket, carry: Default::default() })
    }

    /// Starts the sampler thread on first need.
    pub fn start_sampler(&'static self) {
        self.sampler.call_once(|| sampler::start(self));
    }
}

/// Gates one launch: returns once it may go to the driver. `false` only when the limiter
/// failed (a panic caught by the hook), in which case the launch is refused.
#[inline(always)]
pub fn admit(stream: CUstream, ptsz: bool, unit: Unit) -> bool {
    let Some(limiter) = limiter() else { return true };
    if chunks::admit_fast(stream, ptsz, unit) {
        return true;
    }
    chunks::admit_slow(limiter, stream, ptsz, unit);
    true
}

/// Before a synchronisation of `stream` (`None`: the whole context, or an event's stream,
/// which fgpu cannot tell): the calling thread's chunks on it end here, so that what they
/// measure is the work and not the wait that follows.
pub fn before_sync(stream: Option<(CUstream, bool)>) {
    if let Some(limiter) = existing() {
        chunks::close_for_sync(limiter, stream);
    }
}

/// Before a context is destroyed (`cuCtxDestroy`): fgpu's markers in it are never touched
/// again (the driver destroys them with it).
pub fn before_context_destroyed(ctx: CUcontext) {
    if let Some(limiter) = existing() {
        limiter.registry.lock().context_gone(|c| c.handle == ctx as usize);
    }
}

/// Before a primary context is released or reset: as [`before_context_destroyed`] for the
/// primary context of `ordinal` (a release that is not the last leaves it alive; fgpu then
/// makes new markers, which is harmless).
pub fn before_primary_released(ordinal: CUdevice) {
    if let Some(limiter) = existing() {
        let created = limiter.active.created_contexts();
        limiter.registry.lock().context_gone(|c| c.ordinal == ordinal && !created.contains(&c.handle));
    }
}
