//! The compute limiter of this process: built on the first launch that needs it (nothing
//! when the configuration names no compute share: one relaxed load per launch), dropped
//! from sight in a forked child (`process/lifecycle.rs`); the share of each device it holds
//! the process to, and the chunks it has in flight, settled against the ledger. It reads
//! the process (`crate::process`) through its account's functions.

use super::chunks::{Registry, Settled};
use super::share::DevShare;
use crate::abi::cuda::CUdevice;
use crate::driver::instance::driver;
use crate::driver::seam::relaxed;
use crate::process::account::Account;
use crate::process::devices::{Dev, MAX_ORDINALS};
use crate::process::lifecycle::PerProcess;
use crate::process::{self, Mode};
use fgpu_core::ledger::{Ledger, SlotId};
use fgpu_core::log::{monotonic_ns, Level};
use fgpu_core::log_at;
use fgpu_core::uuid::UuidKind;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Once, OnceLock};

/// The limiter of this process, once built (none before, and again in a forked child).
static LIMITER: PerProcess<Limiter> = PerProcess::new();
/// Set once this process is known to have no compute share: launches pass straight on.
static NO_SHARE: AtomicBool = AtomicBool::new(false);
/// Moves on at every fork: thread-local chunks of another generation are stale.
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// One per process, leaked.
pub struct Limiter {
    /// This process's account in its ledger.
    pub account: &'static Account,
    pub slot: SlotId,
    pub generation: u32,
    devices: [OnceLock<Option<DevShare>>; MAX_ORDINALS],
    pub registry: Mutex<Registry>,
    /// Started once: the sampler thread (`sampler.rs`).
    pub sampler: Once,
}

/// The limiter, or `None` when this process has no compute share (the usual case, and the
/// one that must cost nothing: one relaxed load once decided).
#[inline(always)]
pub fn limiter() -> Option<&'static Limiter> {
    if NO_SHARE.load(Ordering::Relaxed) {
        return None;
    }
    match LIMITER.get() {
        Some(limiter) => Some(limiter),
        None => LIMITER.get_or_try_build(build, after_fork_in_child),
    }
}

/// The limiter if one was built already (hooks that only tidy up never build one).
pub fn existing() -> Option<&'static Limiter> {
    LIMITER.get()
}

fn build() -> Option<Limiter> {
    let account = match process::mode() {
        Mode::On(account) if account.config().has_compute() => account,
        // No share configured, or a broken configuration: there every context is refused
        // (fail closed), so no kernel can run to be limited.
        _ => {
            NO_SHARE.store(true, Ordering::Relaxed);
            return None;
        }
    };
    let slot = account.slot()?;
    Some(Limiter {
        account,
        slot,
        generation: GENERATION.load(Ordering::Relaxed),
        devices: [const { OnceLock::new() }; MAX_ORDINALS],
        registry: Mutex::new(Registry::default()),
        sampler: Once::new(),
    })
}

/// A forked child starts over: its parent's limiter (whose sampler thread does not exist
/// in the child) is dropped from sight, and its locks may be held by threads that are gone.
/// Only async-signal-safe work here.
fn after_fork_in_child() {
    LIMITER.forget_in_child();
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

impl Limiter {
    /// The ledger the process counts in (its account's).
    #[inline]
    pub fn ledger(&self) -> &'static Ledger {
        self.account.ledger()
    }

    /// The share of a device this process is held to, `None` when it has none there. On a
    /// MIG device the process's events measure it from the start: NVML gives no per-process
    /// samples on a GPU in MIG mode (nvml.h, `nvmlDeviceGetProcessUtilization`: "On
    /// MIG-enabled GPUs, querying process utilization is not currently supported").
    pub fn device(&self, dev: &Dev) -> Option<&DevShare> {
        let index = usize::try_from(dev.ordinal).ok().filter(|i| *i < MAX_ORDINALS)?;
        self.devices[index]
            .get_or_init(|| {
                let share = DevShare::of(self.account, self.slot, dev)?;
                if dev.uuid.kind == UuidKind::Mig {
                    self.registry.lock().book(dev.ordinal).by_events = true;
                    log_at!(
                        Level::Debug,
                        "{} is a MIG device: NVML gives no per-process samples there; its compute share is measured by this process's events",
                        dev.uuid
                    );
                }
                Some(share)
            })
            .as_ref()
    }

    /// A registered device by ordinal, if its share is known already.
    pub fn known(&self, ordinal: CUdevice) -> Option<&DevShare> {
        self.devices.get(usize::try_from(ordinal).ok()?)?.get()?.as_ref()
    }

    pub fn shares(&self) -> impl Iterator<Item = &DevShare> {
        self.devices.iter().filter_map(|d| d.get().and_then(Option::as_ref))
    }
}

/// Applies what [`Registry::settle`] found to the ledger; a device whose work cannot be
/// measured is refused from now on, its open chunks ended at their next launch.
pub fn apply(limiter: &Limiter, settled: Settled, now: u64) {
    for ordinal in settled.unmeasurable {
        if let Some(dev) = limiter.known(ordinal) {
            if dev.refuse() {
                limiter.registry.lock().revoke_open(ordinal);
            }
        }
    }
    for (ordinal, charge, measured) in settled.charges {
        if let Some(dev) = limiter.known(ordinal) {
            dev.charge(limiter.ledger(), charge, now);
            if measured != 0 {
                limiter.ledger().compute_record(limiter.slot, dev.id, measured, now);
            }
        }
    }
}

/// Settles the registry now and applies it; the sampler and waiting launches call this.
pub fn settle_now(limiter: &Limiter) {
    let now = monotonic_ns();
    let settled = relaxed(driver(), || {
        let mut registry = limiter.registry.lock();
        let covered: Vec<(CUdevice, Option<u64>)> = registry.books.iter().map(|(o, b)| (*o, b.nvml.as_ref().and_then(|n| n.covered_mono()))).collect();
        registry.settle(now, |o| covered.iter().find(|c| c.0 == o).and_then(|c| c.1))
    });
    apply(limiter, settled, now);
}
