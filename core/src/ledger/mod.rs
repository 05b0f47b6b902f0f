//! The ledger: one record per container (or per `fgpu run`, or per user) of each GPU's cap
//! and of what every process holds on it, shared by all of them.
//!
//! * **Storage** (`store.rs`): a System V shared-memory segment of fixed size holds the data;
//!   the ledger's path names a lock file that holds the locks and a hint to the segment. No
//!   process can shrink the segment, so none can make another fault on it, and deleting or
//!   replacing the file cannot start a second ledger beside the first.
//! * **One word per process and device** ([`Holding`]): reserved bytes, unspent credit and a
//!   change count, changed by one compare-and-swap. A device's total is the sum over the
//!   live slots; there is no second counter. So a process killed at any instruction leaves
//!   a ledger that is exact once its slot is dropped, with no repair, whoever else lives on.
//! * **Credit**: a process reserves up to [`CREDIT_CHUNK`] ahead and spends it with one
//!   compare-and-swap on its own slot, taking no lock and making no system call. Raising a
//!   device's total (a refill) is the only step that checks the cap: it sums the slots under
//!   a lock the kernel drops if its holder dies (`refill_lock`), so two processes never pass
//!   the cap together. Before any refusal the other processes' credit is taken back and dead
//!   processes are dropped. "Used" figures leave credit out.
//! * **Liveness** comes from a lock per slot that the kernel drops when the owner dies
//!   (see `lock.rs`): no PIDs are compared, so PID reuse and PID namespaces do not matter.
//! * **Layout** is fixed and versioned (`layout.rs`); a segment of another version is never
//!   attached.
//! * **Compute share** (`compute.rs`): per device the ledger's share of the GPU's time and
//!   the bucket that holds its processes to it together.

pub mod compute;
pub mod default_path;
pub mod dying;
mod error;
pub mod layout;
mod lock;
pub mod maps;
pub mod shm_usage;
pub mod store;

use crate::pidns;
use crate::uuid::format_gpu_uuid;
pub use dying::DeadProcess;
pub use error::LedgerError;
use layout::*;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Mutex;
use store::Store;
pub use store::{Sharing, Trust};

/// How long a request that does not fit waits, at most, for the memory of dying processes
/// (dead, but the driver may still hold what they had: `dying.rs`) before it is refused.
pub const DYING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The driver's word on a dead process (the shim asks NVML): whether it still holds its
/// memory.
pub type StillHeld = dyn Fn(&DeadProcess) -> bool + Send + Sync;

/// Credit a process reserves at once for its next allocations (see [`Ledger::reserve`]).
pub const CREDIT_CHUNK: u64 = 16 << 20;

/// How often, at most, [`Ledger::reclaim_if_due`] scans for dead processes. Refusals,
/// `cuMemGetInfo`, NVML memory and process queries and `fgpu status` always scan.
pub const SCAN_INTERVAL_NS: u64 = 100_000_000;

/// Index of a process slot in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(pub usize);

/// Index of a device entry in the ledger (not a CUDA or NVML index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(pub usize);

/// An allocation that would pass the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub requested: u64,
    pub cap: u64,
    /// What the ledger's processes hold (credit left out).
    pub used: u64,
    /// The cap was not the reason: the ledger's refill lock stayed held past its deadline.
    pub lock_timeout: bool,
}

/// What [`Ledger::register_device`] found or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub device: DeviceId,
    /// The cap the ledger holds for this device.
    pub ledger_cap: u64,
}

/// An attached ledger.
pub struct Ledger {
    store: Store,
    /// OFD locks belong to the open file, which all threads share: these make the refill
    /// lock exclusive between threads too.
    refill: [Mutex<()>; MAX_DEVICES],
    /// The last word this process wrote per device, in its own memory: a compare-and-swap
    /// that starts from it needs no load of the shared line first (which would fetch the
    /// line shared, then again to own it). Only a guess: a stale or torn one just fails the
    /// swap, which answers the true value.
    guesses: [[AtomicU64; 2]; MAX_DEVICES],
    /// The driver's word on dead processes, when the opener can ask it.
    still_held: std::sync::OnceLock<Box<StillHeld>>,
}

impl Ledger {
    fn with_store(store: Store) -> Ledger {
        Ledger { store, refill: Default::default(), guesses: Default::default(), still_held: std::sync::OnceLock::new() }
    }

    /// Opens the ledger at `path` as one of its processes, creating its lock file and
    /// segment if needed.
    pub fn open(path: &Path, sharing: Sharing) -> Result<Ledger, LedgerError> {
        Store::open(path, sharing).map(Self::with_store)
    }

    /// A ledger shared on purpose, by every user who can open it.
    pub fn open_or_create(path: &Path) -> Result<Ledger, LedgerError> {
        Self::open(path, Sharing::Shared)
    }

    /// Opens a ledger some process uses to look at it (`fgpu status`, `doctor`, `run`):
    /// creates, chmods, writes and waits for nothing; see [`Trust`] for what it may do.
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        Store::observe_path(path).map(Self::with_store)
    }

    /// Looks at a ledger whose lock file the caller opened read-only (resolved where its
    /// processes reach it: `crate::resolve`), in segment `shmid` if known, from the IPC
    /// namespace `ipc_ns` (a `/proc/PID/ns/ipc` file) when its processes are in another.
    pub fn observe_file(file: std::fs::File, path: &Path, shmid: Option<i32>, ipc_ns: Option<&std::fs::File>) -> Result<Ledger, LedgerError> {
        match ipc_ns {
            None => Store::observe_file(file, path, shmid).map(Self::with_store),
            Some(ns) => store::in_ipc_namespace(ns, || Store::observe_file(file, path, shmid).map(Self::with_store)).map_err(|source| LedgerError::Io {
                path: path.to_path_buf(),
                op: "enter the IPC namespace of its processes",
                source,
            })?,
        }
    }

    /// Lets the ledger ask the driver whether it still holds a dead process's memory (the
    /// shim asks NVML); without it only the process's own state is looked at (`dying.rs`).
    pub fn set_still_held(&self, check: Box<StillHeld>) {
        let _ = self.still_held.set(check);
    }

    /// What is known of a slot's process (for a dead one).
    fn dead_process(&self, id: SlotId) -> DeadProcess {
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
    fn driver_may_hold(&self, id: SlotId) -> bool {
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

    /// What this opener may do: a member's, or an observer's verdict on the ledger.
    pub fn trust(&self) -> &Trust {
        &self.store.trust
    }

    pub fn path(&self) -> &Path {
        &self.store.path
    }

    /// Where the lock file was reached from, when the path no longer names it.
    pub fn adopted_from(&self) -> Option<&Path> {
        self.store.adopted_from.as_deref()
    }

    /// The shared-memory id of the segment.
    pub fn shmid(&self) -> i32 {
        self.store.shmid
    }

    /// The descriptor holding this process's locks (a forked child closes its copy).
    pub fn raw_fd(&self) -> i32 {
        self.store.file.as_raw_fd()
    }

    /// The attached segment (address, length). A forked child detaches its copy.
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.store.base.as_ptr(), SEGMENT_SIZE)
    }

    /// Whether the ledger's path still names the lock file its processes lock; `Some(why)`
    /// when it does not (deleted or replaced). The path is looked up in the caller's own
    /// file system: ask only of a ledger the caller named, never of one whose path another
    /// user's processes wrote (the answer would tell them what exists here).
    pub fn file_problem(&self) -> Option<String> {
        let mine = store::identity(&self.store.file).ok()?;
        match std::fs::symlink_metadata(self.path()) {
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                ((meta.dev(), meta.ino()) != mine)
                    .then(|| format!("{} was replaced by another file; this ledger's processes still lock the old one", self.path().display()))
            }
            Err(_) => Some(format!("{} was deleted; this ledger's processes still lock the deleted file", self.path().display())),
        }
    }

    fn header(&self) -> &Header {
        self.store.header()
    }

    fn device(&self, id: DeviceId) -> &DeviceEntry {
        assert!(id.0 < MAX_DEVICES);
        // SAFETY: in bounds by the assertion and the layout's compile-time checks;
        // DeviceEntry is all atomics and 8-byte aligned at this offset of the segment.
        unsafe { &*self.store.base.as_ptr().add(DEVICES_OFFSET).cast::<DeviceEntry>().add(id.0) }
    }

    fn slot(&self, id: SlotId) -> &Slot {
        assert!(id.0 < MAX_SLOTS);
        // SAFETY: in bounds by the assertion and SEGMENT_SIZE; Slot is all atomics and
        // 16-byte aligned at this offset (SLOTS_OFFSET and the slot size are multiples of 16).
        unsafe { &*self.store.base.as_ptr().add(SLOTS_OFFSET).cast::<Slot>().add(id.0) }
    }

    /// Slots that may be in use: scans stop at the highest ever claimed.
    fn slot_ids(&self) -> impl Iterator<Item = SlotId> {
        (0..(self.header().slot_high.load(Acquire) as usize).min(MAX_SLOTS)).map(SlotId)
    }

    fn live_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.slot_ids().filter(|id| self.slot(*id).state.load(Acquire) == SLOT_LIVE)
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.store.file.as_fd()
    }

    fn with_init_lock<T>(&self, f: impl FnOnce() -> T) -> Result<T, LedgerError> {
        lock::ofd_lock_timed(self.fd(), INIT_LOCK).map_err(|e| LedgerError::Io { path: self.path().to_path_buf(), op: "lock", source: e })?;
        let out = f();
        lock::ofd_unlock(self.fd(), INIT_LOCK);
        Ok(out)
    }

    /// Finds the entry for a device UUID, creating it with `wanted_cap` if it is new. If no
    /// other live process is in the ledger, the cap is (re)set to `wanted_cap`: a ledger
    /// never imposes a cap nobody currently asks for.
    pub fn register_device(&self, uuid: [u8; 16], total_memory: u64, wanted_cap: u64, own: Option<SlotId>) -> Result<Registration, LedgerError> {
        let words = uuid_words(uuid);
        self.with_init_lock(|| {
            let mut empty = None;
            for index in 0..MAX_DEVICES {
                let entry = self.device(DeviceId(index));
                if entry.state.load(Acquire) != DEVICE_READY {
                    empty.get_or_insert(index);
                    continue;
                }
                if entry.uuid[0].load(Relaxed) == words[0] && entry.uuid[1].load(Relaxed) == words[1] {
                    if !self.has_other_live_slot(own) {
                        entry.cap.store(wanted_cap, Relaxed);
                    }
                    entry.total_memory.store(total_memory, Relaxed);
                    return Ok(Registration { device: DeviceId(index), ledger_cap: entry.cap.load(Relaxed) });
                }
            }
            let index = empty.ok_or_else(|| LedgerError::TooManyDevices { path: self.path().to_path_buf() })?;
            let entry = self.device(DeviceId(index));
            entry.uuid[0].store(words[0], Relaxed);
            entry.uuid[1].store(words[1], Relaxed);
            entry.cap.store(wanted_cap, Relaxed);
            entry.total_memory.store(total_memory, Relaxed);
            entry.registered_unix.store(store::unix_now_ms() as u64 / 1000, Relaxed);
            entry.state.store(DEVICE_READY, Release);
            Ok(Registration { device: DeviceId(index), ledger_cap: wanted_cap })
        })?
    }

    fn has_other_live_slot(&self, own: Option<SlotId>) -> bool {
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
    fn by_process(&self, id: SlotId) -> bool {
        self.slot(id).liveness.load(Acquire) == LIVENESS_PROCESS
    }

    /// Changes a slot's state from `from` to [`SLOT_CLAIMING`]: only one process can.
    fn start_claim(&self, id: SlotId, from: u32) -> bool {
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
    fn take_stuck_claim(&self, id: SlotId) -> bool {
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
    fn locked_by_outsiders(&self) -> Vec<SlotId> {
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
    fn take_dead_by_process(&self, id: SlotId) -> bool {
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
    fn fill_slot(&self, id: SlotId, liveness: u64) {
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
    fn reclaim_locked(&self, id: SlotId) -> u64 {
        let total = self.clear(id);
        self.slot(id).state.store(SLOT_FREE, Release);
        total
    }

    /// Drops a slot's holdings, its marks and its liveness (the caller owns the slot).
    fn clear(&self, id: SlotId) -> u64 {
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

    fn holding_cell(&self, id: SlotId, device: DeviceId) -> &portable_atomic::AtomicU128 {
        &self.slot(id).holding[device.0]
    }

    /// This process's word on a device, as one atomic read.
    pub fn holding(&self, id: SlotId, device: DeviceId) -> Holding {
        Holding::unpack(self.holding_cell(id, device).load(Acquire))
    }

    /// Changes a slot's word with one compare-and-swap; `f` answers the new
    /// (reserved, credit), or `None` to leave it. Returns the word before and after.
    fn update(&self, id: SlotId, device: DeviceId, mut f: impl FnMut(Holding) -> Option<(u64, u64)>) -> Option<(Holding, Holding)> {
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

    /// Reserves `bytes` on a device for an allocation, keeping the device's total within
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

    fn refill(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), Refusal> {
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
    fn refill_locked(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), ()> {
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
    fn reserved_total(&self, device: DeviceId) -> u64 {
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
    fn take_back_credit(&self, device: DeviceId, own: Option<SlotId>) {
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

    /// Records the host PID of a slot's owner, once it is learnt.
    pub fn set_host_pid(&self, id: SlotId, pid: u32) {
        self.slot(id).host_pid.store(pid, Relaxed);
    }

    /// Records how much of a slot's holding on a device is context memory (for display).
    pub fn add_context(&self, id: SlotId, device: DeviceId, delta: i64) {
        let cell = &self.slot(id).context[device.0];
        let _ = cell.fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_add_signed(delta)));
    }

    pub fn count_refusal(&self, device: DeviceId) {
        self.device(device).refusals.fetch_add(1, Relaxed);
    }

    /// Looks a device up by UUID without registering it.
    pub fn find_device(&self, uuid: [u8; 16]) -> Option<DeviceId> {
        let words = uuid_words(uuid);
        (0..MAX_DEVICES).map(DeviceId).find(|id| {
            let e = self.device(*id);
            e.state.load(Acquire) == DEVICE_READY && e.uuid[0].load(Relaxed) == words[0] && e.uuid[1].load(Relaxed) == words[1]
        })
    }

    /// The last measured size of a CUDA context on a device, shared by all processes.
    pub fn context_hint(&self, device: DeviceId) -> u64 {
        self.device(device).context_hint.load(Relaxed)
    }

    pub fn set_context_hint(&self, device: DeviceId, bytes: u64) {
        self.device(device).context_hint.store(bytes, Relaxed);
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

    fn is_alive(&self, id: SlotId) -> bool {
        if self.by_process(id) {
            return dying::process_alive(&self.dead_process(id));
        }
        // An error here (should not happen) counts as alive: never drop accounting on doubt.
        lock::ofd_held_by_other(self.fd(), alive_lock(id.0)).unwrap_or(true)
    }

    /// Takes a slot's liveness lock without waiting, as a proof that its owner is gone and
    /// to keep others off the slot: a member takes it for writing; an observer, whose file
    /// is open only for reading, takes a read lock, which excludes a member's write lock.
    fn claim_dead(&self, id: SlotId) -> bool {
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

    /// A picture of the ledger for display and NVML process lists. Each device's `used` is
    /// the sum of the listed processes' `used`, read once. PIDs are given as the caller's
    /// PID namespace sees them.
    pub fn snapshot(&self, own: Option<SlotId>) -> Snapshot {
        let my_ns = pidns::own_pidns();
        let in_host = my_ns == pidns::INIT_PIDNS_INODE;
        let mut processes = Vec::new();
        for id in self.live_slots() {
            let slot = self.slot(id);
            let index = id.0;
            let alive = Some(id) == own || self.is_alive(id);
            let pid = slot.pid.load(Relaxed);
            let same_ns = slot.pidns.load(Relaxed) == my_ns;
            // The kernel's word: the PID, as seen here, of the process holding the slot's
            // classic lock (members skip the call for their own namespace, where the slot's
            // PID is the one they would get). What the slot states, its processes wrote.
            let held_by = if same_ns && self.store.is_member() { None } else { lock::posix_holder(self.fd(), pid_lock(index)) };
            let pid_here = held_by.or(same_ns.then_some(pid));
            let stated = slot.host_pid.load(Relaxed);
            let (host_pid, host_pid_vouched) = match held_by {
                Some(p) if in_host => {
                    if stated == 0 && self.store.writable() {
                        slot.host_pid.store(p, Relaxed);
                    }
                    (Some(p), true)
                }
                _ => ((stated != 0).then_some(stated), false),
            };
            let mut comm = [0u8; 16];
            comm[..8].copy_from_slice(&slot.comm[0].load(Relaxed).to_le_bytes());
            comm[8..].copy_from_slice(&slot.comm[1].load(Relaxed).to_le_bytes());
            let name_len = comm.iter().position(|b| *b == 0).unwrap_or(16);
            processes.push(ProcessView {
                slot: id,
                pid,
                pid_here,
                host_pid,
                host_pid_vouched,
                dying: !alive && slot.dying_since_ns.load(Relaxed) != 0,
                name: String::from_utf8_lossy(&comm[..name_len]).into_owned(),
                alive,
                started_unix_ms: slot.started_unix_ms.load(Relaxed),
                used: (0..MAX_DEVICES).map(|d| self.holding(id, DeviceId(d)).held()).collect(),
                reserved: (0..MAX_DEVICES).map(|d| self.holding(id, DeviceId(d)).reserved).collect(),
                context: (0..MAX_DEVICES).map(|d| slot.context[d].load(Relaxed)).collect(),
            });
        }
        let devices = (0..MAX_DEVICES)
            .map(DeviceId)
            .filter(|id| self.device(*id).state.load(Acquire) == DEVICE_READY)
            .map(|id| {
                let e = self.device(id);
                let mut uuid = [0u8; 16];
                uuid[..8].copy_from_slice(&e.uuid[0].load(Relaxed).to_le_bytes());
                uuid[8..].copy_from_slice(&e.uuid[1].load(Relaxed).to_le_bytes());
                DeviceView {
                    id,
                    uuid,
                    cap: e.cap.load(Relaxed),
                    used: processes.iter().map(|p| p.used[id.0]).fold(0u64, u64::saturating_add),
                    peak: e.peak.load(Relaxed),
                    refusals: e.refusals.load(Relaxed),
                    total_memory: e.total_memory.load(Relaxed),
                }
            })
            .collect();
        Snapshot { path: self.path().to_path_buf(), devices, processes }
    }
}

/// One device as [`Ledger::snapshot`] saw it.
#[derive(Debug, Clone)]
pub struct DeviceView {
    pub id: DeviceId,
    pub uuid: [u8; 16],
    pub cap: u64,
    /// Held by the ledger's processes (their unspent credit left out).
    pub used: u64,
    /// The most ever reserved at once, credit included.
    pub peak: u64,
    pub refusals: u64,
    pub total_memory: u64,
}

impl DeviceView {
    pub fn uuid_string(&self) -> String {
        format_gpu_uuid(&self.uuid)
    }
}

/// One process slot as [`Ledger::snapshot`] saw it.
#[derive(Debug, Clone)]
pub struct ProcessView {
    pub slot: SlotId,
    /// PID in the owner's own namespace.
    pub pid: u32,
    /// PID as the caller's namespace sees it, if visible.
    pub pid_here: Option<u32>,
    pub host_pid: Option<u32>,
    /// Whether the kernel vouches for `host_pid` (the caller is in the host's PID namespace
    /// and the slot's lock holder is that process); otherwise it is what the slot states.
    pub host_pid_vouched: bool,
    /// Dead, but the driver may still hold its memory: its bytes stay counted (`dying.rs`).
    pub dying: bool,
    pub name: String,
    /// False: the owner died and the next scan will return its memory.
    pub alive: bool,
    pub started_unix_ms: u64,
    /// Bytes held per ledger device index, contexts included.
    pub used: Vec<u64>,
    /// Bytes reserved against the cap per device: held plus unspent credit.
    pub reserved: Vec<u64>,
    pub context: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub path: PathBuf,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

fn uuid_words(uuid: [u8; 16]) -> [u64; 2] {
    [u64::from_le_bytes(uuid[..8].try_into().unwrap()), u64::from_le_bytes(uuid[8..].try_into().unwrap())]
}

#[cfg(test)]
mod tests;
