//! Where everything lies in the state file, and its limits: devices, process slots, the
//! MIG records and the timelines, and the lock bytes.

use crate::{mig, timeline};

/// Most simulated devices.
pub const MAX_DEVICES: usize = 8;
/// Size of the process table.
pub const MAX_PROCESSES: usize = 1024;
/// State file used when `FGPU_SIM_STATE` is unset.
pub const DEFAULT_PATH: &str = "/tmp/fgpu-sim-state";
/// Device memory the simulated driver keeps for itself on every device, never usable by
/// processes: NVML's `nvmlMemory_v2_t.reserved`, and part of `used` in `nvmlMemory_t`.
pub const DRIVER_RESERVED: u64 = 32 << 20;
/// Inode number of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel).
pub const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"FGPUSIM1");
pub(crate) const LAYOUT_VERSION: u32 = 4;
pub(crate) const HEADER_SIZE: usize = 256;
pub(crate) const DEVICE_SIZE: usize = 256;
pub(crate) const SLOT_SIZE: usize = 256;
pub(crate) const DEVICES_OFF: usize = HEADER_SIZE;
pub(crate) const SLOTS_OFF: usize = 4096;
/// Where each GPU's MIG record starts (see [`mig`]).
pub(crate) const MIG_OFF: usize = SLOTS_OFF + MAX_PROCESSES * SLOT_SIZE;
/// Where the timelines start (see [`timeline`]): one per GPU and one per compute instance
/// lane ([`mig::LANES`] per GPU, [`timeline_index`]).
pub(crate) const TIMELINE_OFF: usize = (MIG_OFF + MAX_DEVICES * mig::MIG_REC_SIZE).div_ceil(4096) * 4096;
/// Timelines in the state file.
pub const MAX_TIMELINES: usize = MAX_DEVICES * mig::LANES;
/// Total size of the state file (sparse: a timeline's pages are touched only when its
/// device runs work).
pub const FILE_SIZE: usize = TIMELINE_OFF + MAX_TIMELINES * timeline::DEVICE_TIMELINE_SIZE;
/// How long a process of a nested PID namespace waits at registration for its host PID
/// while a watcher runs ([`SimState::register`]).
pub const HOST_PID_WAIT_NS: u64 = 2_000_000_000;
/// A watcher that looked this recently runs ([`SimState::watch_host_pids`]).
pub(crate) const WATCH_FRESH_NS: u64 = 200_000_000;
/// Byte locked (blocking) while a process creates or checks the file.
pub(crate) const INIT_LOCK_BYTE: i64 = 8;

pub(crate) const ST_FREE: u64 = 0;
pub(crate) const ST_CLAIMING: u64 = 1;
pub(crate) const ST_LIVE: u64 = 2;
pub(crate) const ST_RECLAIMING: u64 = 3;
