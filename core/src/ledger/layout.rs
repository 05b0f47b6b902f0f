//! The byte layout of the ledger file (version 2; version 1 had no credit). Every field that more than one process
//! touches is an atomic, so all access through the shared mapping is data-race free.
//!
//! ```text
//! offset 0      Header        128 bytes
//! offset 128    DeviceEntry   x MAX_DEVICES (128 bytes each)
//! offset 4096   Slot          x MAX_SLOTS   (448 bytes each), one per live process
//! ```
//!
//! Locks (advisory `fcntl` locks on bytes past the end of the data; the kernel drops them
//! when their holder dies) live at [`LOCK_BASE`]: one byte to serialise initialisation and
//! device registration, and two bytes per slot: an open-file-description lock that says "the
//! owner is alive", and a classic POSIX lock whose holder PID the kernel translates into the
//! PID namespace of whoever asks.

use std::sync::atomic::{AtomicU32, AtomicU64};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FGPULDGR");
pub const VERSION: u32 = 2;
pub const MAX_DEVICES: usize = 16;
pub const MAX_SLOTS: usize = 1024;

pub const DEVICES_OFFSET: usize = 128;
pub const SLOTS_OFFSET: usize = 4096;
pub const FILE_SIZE: usize = SLOTS_OFFSET + MAX_SLOTS * std::mem::size_of::<Slot>();

pub const LOCK_BASE: i64 = 1 << 40;
pub const INIT_LOCK: i64 = LOCK_BASE;
pub fn alive_lock(slot: usize) -> i64 {
    LOCK_BASE + 16 + 2 * slot as i64
}
pub fn pid_lock(slot: usize) -> i64 {
    alive_lock(slot) + 1
}

pub const DEVICE_EMPTY: u32 = 0;
pub const DEVICE_READY: u32 = 2;
pub const SLOT_FREE: u32 = 0;
pub const SLOT_LIVE: u32 = 1;

#[repr(C)]
pub struct Header {
    /// [`MAGIC`], written last when the file is initialised.
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_slots: AtomicU32,
    pub slot_size: AtomicU32,
    pub file_size: AtomicU64,
    pub created_unix: AtomicU64,
    /// CLOCK_MONOTONIC (ns) of the last scan for dead processes.
    pub last_scan_ns: AtomicU64,
    pub reserved: [AtomicU64; 10],
}

#[repr(C)]
pub struct DeviceEntry {
    pub state: AtomicU32,
    pub reserved0: AtomicU32,
    /// The device UUID (16 bytes as two little-endian words).
    pub uuid: [AtomicU64; 2],
    /// The ledger's cap for this device in bytes.
    pub cap: AtomicU64,
    /// Bytes held by all processes of the ledger: the sum of the slots' `used`.
    pub used: AtomicU64,
    pub peak: AtomicU64,
    /// Allocations refused because of the cap.
    pub refusals: AtomicU64,
    /// Physical memory of the device.
    pub total_memory: AtomicU64,
    pub registered_unix: AtomicU64,
    /// Last measured size of one CUDA context on this device (0: none measured yet); new
    /// contexts reserve this much before they are created.
    pub context_hint: AtomicU64,
    pub reserved: [AtomicU64; 6],
}

#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    /// PID in the owner's own PID namespace.
    pub pid: AtomicU32,
    /// PID in the host namespace, 0 while unknown.
    pub host_pid: AtomicU32,
    pub reserved0: AtomicU32,
    /// Inode of the owner's PID namespace.
    pub pidns: AtomicU64,
    pub started_unix_ms: AtomicU64,
    pub comm: [AtomicU64; 2],
    pub reserved: [AtomicU64; 2],
    /// Bytes this process holds per ledger device, contexts included.
    pub used: [AtomicU64; MAX_DEVICES],
    /// The part of `used` that is CUDA context memory.
    pub context: [AtomicU64; MAX_DEVICES],
    /// The part of `used` reserved but not handed out yet: this process's credit, which it
    /// spends and refills without touching the device's shared counter (see `Ledger::reserve`).
    pub credit: [AtomicU64; MAX_DEVICES],
}

// The layout is an on-disk format: pin it at compile time.
const _: () = {
    assert!(std::mem::size_of::<Header>() == 128);
    assert!(std::mem::size_of::<DeviceEntry>() == 128);
    assert!(std::mem::size_of::<Slot>() == 448);
    assert!(DEVICES_OFFSET + MAX_DEVICES * std::mem::size_of::<DeviceEntry>() <= SLOTS_OFFSET);
    assert!(FILE_SIZE.is_multiple_of(4096));
    assert!(std::mem::offset_of!(Slot, used) == 64);
    assert!(std::mem::offset_of!(DeviceEntry, used) == 32);
};
