//! The compute share of one device as this process is held to it, and its buckets: the
//! ledger's (shared by all its processes, `fgpu_core::ledger::compute`) and, where this
//! process asks for less than the ledger keeps or the ledger has none, one of its own.
//! Chunks are admitted and charged against every bucket of the device (the policy is
//! `fgpu_core::compute`).

use crate::abi::cuda::CUdevice;
use crate::process::account::Account;
use crate::process::devices::Dev;
use fgpu_core::compute::{self as policy, admit_threshold, charge_keeping_rest, format_share, overdrawn, Carry};
use fgpu_core::ledger::{DeviceId, Ledger, SlotId};
use fgpu_core::log::Level;
use fgpu_core::log_at;
use fgpu_core::uuid::DeviceUuid;
use fgpu_core::view::Kept;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A device's share as this process is held to it.
pub struct DevShare {
    pub ordinal: CUdevice,
    pub id: DeviceId,
    pub uuid: DeviceUuid,
    /// The ledger's share, when it has one: its bucket is shared by all its processes.
    pub ledger_share: Option<u64>,
    /// This process's own share, when the ledger has none or a larger one: a bucket of
    /// its own as well, so it is held to the smaller of the two.
    pub own: Option<(u64, AtomicU64)>,
    /// Refunds each bucket (the ledger's, this process's own) could not take yet.
    carry: [Carry; 2],
    /// This process's work on the device cannot be measured: its launches are refused.
    refused: AtomicBool,
}

impl DevShare {
    /// The buckets to satisfy: (share, clock now).
    pub fn buckets<'a>(&'a self, ledger: &'a Ledger) -> impl Iterator<Item = (u64, u64)> + 'a {
        let shared = self.ledger_share.map(|s| (s, ledger.compute_clock(self.id)));
        let own = self.own.as_ref().map(|(s, clock)| (*s, clock.load(Ordering::Acquire)));
        shared.into_iter().chain(own)
    }

    /// Admits a chunk estimated at `gpu_ns`: charges it to every bucket of this device if
    /// each holds a chunk's worth now (`admit_threshold`), or charges nothing and returns
    /// false. Each bucket is tested and charged in one compare-and-swap, so processes of
    /// the ledger admitting at the same instant never overdraw it between them. Refunds
    /// kept for later ([`Carry`]) are spent on the charge as in [`DevShare::charge`].
    pub fn admit(&self, ledger: &Ledger, gpu_ns: u64, now: u64) -> bool {
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
            if ledger.compute_admit(self.id, amount as u64, share, admit_threshold(share), now).is_err() {
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

    /// Whether launches on this device are refused: their GPU time cannot be measured.
    #[inline]
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    /// Refuses launches on this device from now on, saying why once; true the first time.
    pub fn refuse(&self) -> bool {
        if self.refused.swap(true, Ordering::AcqRel) {
            return false;
        }
        log_at!(
            Level::Error,
            "the compute share on {} cannot be measured: NVML gives no per-process samples there and this process's kernels could not be timed by events (no marker could be recorded on their stream, or the driver could not time it); kernel launches on it are refused (CUDA_ERROR_NOT_PERMITTED) rather than run past the share",
            self.uuid
        );
        true
    }

    /// Whether any bucket of this device is overdrawn now (`fgpu_core::compute::overdrawn`).
    pub fn overdrawn(&self, ledger: &Ledger, now: u64) -> bool {
        self.buckets(ledger).any(|(_, clock)| overdrawn(clock, now))
    }

    /// Charges `gpu_ns` (negative: a refund) to every bucket of this device. A refund that
    /// a bucket cannot take at once is kept and taken off its next charges.
    pub fn charge(&self, ledger: &Ledger, gpu_ns: i64, now: u64) {
        if gpu_ns == 0 {
            return;
        }
        if let Some(share) = self.ledger_share {
            let amount = self.carry[0].spend(gpu_ns);
            if amount != 0 {
                let (_, rest) = ledger.compute_charge(self.id, amount, share, now);
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

    /// The share this process is held to on `dev` (`None`: it has none there), registered
    /// in the ledger of `account` for `slot`: the ledger's, this process's own, or both.
    pub fn of(account: &Account, slot: SlotId, dev: &Dev) -> Option<DevShare> {
        let uuid = dev.uuid.to_string();
        let own = account.config().share_for(&uuid);
        let ledger = match account.ledger().register_compute(dev.id, own.unwrap_or(0), Some(slot)) {
            Ok(share) => share,
            Err(e) => {
                // The ledger cannot be read: hold to this process's own share alone.
                log_at!(Level::Error, "{e}; the compute share on {uuid} is applied to this process alone");
                0
            }
        };
        let own = own?;
        let kept = Kept::Share { asked: own, ledger };
        if let Some(line) = kept.message(&uuid, account.ledger().path()) {
            log_at!(Level::Warn, "{line}");
        }
        let ledger_share = (ledger != 0).then_some(ledger);
        let own_bucket = (ledger == 0 || own < ledger).then(|| (own, AtomicU64::new(0)));
        log_at!(Level::Debug, "device {} is {uuid}: compute share {}", dev.ordinal, format_share(kept.held_to()));
        Some(DevShare {
            ordinal: dev.ordinal,
            id: dev.id,
            uuid: dev.uuid,
            ledger_share,
            own: own_bucket,
            carry: Default::default(),
            refused: AtomicBool::new(false),
        })
    }
}
