//! The byte layout of the ledger (version 3). Every field that more than one process touches
//! is an atomic, so all access through the shared mapping is data-race free.
//!
//! The ledger's data lives in a System V shared-memory segment of exactly [`SEGMENT_SIZE`]
//! bytes (fixed at creation: nobody can shrink it, so no process can be made to fault on it).
//! The path a ledger is named by is its *lock file*: it holds the byte-range locks (see
//! `lock.rs`) and a small [`Hint`] saying which segment holds the data. See `store.rs`.
//!
//! ```text
//! segment offset 0      Header        512 bytes
//!         offset 512    DeviceEntry   x MAX_DEVICES (256 bytes each)
//!         offset 8192   Slot          x MAX_SLOTS   (576 bytes each), one per live process
//! ```
//!
//! What a process holds on a device is one 16-byte word ([`Holding`]: reserved bytes, unspent
//! credit, a change count) changed by one compare-and-swap, so no crash can leave it half
//! written and no reader can see it half changed. The device's total is the sum of the live
//! slots' words: there is no second counter to drift from it.

use portable_atomic::AtomicU128;
use std::sync::atomic::{AtomicU32, AtomicU64};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FGPULDGR");
pub const VERSION: u32 = 3;
pub const MAX_DEVICES: usize = 16;
pub const MAX_SLOTS: usize = 1024;
/// Longest ledger path recorded in the header (longer ones are cut; only display uses it).
pub const PATH_BYTES: usize = 256;

pub const DEVICES_OFFSET: usize = 512;
pub const SLOTS_OFFSET: usize = 8192;
pub const SEGMENT_SIZE: usize = SLOTS_OFFSET + MAX_SLOTS * std::mem::size_of::<Slot>();

/// Offsets of the byte-range locks in the lock file (past any data it will ever hold).
pub const LOCK_BASE: i64 = 1 << 40;
/// Serialises creation of the segment and device registration.
pub const INIT_LOCK: i64 = LOCK_BASE;
/// Serialises the reservations that raise a device's total (credit refills): the cap check.
pub fn refill_lock(device: usize) -> i64 {
    LOCK_BASE + 1 + device as i64
}
/// Held by a slot's owner for its whole life: "the owner is alive".
pub fn alive_lock(slot: usize) -> i64 {
    LOCK_BASE + 64 + 2 * slot as i64
}
/// A classic POSIX lock whose holder PID the kernel translates for whoever asks.
pub fn pid_lock(slot: usize) -> i64 {
    alive_lock(slot) + 1
}

/// `DeviceEntry::kind`: written by an fgpu that did not know MIG devices.
pub const KIND_UNKNOWN: u32 = 0;
/// `DeviceEntry::kind`: a whole GPU (`GPU-…`).
pub const KIND_GPU: u32 = 1;
/// `DeviceEntry::kind`: a MIG device (`MIG-…`), a compute instance of a GPU in MIG mode.
pub const KIND_MIG: u32 = 2;

pub const DEVICE_EMPTY: u32 = 0;
pub const DEVICE_READY: u32 = 2;
pub const SLOT_FREE: u32 = 0;
pub const SLOT_LIVE: u32 = 1;
/// Being claimed (or cleared) by one process, which changed the state to this with a
/// compare-and-swap; it holds nothing others count. See `Slot::claiming_since_s`.
pub const SLOT_CLAIMING: u32 = 2;

/// `Slot::liveness`: the owner holds the slot's liveness lock (the usual way).
pub const LIVENESS_LOCK: u64 = 0;
/// `Slot::liveness`: the slot's lock was held by a process that is not a member when the
/// owner joined (`mod.rs`, `join`), so the owner is alive while its process is.
pub const LIVENESS_PROCESS: u64 = 1;

/// `Header::sharing`: who may use the ledger.
pub const SHARING_USER: u32 = 1;
pub const SHARING_SHARED: u32 = 2;

#[repr(C)]
pub struct Header {
    /// [`MAGIC`], written last when the segment is initialised.
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_slots: AtomicU32,
    pub slot_size: AtomicU32,
    pub segment_size: AtomicU64,
    pub created_unix: AtomicU64,
    /// CLOCK_MONOTONIC (ns) of the last scan for dead processes.
    pub last_scan_ns: AtomicU64,
    /// Random identity of this ledger, also written in the lock file's hint.
    pub ledger_id: [AtomicU64; 2],
    /// The lock file this segment belongs to (`st_dev`, `st_ino`): only processes that
    /// locked that very file may use it.
    pub lock_dev: AtomicU64,
    pub lock_ino: AtomicU64,
    /// Mount namespace of the creator (with the path, finds a ledger whose file was replaced).
    pub mntns: AtomicU64,
    pub ipcns: AtomicU64,
    pub creator_uid: AtomicU32,
    /// [`SHARING_USER`] or [`SHARING_SHARED`].
    pub sharing: AtomicU32,
    /// One past the highest slot index ever claimed: scans stop there.
    pub slot_high: AtomicU32,
    pub reserved0: AtomicU32,
    /// Scans for dead processes so far (the soak test counts how many a repair takes).
    pub scans: AtomicU64,
    pub reserved: [AtomicU64; 17],
    /// The ledger's path as its creator named it, NUL-padded.
    pub path: [AtomicU64; PATH_BYTES / 8],
}

#[repr(C)]
pub struct DeviceEntry {
    pub state: AtomicU32,
    /// What the UUID names: [`KIND_GPU`] or [`KIND_MIG`]; [`KIND_UNKNOWN`] (0) in an entry
    /// made by an fgpu that did not know MIG devices (this word was reserved then), which
    /// printed every device as a GPU. The entry is found by its UUID's bytes alone.
    pub kind: AtomicU32,
    /// The device UUID (16 bytes as two little-endian words).
    pub uuid: [AtomicU64; 2],
    /// The ledger's cap for this device in bytes.
    pub cap: AtomicU64,
    /// The most ever reserved at once (credit included).
    pub peak: AtomicU64,
    /// Allocations refused because of the cap.
    pub refusals: AtomicU64,
    /// Physical memory of the device.
    pub total_memory: AtomicU64,
    pub registered_unix: AtomicU64,
    /// Last measured size of one CUDA context on this device (0: none measured yet); new
    /// contexts reserve this much before they are created.
    pub context_hint: AtomicU64,
    /// The ledger's compute share on this device and its bucket (`ledger/compute.rs`).
    pub compute: ComputeEntry,
    pub reserved: [AtomicU64; 15],
}

/// A device's compute share, shared by the ledger's processes (see `crate::compute` and
/// `ledger/compute.rs`). Every word stands alone: each is changed by one atomic operation.
#[repr(C)]
pub struct ComputeEntry {
    /// The ledger's share of the device's time, parts per million; 0: no share.
    pub share_ppm: AtomicU64,
    /// The bucket's virtual clock (CLOCK_MONOTONIC ns): chunks of launches are admitted
    /// while it is far enough behind now (`crate::compute::charge`).
    pub vclock: AtomicU64,
    /// GPU time measured for the ledger's processes since the entry was made (ns).
    pub used_ns: AtomicU64,
    /// The display window: when it began (CLOCK_MONOTONIC ns) and `used_ns` then.
    pub window_start: AtomicU64,
    pub window_used: AtomicU64,
    /// The ledger's use over the last whole window (ppm of the device's time), and when
    /// that window ended.
    pub recent_ppm: AtomicU64,
    pub recent_at: AtomicU64,
    /// Time launches of the ledger's processes waited for the share (ns, all threads).
    pub waited_ns: AtomicU64,
}

#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    /// PID in the owner's own PID namespace.
    pub pid: AtomicU32,
    /// PID in the host namespace, 0 while unknown.
    pub host_pid: AtomicU32,
    /// CLOCK_MONOTONIC seconds when the slot became [`SLOT_CLAIMING`].
    pub claiming_since_s: AtomicU32,
    /// Inode of the owner's PID namespace.
    pub pidns: AtomicU64,
    pub started_unix_ms: AtomicU64,
    pub comm: [AtomicU64; 2],
    /// CLOCK_MONOTONIC (ns) when a process found this slot's owner dead while the driver
    /// may still hold its memory (`ledger/dying.rs`); 0: not dying. Older fgpu ignores it.
    pub dying_since_ns: AtomicU64,
    /// [`LIVENESS_LOCK`] or [`LIVENESS_PROCESS`]. Older fgpu reads 0 here.
    pub liveness: AtomicU64,
    /// What this process holds per ledger device: a [`Holding`] word each.
    pub holding: [AtomicU128; MAX_DEVICES],
    /// The part of the held bytes that is CUDA context memory (display only).
    pub context: [AtomicU64; MAX_DEVICES],
    /// GPU time measured for this process per ledger device (ns; `ledger/compute.rs`).
    pub compute: [AtomicU64; MAX_DEVICES],
}

/// The lock file's first bytes: which segment holds the ledger. Only a hint: a process
/// checks the segment it names against its own identity, and searches when it is wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hint {
    pub magic: u64,
    pub version: u32,
    pub shmid: i32,
    pub ledger_id: [u64; 2],
    pub ipcns: u64,
}

pub const HINT_MAGIC: u64 = u64::from_le_bytes(*b"FGPULOCK");
pub const HINT_SIZE: usize = std::mem::size_of::<Hint>();

impl Hint {
    pub fn to_bytes(self) -> [u8; HINT_SIZE] {
        let mut out = [0u8; HINT_SIZE];
        out[0..8].copy_from_slice(&self.magic.to_le_bytes());
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.shmid.to_le_bytes());
        out[16..24].copy_from_slice(&self.ledger_id[0].to_le_bytes());
        out[24..32].copy_from_slice(&self.ledger_id[1].to_le_bytes());
        out[32..40].copy_from_slice(&self.ipcns.to_le_bytes());
        out
    }

    /// The hint in `bytes`, if they hold a well-formed one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Hint> {
        if bytes.len() < HINT_SIZE {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let hint = Hint {
            magic: word(0),
            version: u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            shmid: i32::from_le_bytes(bytes[12..16].try_into().unwrap()),
            ledger_id: [word(16), word(24)],
            ipcns: word(32),
        };
        (hint.magic == HINT_MAGIC && hint.version == VERSION && hint.shmid >= 0).then_some(hint)
    }
}

/// One process's holding on one device, as one 128-bit word:
///
/// * `reserved`: bytes counted against the cap (what it holds plus its unspent credit);
/// * `credit`: the part of `reserved` not handed out yet (at most 2 x the credit chunk);
/// * `changes`: counts every change, so a reader can tell "unchanged" from "changed back".
///
/// What the process holds is `reserved - credit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    pub reserved: u64,
    pub credit: u32,
    pub changes: u32,
}

impl Holding {
    pub fn unpack(word: u128) -> Holding {
        Holding { reserved: word as u64, credit: (word >> 64) as u32, changes: (word >> 96) as u32 }
    }

    pub fn pack(self) -> u128 {
        self.reserved as u128 | (self.credit as u128) << 64 | (self.changes as u128) << 96
    }

    pub fn held(self) -> u64 {
        self.reserved.saturating_sub(self.credit as u64)
    }

    /// The next state, with the change count moved on.
    pub fn then(self, reserved: u64, credit: u64) -> Holding {
        debug_assert!(credit <= u32::MAX as u64);
        Holding { reserved, credit: credit.min(u32::MAX as u64) as u32, changes: self.changes.wrapping_add(1) }
    }
}

// The layout is shared between processes that may run different builds: pin it.
const _: () = {
    assert!(std::mem::size_of::<Header>() == 512);
    assert!(std::mem::size_of::<DeviceEntry>() == 256);
    assert!(std::mem::size_of::<ComputeEntry>() == 64);
    assert!(std::mem::size_of::<Slot>() == 576);
    assert!(std::mem::align_of::<Slot>() == 16);
    assert!(std::mem::offset_of!(Slot, holding) == 64);
    assert!(DEVICES_OFFSET + MAX_DEVICES * std::mem::size_of::<DeviceEntry>() <= SLOTS_OFFSET);
    assert!(SEGMENT_SIZE.is_multiple_of(4096));
    assert!(HINT_SIZE == 40);
};
