//! The ledger: one shared-memory file per container (or per `fgpu run`) that records, per
//! GPU, the cap and what every process holds.
//!
//! * **Check-and-reserve** is one compare-and-swap on the device's `used` counter against
//!   the cap, so racing threads and processes can never pass the cap together. The owning
//!   slot is credited afterwards; every crash window errs towards counting too much, never
//!   too little, and [`Ledger::reclaim_dead`] repairs the counters once the ledger is empty.
//! * **Credit**: most allocations are served from memory their process reserved ahead
//!   ([`Ledger::reserve`]), so they touch only the process's own slot, not the device
//!   counter every process shares. Credit counts against the cap; "used" figures leave it
//!   out; before any refusal all other processes' credit is taken back.
//! * **Liveness** comes from a lock per slot that the kernel drops when the owner dies
//!   (see `lock.rs`): no PIDs are compared, so PID reuse and PID namespaces do not matter,
//!   and no lock that a killed process could leave held guards the data.
//! * **Layout** is fixed and versioned (`layout.rs`); a file from another version, a
//!   truncated file or a foreign file is refused with an error that says which.

pub mod layout;
mod lock;

use crate::pidns;
use crate::uuid::format_gpu_uuid;
use layout::*;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use thiserror::Error;

/// Credit a process reserves at once for its next allocations (see [`Ledger::reserve`]).
pub const CREDIT_CHUNK: u64 = 16 << 20;

/// How often, at most, the processes of a ledger scan it for dead processes when they only
/// report usage (allocations that would be refused always scan first).
pub const SCAN_INTERVAL_NS: u64 = 100_000_000;

#[derive(Debug, Error)]
pub enum LedgerError {
    #[error("ledger {path}: cannot {op}: {source}")]
    Io { path: PathBuf, op: &'static str, source: io::Error },
    #[error("ledger {path}: no space left to create it ({need} bytes); free space or set FGPU_LEDGER to another file system")]
    NoSpace { path: PathBuf, need: usize },
    #[error("ledger {path}: not an fgpu ledger (unknown header); remove it or set FGPU_LEDGER to another file")]
    Foreign { path: PathBuf },
    #[error("ledger {path}: format version {found}, this fgpu understands version {expected}; stop the processes using it or set FGPU_LEDGER to another file")]
    Version { path: PathBuf, found: u32, expected: u32 },
    #[error("ledger {path}: corrupt: {what}; remove it once no capped process uses it")]
    Corrupt { path: PathBuf, what: String },
    #[error("ledger {path}: not initialised yet (empty file; the first capped process fills it in)")]
    Empty { path: PathBuf },
    #[error("ledger {path}: all {MAX_SLOTS} process slots are in use")]
    Full { path: PathBuf },
    #[error("ledger {path}: all {MAX_DEVICES} device entries are in use")]
    TooManyDevices { path: PathBuf },
}

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
    pub used: u64,
}

/// What [`Ledger::register_device`] found or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub device: DeviceId,
    /// The cap the ledger holds for this device.
    pub ledger_cap: u64,
}

/// A mapped ledger file.
pub struct Ledger {
    base: NonNull<u8>,
    file: File,
    path: PathBuf,
}

// SAFETY: the mapping is process-wide and every field reached through it is an atomic;
// `File` is Send + Sync. Nothing in `Ledger` is tied to one thread.
unsafe impl Send for Ledger {}
// SAFETY: see above: shared access only goes through atomics.
unsafe impl Sync for Ledger {}

impl Drop for Ledger {
    fn drop(&mut self) {
        // SAFETY: `base` came from a successful mmap of FILE_SIZE bytes and no reference into
        // the mapping outlives `self` (accessors borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), FILE_SIZE) };
    }
}

impl Ledger {
    /// Opens the ledger at `path`, creating and initialising it if it does not exist.
    pub fn open_or_create(path: &Path) -> Result<Ledger, LedgerError> {
        let io_err = |op, source| LedgerError::Io { path: path.to_path_buf(), op, source };
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() && !parent.exists() {
                std::fs::create_dir_all(parent).map_err(|e| io_err("create its directory", e))?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| io_err("open", e))?;
        lock::ofd_lock(file.as_fd(), INIT_LOCK, true).map_err(|e| io_err("lock", e))?;
        let result = Self::initialise_locked(&file, path);
        lock::ofd_unlock(file.as_fd(), INIT_LOCK);
        result?;
        Self::map(file, path)
    }

    /// Opens an existing ledger without creating it (for `fgpu status`).
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| LedgerError::Io { path: path.to_path_buf(), op: "open", source: e })?;
        Self::validate(&file, path, true)?;
        Self::map(file, path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor holding this process's locks (a forked child closes its copy).
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// The mapping (address, length). A forked child must unmap its copy too: a mapping
    /// keeps the open file description, and with it the parent's liveness lock, alive.
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.base.as_ptr(), FILE_SIZE)
    }

    /// Checks the header of an existing file; `Ok(false)` if it is empty (never initialised).
    fn validate(file: &File, path: &Path, must_exist: bool) -> Result<bool, LedgerError> {
        let io_err = |op, source| LedgerError::Io { path: path.to_path_buf(), op, source };
        let size = file.metadata().map_err(|e| io_err("stat", e))?.len();
        let mut head = [0u8; 12];
        let read = file.read_at(&mut head, 0).map_err(|e| io_err("read", e))?;
        let magic = u64::from_le_bytes(head[0..8].try_into().unwrap());
        if size == 0 || (read >= 8 && magic == 0 && !must_exist) {
            if must_exist {
                return Err(LedgerError::Empty { path: path.to_path_buf() });
            }
            return Ok(false);
        }
        if read < 12 {
            return Err(LedgerError::Corrupt { path: path.to_path_buf(), what: format!("truncated to {size} bytes, expected {FILE_SIZE}") });
        }
        if magic != MAGIC {
            return Err(LedgerError::Foreign { path: path.to_path_buf() });
        }
        let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(LedgerError::Version { path: path.to_path_buf(), found: version, expected: VERSION });
        }
        if size != FILE_SIZE as u64 {
            return Err(LedgerError::Corrupt { path: path.to_path_buf(), what: format!("truncated to {size} bytes, expected {FILE_SIZE}") });
        }
        Ok(true)
    }

    /// Runs with the init lock held: a file that is empty (new, or left half-made by a
    /// creator that died) is sized, its blocks allocated, and its header written.
    fn initialise_locked(file: &File, path: &Path) -> Result<(), LedgerError> {
        if Self::validate(file, path, false)? {
            return Ok(());
        }
        let io_err = |op, source| LedgerError::Io { path: path.to_path_buf(), op, source };
        file.set_len(0).map_err(|e| io_err("truncate", e))?;
        // Allocate every block now: a sparse file on a full disk would turn a later write
        // through the mapping into SIGBUS in the host program.
        // SAFETY: models posix_fallocate(3) on an open descriptor with a positive length.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, FILE_SIZE as libc::off_t) };
        if rc != 0 {
            let _ = file.set_len(0);
            if rc == libc::ENOSPC {
                return Err(LedgerError::NoSpace { path: path.to_path_buf(), need: FILE_SIZE });
            }
            // File systems without fallocate (rare): fall back to explicit zero writes.
            let zeros = vec![0u8; FILE_SIZE];
            if let Err(e) = file.write_all_at(&zeros, 0) {
                let _ = file.set_len(0);
                return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    LedgerError::NoSpace { path: path.to_path_buf(), need: FILE_SIZE }
                } else {
                    io_err("allocate", e)
                });
            }
        }
        // Everyone in the container shares the file, whatever their umask or user.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        let mut header = [0u8; 40];
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&(MAX_DEVICES as u32).to_le_bytes());
        header[16..20].copy_from_slice(&(MAX_SLOTS as u32).to_le_bytes());
        header[20..24].copy_from_slice(&(std::mem::size_of::<Slot>() as u32).to_le_bytes());
        header[24..32].copy_from_slice(&(FILE_SIZE as u64).to_le_bytes());
        header[32..40].copy_from_slice(&unix_now_ms().div_euclid(1000).to_le_bytes());
        file.write_all_at(&header, 0).map_err(|e| io_err("write", e))?;
        // The magic goes last, so a reader never sees a half-written header as valid.
        file.write_all_at(&MAGIC.to_le_bytes(), 0).map_err(|e| io_err("write", e))?;
        Ok(())
    }

    fn map(file: File, path: &Path) -> Result<Ledger, LedgerError> {
        // SAFETY: models mmap(2) of FILE_SIZE bytes of a file that validation showed is
        // exactly FILE_SIZE long, shared and read-write; the result is checked for failure.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(LedgerError::Io { path: path.to_path_buf(), op: "map", source: io::Error::last_os_error() });
        }
        let base = NonNull::new(ptr.cast()).expect("mmap returned null without MAP_FIXED");
        Ok(Ledger { base, file, path: path.to_path_buf() })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is FILE_SIZE bytes, page-aligned, and Header (all atomics)
        // fits at offset 0; it lives as long as `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    fn device(&self, id: DeviceId) -> &DeviceEntry {
        assert!(id.0 < MAX_DEVICES);
        // SAFETY: in bounds by the assertion and the layout's compile-time checks;
        // DeviceEntry is all atomics and 8-byte aligned at this offset.
        unsafe { &*self.base.as_ptr().add(DEVICES_OFFSET).cast::<DeviceEntry>().add(id.0) }
    }

    fn slot(&self, id: SlotId) -> &Slot {
        assert!(id.0 < MAX_SLOTS);
        // SAFETY: in bounds by the assertion and FILE_SIZE; Slot is all atomics, aligned.
        unsafe { &*self.base.as_ptr().add(SLOTS_OFFSET).cast::<Slot>().add(id.0) }
    }

    fn with_init_lock<T>(&self, f: impl FnOnce() -> T) -> Result<T, LedgerError> {
        lock::ofd_lock(self.file.as_fd(), INIT_LOCK, true)
            .map_err(|e| LedgerError::Io { path: self.path.clone(), op: "lock", source: e })?;
        let out = f();
        lock::ofd_unlock(self.file.as_fd(), INIT_LOCK);
        Ok(out)
    }

    /// Finds the entry for a device UUID, creating it with `wanted_cap` if it is new. If no
    /// other live process is in the ledger, the cap is (re)set to `wanted_cap`: a ledger file
    /// left from earlier runs never imposes a cap nobody currently asks for.
    pub fn register_device(
        &self,
        uuid: [u8; 16],
        total_memory: u64,
        wanted_cap: u64,
        own: Option<SlotId>,
    ) -> Result<Registration, LedgerError> {
        let words = [u64::from_le_bytes(uuid[..8].try_into().unwrap()), u64::from_le_bytes(uuid[8..].try_into().unwrap())];
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
            let index = empty.ok_or_else(|| LedgerError::TooManyDevices { path: self.path.clone() })?;
            let entry = self.device(DeviceId(index));
            entry.uuid[0].store(words[0], Relaxed);
            entry.uuid[1].store(words[1], Relaxed);
            entry.cap.store(wanted_cap, Relaxed);
            entry.total_memory.store(total_memory, Relaxed);
            entry.registered_unix.store(unix_now_ms() as u64 / 1000, Relaxed);
            entry.state.store(DEVICE_READY, Release);
            Ok(Registration { device: DeviceId(index), ledger_cap: wanted_cap })
        })?
    }

    fn has_other_live_slot(&self, own: Option<SlotId>) -> bool {
        (0..MAX_SLOTS).map(SlotId).any(|id| Some(id) != own && self.slot(id).state.load(Acquire) == SLOT_LIVE && self.is_alive(id))
    }

    /// Claims a slot for the calling process and holds its liveness lock until the ledger is
    /// dropped or the process dies.
    pub fn join(&self) -> Result<SlotId, LedgerError> {
        // Free slots first; then slots marked live, whose owner may have died.
        for wanted in [SLOT_FREE, SLOT_LIVE] {
            for index in 0..MAX_SLOTS {
                let id = SlotId(index);
                if self.slot(id).state.load(Relaxed) != wanted {
                    continue;
                }
                let locked = lock::ofd_lock(self.file.as_fd(), alive_lock(index), false)
                    .map_err(|e| LedgerError::Io { path: self.path.clone(), op: "lock a slot", source: e })?;
                if !locked {
                    continue;
                }
                if self.slot(id).state.load(Acquire) == SLOT_LIVE {
                    self.reclaim_locked(id);
                }
                self.fill_slot(id);
                return Ok(id);
            }
        }
        Err(LedgerError::Full { path: self.path.clone() })
    }

    fn fill_slot(&self, id: SlotId) {
        let slot = self.slot(id);
        let comm = pidns::comm();
        slot.pid.store(std::process::id(), Relaxed);
        slot.host_pid.store(pidns::host_pid().unwrap_or(0), Relaxed);
        slot.pidns.store(pidns::own_pidns(), Relaxed);
        slot.started_unix_ms.store(unix_now_ms() as u64, Relaxed);
        slot.comm[0].store(u64::from_le_bytes(comm[..8].try_into().unwrap()), Relaxed);
        slot.comm[1].store(u64::from_le_bytes(comm[8..].try_into().unwrap()), Relaxed);
        for d in 0..MAX_DEVICES {
            slot.used[d].store(0, Relaxed);
            slot.context[d].store(0, Relaxed);
            slot.credit[d].store(0, Relaxed);
        }
        slot.state.store(SLOT_LIVE, Release);
        // Best effort: lets other PID namespaces see which PID owns the slot.
        let _ = lock::posix_lock(self.file.as_fd(), pid_lock(id.0));
    }

    /// Gives the slot back (normal exit); what it still holds is returned to the devices.
    pub fn leave(&self, id: SlotId) {
        self.reclaim_locked(id);
        lock::ofd_unlock(self.file.as_fd(), alive_lock(id.0));
    }

    /// Returns a slot's holdings to the devices and frees it. The caller holds its lock.
    fn reclaim_locked(&self, id: SlotId) -> u64 {
        let slot = self.slot(id);
        let mut total = 0;
        for d in 0..MAX_DEVICES {
            let held = slot.used[d].swap(0, AcqRel);
            slot.context[d].store(0, Relaxed);
            slot.credit[d].store(0, Relaxed);
            if held > 0 {
                saturating_sub(&self.device(DeviceId(d)).used, held);
                total += held;
            }
        }
        slot.state.store(SLOT_FREE, Release);
        total
    }

    /// Atomically reserves `bytes` on a device for a slot if the device's total stays within
    /// `limit` (the smaller of the ledger's cap and the process's own).
    pub fn try_reserve(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), Refusal> {
        let entry = self.device(device);
        let mut used = entry.used.load(Relaxed);
        loop {
            let new = used.checked_add(bytes).filter(|n| *n <= limit);
            let Some(new) = new else {
                return Err(Refusal { requested: bytes, cap: limit, used });
            };
            match entry.used.compare_exchange_weak(used, new, AcqRel, Relaxed) {
                Ok(_) => {
                    self.slot(id).used[device.0].fetch_add(bytes, Relaxed);
                    // A read first: most reservations do not set a new peak, and a plain load
                    // keeps the cache line shared instead of writing it on every allocation.
                    if new > entry.peak.load(Relaxed) {
                        entry.peak.fetch_max(new, Relaxed);
                    }
                    return Ok(());
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Reserves `bytes` for an allocation, as [`Ledger::try_reserve`] does, but through this
    /// process's credit: memory it reserved earlier and has not handed out. Credit is spent
    /// and refilled on the slot's own cache line, so most allocations never write the
    /// device's counter, which every process of the ledger shares. Credit counts against the
    /// cap like any reservation, so the cap holds exactly; and before refusing, the credit of
    /// every other process is taken back, so an allocation that fits is never refused.
    pub fn reserve(&self, id: SlotId, device: DeviceId, bytes: u64, limit: u64) -> Result<(), Refusal> {
        let credit = &self.slot(id).credit[device.0];
        if take_up_to(credit, bytes) == bytes {
            return Ok(());
        }
        // Not enough credit: reserve the request and a fresh chunk of credit. The device
        // counter moves first, so "used" (reserved minus credit) can only read high, by at
        // most one chunk, for the instant in between.
        let refill = CREDIT_CHUNK.min(limit / 64);
        if self.try_reserve(id, device, bytes + refill, limit).is_ok() {
            credit.fetch_add(refill, AcqRel);
            return Ok(());
        }
        // Near the cap: spend what credit there is and reserve only the shortfall, taking
        // other processes' unspent credit back before giving up.
        let have = credit.swap(0, AcqRel);
        let need = bytes.saturating_sub(have);
        let spare = have.saturating_sub(bytes);
        let mut result = self.try_reserve(id, device, need, limit);
        if result.is_err() {
            self.take_back_credit(device, Some(id));
            result = self.try_reserve(id, device, need, limit);
        }
        match result {
            Ok(()) => {
                credit.fetch_add(spare, AcqRel);
                Ok(())
            }
            Err(refusal) => {
                credit.fetch_add(have, AcqRel);
                Err(Refusal { requested: bytes, used: refusal.used.saturating_sub(self.credit_total(device)), ..refusal })
            }
        }
    }

    /// Returns `bytes` of an allocation to this process's credit; credit beyond
    /// 2 x [`CREDIT_CHUNK`] goes back to the device.
    pub fn unreserve(&self, id: SlotId, device: DeviceId, bytes: u64) {
        let credit = &self.slot(id).credit[device.0];
        let now = credit.fetch_add(bytes, AcqRel) + bytes;
        if now > 2 * CREDIT_CHUNK {
            let excess = take_up_to(credit, now - CREDIT_CHUNK);
            self.release(id, device, excess);
        }
    }

    /// Gives every other process's unspent credit on a device back to the device.
    fn take_back_credit(&self, device: DeviceId, own: Option<SlotId>) {
        for index in 0..MAX_SLOTS {
            let id = SlotId(index);
            if Some(id) == own || self.slot(id).state.load(Acquire) != SLOT_LIVE {
                continue;
            }
            let taken = self.slot(id).credit[device.0].swap(0, AcqRel);
            if taken > 0 {
                self.release(id, device, taken);
            }
        }
    }

    /// Unspent credit of all live processes on a device (reserved, not handed out).
    fn credit_total(&self, device: DeviceId) -> u64 {
        (0..MAX_SLOTS)
            .map(SlotId)
            .filter(|id| self.slot(*id).state.load(Acquire) == SLOT_LIVE)
            .map(|id| self.slot(id).credit[device.0].load(Relaxed))
            .sum()
    }

    /// Adds memory the driver already handed out (a correction upwards); no cap check.
    pub fn force_add(&self, id: SlotId, device: DeviceId, bytes: u64) {
        let entry = self.device(device);
        let new = entry.used.fetch_add(bytes, AcqRel) + bytes;
        self.slot(id).used[device.0].fetch_add(bytes, Relaxed);
        entry.peak.fetch_max(new, Relaxed);
        // Past the cap, nobody may keep allocating from credit reserved before: every
        // process's credit (this one's too) goes back, so the next allocation is refused.
        if new > entry.cap.load(Acquire) {
            self.take_back_credit(device, None);
        }
    }

    /// Returns `bytes` a slot held on a device.
    pub fn release(&self, id: SlotId, device: DeviceId, bytes: u64) {
        let taken = saturating_sub(&self.slot(id).used[device.0], bytes);
        saturating_sub(&self.device(device).used, taken);
    }

    /// Records how much of a slot's holding on a device is context memory (for display).
    pub fn add_context(&self, id: SlotId, device: DeviceId, delta: i64) {
        let cell = &self.slot(id).context[device.0];
        if delta >= 0 {
            cell.fetch_add(delta as u64, Relaxed);
        } else {
            saturating_sub(cell, delta.unsigned_abs());
        }
    }

    pub fn count_refusal(&self, device: DeviceId) {
        self.device(device).refusals.fetch_add(1, Relaxed);
    }

    /// Looks a device up by UUID without registering it.
    pub fn find_device(&self, uuid: [u8; 16]) -> Option<DeviceId> {
        let words = [u64::from_le_bytes(uuid[..8].try_into().unwrap()), u64::from_le_bytes(uuid[8..].try_into().unwrap())];
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

    /// What all processes of the ledger hold on a device (reserved minus unspent credit).
    pub fn used(&self, device: DeviceId) -> u64 {
        self.device(device).used.load(Acquire).saturating_sub(self.credit_total(device))
    }

    pub fn cap(&self, device: DeviceId) -> u64 {
        self.device(device).cap.load(Relaxed)
    }

    /// What one slot holds on a device (without its unspent credit).
    pub fn slot_used(&self, id: SlotId, device: DeviceId) -> u64 {
        let slot = self.slot(id);
        slot.used[device.0].load(Relaxed).saturating_sub(slot.credit[device.0].load(Relaxed))
    }

    fn is_alive(&self, id: SlotId) -> bool {
        // An error here (should not happen) counts as alive: never drop accounting on doubt.
        lock::ofd_held_by_other(self.file.as_fd(), alive_lock(id.0)).unwrap_or(true)
    }

    /// Scans for slots whose owner died and returns their memory. Returns how many it freed.
    pub fn reclaim_dead(&self, own: Option<SlotId>) -> usize {
        let mut reclaimed = 0;
        for index in 0..MAX_SLOTS {
            let id = SlotId(index);
            if Some(id) == own || self.slot(id).state.load(Acquire) != SLOT_LIVE {
                continue;
            }
            if let Ok(true) = lock::ofd_lock(self.file.as_fd(), alive_lock(index), false) {
                if self.slot(id).state.load(Acquire) == SLOT_LIVE {
                    self.reclaim_locked(id);
                    reclaimed += 1;
                }
                lock::ofd_unlock(self.file.as_fd(), alive_lock(index));
            }
        }
        self.repair_if_empty(own);
        self.header().last_scan_ns.store(crate::log::monotonic_ns(), Relaxed);
        reclaimed
    }

    /// With no live process left, every device must hold nothing. A counter that is not zero
    /// then is what a SIGKILL between two atomic steps of a reservation left behind: clear it,
    /// but only if nobody reserved since we looked. Order matters: read the counter, *then*
    /// check that no slot is live (a process goes live before it reserves), then
    /// compare-and-swap the value read (which fails if anyone reserved in between).
    fn repair_if_empty(&self, own: Option<SlotId>) {
        if own.is_some() {
            return;
        }
        let seen: Vec<u64> = (0..MAX_DEVICES).map(|d| self.device(DeviceId(d)).used.load(Acquire)).collect();
        if seen.iter().all(|v| *v == 0) {
            return;
        }
        if (0..MAX_SLOTS).any(|i| self.slot(SlotId(i)).state.load(Acquire) == SLOT_LIVE) {
            return;
        }
        for (d, value) in seen.into_iter().enumerate() {
            if value != 0 {
                let _ = self.device(DeviceId(d)).used.compare_exchange(value, 0, AcqRel, Relaxed);
            }
        }
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

    /// A consistent-enough picture of the ledger for display and NVML process lists.
    /// PIDs are given as the caller's PID namespace sees them.
    pub fn snapshot(&self, own: Option<SlotId>) -> Snapshot {
        let my_ns = pidns::own_pidns();
        let in_host = my_ns == pidns::INIT_PIDNS_INODE;
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
                    used: e.used.load(Relaxed).saturating_sub(self.credit_total(id)),
                    peak: e.peak.load(Relaxed),
                    refusals: e.refusals.load(Relaxed),
                    total_memory: e.total_memory.load(Relaxed),
                }
            })
            .collect();
        let mut processes = Vec::new();
        for index in 0..MAX_SLOTS {
            let id = SlotId(index);
            let slot = self.slot(id);
            if slot.state.load(Acquire) != SLOT_LIVE {
                continue;
            }
            let alive = Some(id) == own || self.is_alive(id);
            let pid = slot.pid.load(Relaxed);
            let same_ns = slot.pidns.load(Relaxed) == my_ns;
            let pid_here = if same_ns { Some(pid) } else { lock::posix_holder(self.file.as_fd(), pid_lock(index)) };
            let mut host_pid = slot.host_pid.load(Relaxed);
            if host_pid == 0 && in_host {
                if let Some(p) = pid_here {
                    host_pid = p;
                    slot.host_pid.store(p, Relaxed);
                }
            }
            let mut comm = [0u8; 16];
            comm[..8].copy_from_slice(&slot.comm[0].load(Relaxed).to_le_bytes());
            comm[8..].copy_from_slice(&slot.comm[1].load(Relaxed).to_le_bytes());
            let name_len = comm.iter().position(|b| *b == 0).unwrap_or(16);
            processes.push(ProcessView {
                slot: id,
                pid,
                pid_here,
                host_pid: (host_pid != 0).then_some(host_pid),
                name: String::from_utf8_lossy(&comm[..name_len]).into_owned(),
                alive,
                started_unix_ms: slot.started_unix_ms.load(Relaxed),
                used: (0..MAX_DEVICES).map(|d| slot.used[d].load(Relaxed).saturating_sub(slot.credit[d].load(Relaxed))).collect(),
                context: (0..MAX_DEVICES).map(|d| slot.context[d].load(Relaxed)).collect(),
            });
        }
        Snapshot { path: self.path.clone(), devices, processes }
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
    pub name: String,
    /// False: the owner died and the next scan will return its memory.
    pub alive: bool,
    pub started_unix_ms: u64,
    /// Bytes held per ledger device index, contexts included.
    pub used: Vec<u64>,
    pub context: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub path: PathBuf,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

/// Takes exactly `bytes` from `cell` if it holds that much, else nothing. Returns what it took.
fn take_up_to(cell: &std::sync::atomic::AtomicU64, bytes: u64) -> u64 {
    match cell.fetch_update(AcqRel, Relaxed, |v| v.checked_sub(bytes)) {
        Ok(_) => bytes,
        Err(_) => 0,
    }
}

fn saturating_sub(cell: &std::sync::atomic::AtomicU64, bytes: u64) -> u64 {
    let mut taken = 0;
    let _ = cell.fetch_update(AcqRel, Relaxed, |v| {
        taken = v.min(bytes);
        Some(v - taken)
    });
    taken
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
