//! The compute share's part of the ledger: per device, the ledger's share and the bucket
//! that holds all its processes to it together ([`ComputeEntry`]), and per process the GPU
//! time measured for it (`Slot::compute`). The policy is in `crate::compute`; the shim
//! charges and measures (`shim/src/compute/`).
//!
//! The bucket is one word (the virtual clock), changed by compare-and-swap: a process
//! killed at any instruction leaves it whole. What a dead process had charged in advance
//! for work that never ran stays charged (at most the chunks it had in flight, a few tens
//! of milliseconds of the share); nothing else of it is kept.

use super::layout::*;
use super::{DeviceId, Ledger, LedgerError, SlotId};
use crate::compute::{admit, charge_keeping_rest, PPM};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// The use `fgpu status` shows is measured over windows of this length.
pub const USE_WINDOW_NS: u64 = 2_000_000_000;
/// A use figure older than this is not shown: nobody of the ledger measured since.
pub const USE_STALE_NS: u64 = 10_000_000_000;

/// A device's compute share as the ledger holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ComputeView {
    /// The share, parts per million of the device's time; 0: none.
    pub share_ppm: u64,
    /// GPU time measured for the ledger's processes since the device was registered (ns).
    pub used_ns: u64,
    /// Use over the last whole window, parts per million of the device's time; `None` when
    /// no window ended in the last [`USE_STALE_NS`].
    pub recent_ppm: Option<u64>,
    /// Time launches waited for the share, all threads together (ns).
    pub waited_ns: u64,
}

impl Ledger {
    fn compute_entry(&self, device: DeviceId) -> &ComputeEntry {
        &self.device(device).compute
    }

    /// Sets the ledger's share on a registered device and returns the share the ledger
    /// holds: a ledger never imposes a share nobody running asks for, and a process joining
    /// a running ledger finds the share it holds.
    ///
    /// The share becomes `wanted_ppm` (0: none) when no other live process uses the ledger,
    /// as [`Ledger::register_device`] does for the cap, and also when the ledger holds none
    /// yet and this process asks for one. The second case is what makes processes that
    /// start together share one bucket: each joins the ledger before its first kernel, so
    /// by the time the first of them registers its share the others are already live; were
    /// the share set only by a process alone in the ledger, none of them would set it and
    /// each would be held to the share by itself alone (four processes at 50 % ran at 80 %
    /// together). A process that registers without a share leaves a share others hold.
    pub fn register_compute(&self, device: DeviceId, wanted_ppm: u64, own: Option<SlotId>) -> Result<u64, LedgerError> {
        self.with_init_lock(|| {
            let entry = self.compute_entry(device);
            let wanted = wanted_ppm.min(PPM);
            let held = entry.share_ppm.load(Relaxed);
            if (held == 0 && wanted != 0) || !self.has_other_live_slot(own) {
                entry.share_ppm.store(wanted, Relaxed);
            }
            entry.share_ppm.load(Relaxed)
        })
    }

    pub fn compute_share(&self, device: DeviceId) -> u64 {
        self.compute_entry(device).share_ppm.load(Relaxed)
    }

    /// The bucket's clock (see `crate::compute`).
    pub fn compute_clock(&self, device: DeviceId) -> u64 {
        self.compute_entry(device).vclock.load(Acquire)
    }

    /// Charges `gpu_ns` of GPU time (negative: a refund) to the ledger's bucket at `share`
    /// and time `now`; returns the clock after, and the part of a refund the bucket could
    /// not take (`crate::compute::charge_keeping_rest`).
    pub fn compute_charge(&self, device: DeviceId, gpu_ns: i64, share: u64, now: u64) -> (u64, u64) {
        let cell = &self.compute_entry(device).vclock;
        let mut current = cell.load(Acquire);
        loop {
            let (next, rest) = charge_keeping_rest(current, now, gpu_ns, share);
            match cell.compare_exchange_weak(current, next, AcqRel, Acquire) {
                Ok(_) => return (next, rest),
                Err(actual) => current = actual,
            }
        }
    }

    /// Admits a chunk of `gpu_ns` of GPU time to the ledger's bucket at `share` and time
    /// `now` if the bucket holds `threshold` at that instant, in one compare-and-swap
    /// (`crate::compute::admit`): the clock after (`Ok`), or the clock as found, nothing
    /// charged (`Err`).
    pub fn compute_admit(&self, device: DeviceId, gpu_ns: u64, share: u64, threshold: u64, now: u64) -> Result<u64, u64> {
        let cell = &self.compute_entry(device).vclock;
        let mut current = cell.load(Acquire);
        loop {
            let Some(next) = admit(current, now, gpu_ns, share, threshold) else { return Err(current) };
            match cell.compare_exchange_weak(current, next, AcqRel, Acquire) {
                Ok(_) => return Ok(next),
                Err(actual) => current = actual,
            }
        }
    }

    /// Records GPU time measured for a process (negative: a correction downwards), and
    /// moves the display window on when it is due.
    pub fn compute_record(&self, id: SlotId, device: DeviceId, gpu_ns: i64, now: u64) {
        let add = |cell: &std::sync::atomic::AtomicU64| {
            let _ = cell.fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_add_signed(gpu_ns)));
        };
        add(&self.slot(id).compute[device.0]);
        let entry = self.compute_entry(device);
        add(&entry.used_ns);
        let used = entry.used_ns.load(Acquire);
        let start = entry.window_start.load(Acquire);
        if start == 0 || now < start {
            if entry.window_start.compare_exchange(start, now.max(1), AcqRel, Relaxed).is_ok() {
                entry.window_used.store(used, Relaxed);
            }
            return;
        }
        if now - start >= USE_WINDOW_NS && entry.window_start.compare_exchange(start, now, AcqRel, Relaxed).is_ok() {
            let before = entry.window_used.swap(used, AcqRel);
            let ppm = (used.saturating_sub(before) as u128 * PPM as u128 / (now - start) as u128).min(PPM as u128) as u64;
            entry.recent_ppm.store(ppm, Relaxed);
            entry.recent_at.store(now, Relaxed);
        }
    }

    /// Adds time a launch of the ledger waited for the share.
    pub fn compute_waited(&self, device: DeviceId, ns: u64) {
        self.compute_entry(device).waited_ns.fetch_add(ns, Relaxed);
    }

    /// The device's share and use as of `now` (CLOCK_MONOTONIC ns).
    pub fn compute_view(&self, device: DeviceId, now: u64) -> ComputeView {
        let entry = self.compute_entry(device);
        let at = entry.recent_at.load(Relaxed);
        ComputeView {
            share_ppm: entry.share_ppm.load(Relaxed),
            used_ns: entry.used_ns.load(Relaxed),
            recent_ppm: (at != 0 && now.saturating_sub(at) < USE_STALE_NS).then(|| entry.recent_ppm.load(Relaxed)),
            waited_ns: entry.waited_ns.load(Relaxed),
        }
    }

    /// GPU time measured for one process on a device (ns).
    pub fn compute_slot_used(&self, id: SlotId, device: DeviceId) -> u64 {
        self.slot(id).compute[device.0].load(Relaxed)
    }

    /// The host PID the ledger holds for a slot (0 in the ledger: unknown), as the process
    /// itself or anyone who resolved it later recorded it.
    pub fn slot_host_pid(&self, id: SlotId) -> Option<u32> {
        Some(self.slot(id).host_pid.load(Relaxed)).filter(|p| *p != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::BURST_WALL_NS;
    use crate::uuid::DeviceUuid;

    #[test]
    fn processes_of_a_ledger_share_one_bucket_and_the_first_sets_the_share() {
        let dir = std::env::temp_dir().join(format!("fgpu-ledger-compute-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        let a = Ledger::open_or_create(&path).unwrap();
        let sa = a.join().unwrap();
        let dev = a.register_device(DeviceUuid::gpu([3; 16]), 80 << 30, 8 << 30, Some(sa)).unwrap().device;
        assert_eq!(a.register_compute(dev, 300_000, Some(sa)).unwrap(), 300_000);
        // A second process (another open of the file) finds the share and cannot change it.
        let b = Ledger::open_or_create(&path).unwrap();
        let sb = b.join().unwrap();
        let dev_b = b.register_device(DeviceUuid::gpu([3; 16]), 80 << 30, 8 << 30, Some(sb)).unwrap().device;
        assert_eq!(b.register_compute(dev_b, 700_000, Some(sb)).unwrap(), 300_000);
        // Both charge the same clock.
        let now = 10 * BURST_WALL_NS;
        let (v, _) = a.compute_charge(dev, 3_000_000, 300_000, now);
        assert_eq!(v, now - BURST_WALL_NS + 10_000_000);
        assert_eq!(b.compute_charge(dev_b, 3_000_000, 300_000, now), (v + 10_000_000, 0));
        assert_eq!(a.compute_charge(dev, -3_000_000, 300_000, now), (v, 0));
        assert_eq!(b.compute_clock(dev_b), v);
        // Use: per process and for the ledger, over a window.
        a.compute_record(sa, dev, 0, now);
        a.compute_record(sa, dev, 400_000_000, now + USE_WINDOW_NS / 2);
        b.compute_record(sb, dev_b, 200_000_000, now + USE_WINDOW_NS);
        let view = a.compute_view(dev, now + USE_WINDOW_NS);
        assert_eq!(view.share_ppm, 300_000);
        assert_eq!(view.used_ns, 600_000_000);
        assert_eq!(view.recent_ppm, Some(300_000), "600 ms of 2 s");
        assert_eq!(a.compute_view(dev, now + USE_WINDOW_NS + USE_STALE_NS).recent_ppm, None);
        assert_eq!((a.compute_slot_used(sa, dev), b.compute_slot_used(sb, dev)), (400_000_000, 200_000_000));
        // Admission tests and charges in one step: a full bucket holds 200 ms of share
        // (60 ms of GPU time at 30 %); one process admits all of it, and the next, asking at
        // the same instant, finds nothing and is charged nothing.
        let other = DeviceUuid::gpu([5; 16]);
        let (d_a, d_b) =
            (a.register_device(other, 80 << 30, 8 << 30, Some(sa)).unwrap().device, b.register_device(other, 80 << 30, 8 << 30, Some(sb)).unwrap().device);
        let full = 60_000_000;
        assert_eq!(a.compute_admit(d_a, full, 300_000, full, now), Ok(now));
        assert_eq!(b.compute_admit(d_b, full, 300_000, full, now), Err(now), "nothing left, nothing charged");
        assert_eq!(b.compute_clock(d_b), now);
        b.compute_record(sb, dev_b, -300_000_000, now + USE_WINDOW_NS);
        assert_eq!(b.compute_slot_used(sb, dev), 0, "a correction never goes below zero");
        // When every other process has left, the next one sets the share again.
        b.leave(sb);
        assert_eq!(a.register_compute(dev, 0, Some(sa)).unwrap(), 0);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn processes_that_join_together_share_the_first_share_registered() {
        let dir = std::env::temp_dir().join(format!("fgpu-ledger-compute-together-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        // Four processes join before any of them registers its share (they start together;
        // the share is registered at a process's first kernel).
        let ledgers: Vec<Ledger> = (0..4).map(|_| Ledger::open_or_create(&path).unwrap()).collect();
        let slots: Vec<SlotId> = ledgers.iter().map(|l| l.join().unwrap()).collect();
        let devs: Vec<DeviceId> =
            ledgers.iter().zip(&slots).map(|(l, s)| l.register_device(DeviceUuid::gpu([4; 16]), 80 << 30, 8 << 30, Some(*s)).unwrap().device).collect();
        // One without a share registers first: the ledger holds none, and that sets none.
        assert_eq!(ledgers[3].register_compute(devs[3], 0, Some(slots[3])).unwrap(), 0);
        // The first with a share sets it although the others are live; the rest find it.
        assert_eq!(ledgers[0].register_compute(devs[0], 500_000, Some(slots[0])).unwrap(), 500_000);
        assert_eq!(ledgers[1].register_compute(devs[1], 500_000, Some(slots[1])).unwrap(), 500_000);
        assert_eq!(ledgers[2].register_compute(devs[2], 200_000, Some(slots[2])).unwrap(), 500_000, "a smaller share finds the ledger's");
        // A process without a share that joins later leaves the share to those that hold it.
        let late = Ledger::open_or_create(&path).unwrap();
        let sl = late.join().unwrap();
        let dl = late.register_device(DeviceUuid::gpu([4; 16]), 80 << 30, 8 << 30, Some(sl)).unwrap().device;
        assert_eq!(late.register_compute(dl, 0, Some(sl)).unwrap(), 500_000);
        drop((ledgers, late));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
