//! A process's slot: joining the ledger (a free slot, else one whose owner died and left
//! nothing the driver holds, else one an outsider's locks keep or a claim left half-done),
//! leaving it, and the slots a scan goes over. A slot is alive while its owner holds its
//! lock (`lock.rs`), or, where it had to be so, while its owner's process lives
//! (`LIVENESS_PROCESS`).

use super::layout::*;
use super::*;

impl Ledger {
    /// Slots that may be in use: scans stop at the highest ever claimed.
    pub(super) fn slot_ids(&self) -> impl Iterator<Item = SlotId> {
        (0..(self.header().slot_high.load(Acquire) as usize).min(MAX_SLOTS)).map(SlotId)
    }

    pub(super) fn live_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.slot_ids().filter(|id| self.slot(*id).state.load(Acquire) == SLOT_LIVE)
    }

    pub(super) fn has_other_live_slot(&self, own: Option<SlotId>) -> bool {
        self.live_slots().any(|id| Some(id) != own && self.is_alive(id))
    }

    /// Claims a slot for the calling process and holds its liveness lock until the ledger is
    /// dropped or the process dies. When every free slot's lock is held by a process that
    /// is not a member (a user who can open a shared ledger's file may lock all of it), the
    /// slot's liveness is this process's instead (`LIVENESS_PROCESS`): locks alone never
    /// keep a process out of a ledger that has free slots.
    pub fn join(&self) -> Result<SlotId, LedgerError> {
        // Free slots first; then slots marked live, whose owner may have died.
        for wanted in [SLOT_FREE, SLOT_LIVE] {
            for index in 0..MAX_SLOTS {
                let id = SlotId(index);
                if self.slot(id).state.load(Relaxed) != wanted {
                    continue;
                }
                if wanted == SLOT_LIVE && self.by_process(id) {
                    if self.take_dead_by_process(id) {
                        self.fill_slot(id, LIVENESS_PROCESS);
                        return Ok(id);
                    }
                    continue;
                }
                let locked = lock::ofd_lock(self.fd(), alive_lock(index), false).map_err(|e| LedgerError::Io {
                    path: self.path().to_path_buf(),
                    op: "lock a slot",
                    source: e,
                })?;
                if !locked {
                    continue;
                }
                crate::crash_point!("ledger.join.locked");
                if self.slot(id).state.load(Acquire) == SLOT_LIVE {
                    if self.driver_may_hold(id) {
                        self.slot(id).dying_since_ns.compare_exchange(0, crate::log::monotonic_ns().max(1), Relaxed, Relaxed).ok();
                        lock::ofd_unlock(self.fd(), alive_lock(index));
                        continue;
                    }
                    self.reclaim_locked(id);
                }
                if !self.start_claim(id, SLOT_FREE) {
                    // Taken meanwhile by a process whose liveness is its own.
                    lock::ofd_unlock(self.fd(), alive_lock(index));
                    continue;
                }
                self.fill_slot(id, LIVENESS_LOCK);
                crate::crash_point!("ledger.join.filled");
                return Ok(id);
            }
        }
        // Free slots whose locks are held by a process that is not a member: claimed with a
        // compare-and-swap, alive while this process is.
        for id in self.locked_by_outsiders() {
            if self.start_claim(id, SLOT_FREE) {
                self.fill_slot(id, LIVENESS_PROCESS);
                return Ok(id);
            }
        }
        // Slots stuck half-claimed by a process that died in the middle.
        for id in (0..MAX_SLOTS).map(SlotId) {
            if self.take_stuck_claim(id) {
                self.fill_slot(id, LIVENESS_PROCESS);
                return Ok(id);
            }
        }
        let free = self.slot_ids().filter(|id| self.slot(*id).state.load(Relaxed) == SLOT_FREE).count() + (MAX_SLOTS - self.slot_ids().count());
        if free > 0 {
            return Err(LedgerError::SlotsLocked { path: self.path().to_path_buf(), free });
        }
        Err(LedgerError::Full { path: self.path().to_path_buf() })
    }

    /// Whether a slot's liveness is its owner's process rather than a lock.
    pub(super) fn by_process(&self, id: SlotId) -> bool {
        self.slot(id).liveness.load(Acquire) == LIVENESS_PROCESS
    }

    /// Changes a slot's state from `from` to [`SLOT_CLAIMING`]: only one process can.
    pub(super) fn start_claim(&self, id: SlotId, from: u32) -> bool {
        let slot = self.slot(id);
        if slot.state.compare_exchange(from, SLOT_CLAIMING, AcqRel, Acquire).is_err() {
            return false;
        }
        slot.claiming_since_s.store((crate::log::monotonic_ns() / 1_000_000_000) as u32, Relaxed);
        true
    }

    /// How long a slot may stay [`SLOT_CLAIMING`] before it counts as left so by a process
    /// that died in the middle (a claim takes microseconds).
    const STUCK_CLAIM_S: u32 = 10;

    /// Takes over a slot left half-claimed (or half-cleared) by a process that died; what
    /// it held is dropped (its owner was found dead, and not held by the driver, first).
    pub(super) fn take_stuck_claim(&self, id: SlotId) -> bool {
        let slot = self.slot(id);
        if slot.state.load(Acquire) != SLOT_CLAIMING {
            return false;
        }
        let since = slot.claiming_since_s.load(Relaxed);
        let now = (crate::log::monotonic_ns() / 1_000_000_000) as u32;
        if now.saturating_sub(since) < Self::STUCK_CLAIM_S {
            return false;
        }
        if slot.claiming_since_s.compare_exchange(since, now, AcqRel, Relaxed).is_err() {
            return false;
        }
        self.clear(id);
        true
    }

    /// The free slots whose locks are held by a process that is not a member: a member
    /// locks one byte and marks the slot within microseconds; a lock wider than the byte,
    /// or one still there 20 ms later on a slot still free, is not a member's. One wait of
    /// 20 ms covers every slot (an outsider may lock each byte by itself).
    pub(super) fn locked_by_outsiders(&self) -> Vec<SlotId> {
        let conflict = |id: SlotId| lock::ofd_conflict(self.fd(), alive_lock(id.0)).unwrap_or_default();
        let free = |id: &SlotId| self.slot(*id).state.load(Acquire) == SLOT_FREE;
        let mut wide = Vec::new();
        let mut narrow = Vec::new();
        for id in (0..MAX_SLOTS).map(SlotId).filter(free) {
            match conflict(id) {
                Some((_, len)) if len != 1 => wide.push(id),
                Some(_) => narrow.push(id),
                None => {}
            }
        }
        if !narrow.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(20));
            wide.extend(narrow.into_iter().filter(free).filter(|id| conflict(*id).is_some()));
        }
        wide
    }

    /// Takes a slot whose liveness is its process's, if that process died and the driver
    /// holds nothing of it: its bytes are dropped and the slot is this process's to fill.
    pub(super) fn take_dead_by_process(&self, id: SlotId) -> bool {
        if !self.by_process(id) || self.is_alive(id) {
            return false;
        }
        if self.driver_may_hold(id) {
            self.slot(id).dying_since_ns.compare_exchange(0, crate::log::monotonic_ns().max(1), Relaxed, Relaxed).ok();
            return false;
        }
        // A process that dies between the claim and the clearing leaves a claimed slot
        // with the dead owner's bytes, which nobody counts any more (they are not held by
        // the driver): the slot is taken over after `STUCK_CLAIM_S`.
        if !self.start_claim(id, SLOT_LIVE) {
            return false;
        }
        self.clear(id);
        true
    }

    /// Fills a slot this process claimed ([`SLOT_CLAIMING`]) and marks it live.
    pub(super) fn fill_slot(&self, id: SlotId, liveness: u64) {
        let slot = self.slot(id);
        slot.liveness.store(liveness, Relaxed);
        let comm = pidns::comm();
        slot.pid.store(std::process::id(), Relaxed);
        slot.host_pid.store(pidns::host_pid().unwrap_or(0), Relaxed);
        slot.pidns.store(pidns::own_pidns(), Relaxed);
        slot.started_unix_ms.store(store::unix_now_ms() as u64, Relaxed);
        slot.dying_since_ns.store(0, Relaxed);
        slot.comm[0].store(u64::from_le_bytes(comm[..8].try_into().unwrap()), Relaxed);
        slot.comm[1].store(u64::from_le_bytes(comm[8..].try_into().unwrap()), Relaxed);
        for d in 0..MAX_DEVICES {
            slot.holding[d].store(0, Relaxed);
            slot.context[d].store(0, Relaxed);
            slot.compute[d].store(0, Relaxed);
        }
        self.header().slot_high.fetch_max(id.0 as u32 + 1, AcqRel);
        slot.state.store(SLOT_LIVE, Release);
        // Best effort: lets other PID namespaces see which PID owns the slot.
        let _ = lock::posix_lock(self.fd(), pid_lock(id.0));
    }

    /// Gives the slot back (normal exit); what it still holds is returned to the devices.
    pub fn leave(&self, id: SlotId) {
        if self.by_process(id) {
            if self.start_claim(id, SLOT_LIVE) {
                self.clear(id);
                self.slot(id).state.store(SLOT_FREE, Release);
            }
            return;
        }
        self.reclaim_locked(id);
        lock::ofd_unlock(self.fd(), alive_lock(id.0));
    }

    /// Drops a slot's holdings and frees it. The caller holds its liveness lock. Each word is
    /// cleared by itself, so a reclaimer that dies midway leaves a slot the next one finishes.
    pub(super) fn reclaim_locked(&self, id: SlotId) -> u64 {
        let total = self.clear(id);
        self.slot(id).state.store(SLOT_FREE, Release);
        total
    }

    /// Drops a slot's holdings, its marks and its liveness (the caller owns the slot).
    pub(super) fn clear(&self, id: SlotId) -> u64 {
        let slot = self.slot(id);
        let mut total = 0;
        for d in 0..MAX_DEVICES {
            let old = Holding::unpack(slot.holding[d].swap(0, AcqRel));
            slot.context[d].store(0, Relaxed);
            slot.compute[d].store(0, Relaxed);
            total += old.held();
        }
        slot.dying_since_ns.store(0, Relaxed);
        slot.liveness.store(LIVENESS_LOCK, Relaxed);
        total
    }

    /// Records the host PID of a slot's owner, once it is learnt.
    pub fn set_host_pid(&self, id: SlotId, pid: u32) {
        self.slot(id).host_pid.store(pid, Relaxed);
    }
}
