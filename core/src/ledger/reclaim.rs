//! Processes that died: whether a slot's owner lives, whether the driver may still hold
//! what a dead one had (`dying.rs`), and the scan that drops the slots of the dead.

use super::layout::*;
use super::*;

impl Ledger {
    /// What is known of a slot's process (for a dead one).
    pub(super) fn dead_process(&self, id: SlotId) -> DeadProcess {
        let slot = self.slot(id);
        DeadProcess {
            pid: slot.pid.load(Relaxed),
            host_pid: slot.host_pid.load(Relaxed),
            pidns: slot.pidns.load(Relaxed),
            joined_unix_ms: slot.started_unix_ms.load(Relaxed),
        }
    }

    /// Whether the driver may still hold the memory of a slot whose owner died: it holds
    /// bytes, and its process is still closing its descriptors or the driver lists it.
    pub(super) fn driver_may_hold(&self, id: SlotId) -> bool {
        if (0..MAX_DEVICES).all(|d| self.holding(id, DeviceId(d)).held() == 0) {
            return false;
        }
        let dead = self.dead_process(id);
        dying::still_exiting(&dead) || self.still_held.get().is_some_and(|held| held(&dead))
    }

    /// Bytes on a device of processes that died while the driver may still hold them.
    pub fn dying(&self, device: DeviceId) -> u64 {
        self.live_slots().filter(|id| self.slot(*id).dying_since_ns.load(Relaxed) != 0).map(|id| self.holding(id, device).reserved).fold(0, u64::saturating_add)
    }

    pub(super) fn is_alive(&self, id: SlotId) -> bool {
        if self.by_process(id) {
            return dying::process_alive(&self.dead_process(id));
        }
        // An error here (should not happen) counts as alive: never drop accounting on doubt.
        lock::ofd_held_by_other(self.fd(), alive_lock(id.0)).unwrap_or(true)
    }

    /// Takes a slot's liveness lock without waiting, as a proof that its owner is gone and
    /// to keep others off the slot: a member takes it for writing; an observer, whose file
    /// is open only for reading, takes a read lock, which excludes a member's write lock.
    pub(super) fn claim_dead(&self, id: SlotId) -> bool {
        let taken = if self.store.is_member() { lock::ofd_lock(self.fd(), alive_lock(id.0), false) } else { lock::ofd_read_lock(self.fd(), alive_lock(id.0)) };
        matches!(taken, Ok(true))
    }

    /// Drops the slots whose owner died. Returns how many it freed. An observer of a ledger
    /// it could not verify changes nothing (its mapping is read-only).
    pub fn reclaim_dead(&self, own: Option<SlotId>) -> usize {
        if !self.store.writable() {
            return 0;
        }
        let mut reclaimed = 0;
        for id in self.live_slots() {
            if Some(id) == own {
                continue;
            }
            if self.by_process(id) {
                if self.take_dead_by_process(id) {
                    self.slot(id).state.store(SLOT_FREE, Release);
                    reclaimed += 1;
                }
                continue;
            }
            if self.claim_dead(id) {
                if self.slot(id).state.load(Acquire) == SLOT_LIVE {
                    if self.driver_may_hold(id) {
                        // Dying: kept, its bytes counted, until the driver lets them go.
                        self.slot(id).dying_since_ns.compare_exchange(0, crate::log::monotonic_ns().max(1), Relaxed, Relaxed).ok();
                    } else {
                        crate::crash_point!("ledger.reclaim.locked");
                        self.reclaim_locked(id);
                        reclaimed += 1;
                    }
                }
                lock::ofd_unlock(self.fd(), alive_lock(id.0));
            }
        }
        self.header().last_scan_ns.store(crate::log::monotonic_ns(), Relaxed);
        self.header().scans.fetch_add(1, Relaxed);
        reclaimed
    }

    /// How many scans for dead processes any process of the ledger has made.
    pub fn scans(&self) -> u64 {
        self.header().scans.load(Relaxed)
    }

    /// [`Ledger::reclaim_dead`], at most once per [`SCAN_INTERVAL_NS`] across all processes.
    pub fn reclaim_if_due(&self, own: Option<SlotId>) -> usize {
        let now = crate::log::monotonic_ns();
        let last = self.header().last_scan_ns.load(Relaxed);
        if now.saturating_sub(last) < SCAN_INTERVAL_NS {
            return 0;
        }
        if self.header().last_scan_ns.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
            return 0;
        }
        self.reclaim_dead(own)
    }
}
