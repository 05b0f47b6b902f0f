//! The count: each process's word per device ([`Holding`]: reserved bytes and unspent
//! credit), the ledger's reserve step against the cap ([`Ledger::reserve`], with its refill
//! under the device's lock), giving back, corrections upwards, and the figures read from
//! the words.

use super::layout::*;
use super::*;

impl Ledger {
    pub(super) fn holding_cell(&self, id: SlotId, device: DeviceId) -> &portable_atomic::AtomicU128 {
        &self.slot(id).holding[device.0]
    }

    /// This process's word on a device, as one atomic read.
    pub fn holding(&self, id: SlotId, device: DeviceId) -> Holding {
        Holding::unpack(self.holding_cell(id, device).load(Acquire))
    }

    /// Changes a slot's word with one compare-and-swap; `f` answers the new
    /// (reserved, credit), or `None` to leave it. Returns the word before and after.
    pub(super) fn update(&self, id: SlotId, device: DeviceId, mut f: impl FnMut(Holding) -> Option<(u64, u64)>) -> Option<(Holding, Holding)> {
        let cell = self.holding_cell(id, device);
        let guess = &self.guesses[device.0];
        let mut current = guess[0].load(Relaxed) as u128 | (guess[1].load(Relaxed) as u128) << 64;
        let mut verified = false;
        loop {
            let old = Holding::unpack(current);
            let Some((reserved, credit)) = f(old) else {
                // Refused on a guess: look at the real word once before saying no.
                if verified {
                    return None;
                }
                current = cell.load(Acquire);
                verified = true;
                continue;
            };
            let new = old.then(reserved, credit).pack();
            match cell.compare_exchange(current, new, AcqRel, Acquire) {
                Ok(_) => {
                    guess[0].store(new as u64, Relaxed);
                    guess[1].store((new >> 64) as u64, Relaxed);
                    return Some((old, Holding::unpack(new)));
                }
                Err(actual) => {
                    current = actual;
                    verified = true;
                }
            }
        }
    }

    /// The ledger's reserve step: reserves `bytes` on a device for an allocation (the
    /// shim's `Account::take_or_refuse` calls it), keeping the device's total within
    /// `limit` (the smaller of the ledger's cap and the process's own). Served from this
    /// process's credit when it has enough (one compare-and-swap on its own slot); else the
    /// request and a fresh chunk of credit are reserved under the device's refill lock.
    pub fn reserve(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), Refusal> {
        let spent = self.update(id, device, |h| (h.credit as u64 >= bytes).then(|| (h.reserved, h.credit as u64 - bytes)));
        if spent.is_some() {
            crate::crash_point!("ledger.spend.after");
            return Ok(());
        }
        let refused = match self.refill(id, device, bytes, limit) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        // Refused while processes that died may still have their memory in the driver:
        // wait a little for it to be freed (a replacement process often asks for what its
        // predecessor had), then refuse. Never granted into memory the driver holds.
        if refused.lock_timeout || self.dying(device) == 0 {
            return Err(refused);
        }
        let deadline = std::time::Instant::now() + DYING_WAIT;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(20));
            match self.refill(id, device, bytes, limit) {
                Ok(()) => return Ok(()),
                Err(again) if again.lock_timeout || self.dying(device) == 0 || std::time::Instant::now() >= deadline => return Err(again),
                Err(_) => {}
            }
        }
    }

    pub(super) fn refill(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), Refusal> {
        let _threads = self.refill[device.0].lock().unwrap_or_else(|e| e.into_inner());
        if lock::ofd_lock_timed(self.fd(), refill_lock(device.0)).is_err() {
            return Err(Refusal { requested: bytes, cap: limit, used: self.used(device), lock_timeout: true });
        }
        crate::crash_point!("ledger.refill.locked");
        let mut result = Err(());
        for attempt in 0..3 {
            match attempt {
                // Others' unspent credit counts against the cap: take it back first.
                1 => self.take_back_credit(device, Some(id)),
                // Then drop processes that died.
                2 => {
                    self.reclaim_dead(Some(id));
                }
                _ => {}
            }
            result = self.refill_locked(id, device, bytes, limit);
            if result.is_ok() {
                break;
            }
        }
        lock::ofd_unlock(self.fd(), refill_lock(device.0));
        result.map_err(|()| Refusal { requested: bytes, cap: limit, used: self.used(device), lock_timeout: false })
    }

    /// With the refill lock held: no other process raises its reservation meanwhile (all
    /// else only lowers it), so the others' sum read here stays an upper bound until the swap.
    pub(super) fn refill_locked(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), ()> {
        let chunk = CREDIT_CHUNK.min(limit / 64);
        let others = self.live_slots().filter(|s| *s != id).map(|s| self.holding(s, device).reserved).fold(0u64, u64::saturating_add);
        let done = self.update(id, device, |h| {
            let credit = h.credit as u64;
            let need = bytes.saturating_sub(credit);
            let room = limit.checked_sub(others)?.checked_sub(h.reserved)?;
            let refill = chunk.min(room.checked_sub(need)?);
            Some((h.reserved + need + refill, credit + need + refill - bytes))
        });
        crate::crash_point!("ledger.refill.after");
        let (_, new) = done.ok_or(())?;
        self.device(device).peak.fetch_max(others.saturating_add(new.reserved), Relaxed);
        Ok(())
    }

    /// Sum of the reserved bytes (holdings and credit) of every slot marked live, dead
    /// ones not reclaimed yet included: an upper bound on what the device has handed out.
    pub(super) fn reserved_total(&self, device: DeviceId) -> u64 {
        self.live_slots().map(|id| self.holding(id, device).reserved).fold(0u64, u64::saturating_add)
    }

    /// Returns `bytes` of an allocation to this process's credit; credit beyond
    /// 2 x [`CREDIT_CHUNK`] goes back to the device in the same step.
    pub fn release(&self, id: SlotId, device: DeviceId, bytes: u64) {
        self.update(id, device, |h| {
            let bytes = bytes.min(h.held());
            let credit = h.credit as u64 + bytes;
            if credit > 2 * CREDIT_CHUNK {
                Some((h.reserved - (credit - CREDIT_CHUNK), CREDIT_CHUNK))
            } else {
                Some((h.reserved, credit))
            }
        });
        crate::crash_point!("ledger.release.after");
    }

    /// Gives unspent credit on a device back: every live slot's but `own`'s.
    pub(super) fn take_back_credit(&self, device: DeviceId, own: Option<SlotId>) {
        for id in self.live_slots() {
            if Some(id) != own {
                self.update(id, device, |h| (h.credit > 0).then(|| (h.reserved - h.credit as u64, 0)));
                crate::crash_point!("ledger.take_back.after_one");
            }
        }
    }

    /// Adds memory the driver already handed out (a correction upwards); no cap check. Past
    /// the cap, every process's credit (this one's too) goes back, so the next allocation
    /// is refused.
    pub fn force_add(&self, id: SlotId, device: DeviceId, bytes: u64) {
        self.update(id, device, |h| Some((h.reserved.saturating_add(bytes), h.credit as u64)));
        crate::crash_point!("ledger.force_add.after");
        let entry = self.device(device);
        let total = self.reserved_total(device);
        entry.peak.fetch_max(total, Relaxed);
        if total > entry.cap.load(Acquire) {
            self.take_back_credit(device, None);
        }
    }

    /// Records how much of a slot's holding on a device is context memory (for display).
    pub fn add_context(&self, id: SlotId, device: DeviceId, delta: i64) {
        let cell = &self.slot(id).context[device.0];
        let _ = cell.fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_add_signed(delta)));
    }

    pub fn count_refusal(&self, device: DeviceId) {
        self.device(device).refusals.fetch_add(1, Relaxed);
    }

    /// What all processes of the ledger hold on a device (unspent credit left out). Each
    /// slot is read in one atomic load, so the figure never reads low.
    pub fn used(&self, device: DeviceId) -> u64 {
        self.live_slots().map(|id| self.holding(id, device).held()).fold(0u64, u64::saturating_add)
    }

    pub fn cap(&self, device: DeviceId) -> u64 {
        self.device(device).cap.load(Relaxed)
    }

    /// What one slot holds on a device (without its unspent credit).
    pub fn slot_used(&self, id: SlotId, device: DeviceId) -> u64 {
        self.holding(id, device).held()
    }
}
