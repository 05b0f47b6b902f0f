//! MIG: each GPU's mode, its GPU instances and their compute instances, kept in the state
//! file so that every process sees the same instances, and the MIG devices (one per
//! compute instance) that CUDA and NVML present.
//!
//! - The mode ([`SimState::mig_mode`], [`SimState::set_mig_mode`]): Hopper changes it at
//!   once when no process holds the GPU and forgets it at a reboot (a new state file);
//!   Ampere needs a GPU reset, so a change is pending until [`SimState::reset_gpu`] (or a
//!   new state file, which starts from the mode `FGPU_SIM_MIG` gives, as the InfoROM keeps
//!   it). Either answers `IN_USE` while processes hold the GPU.
//! - GPU instances take memory slices at the placements of their profile
//!   (`profiles.rs`), named by the driver's partition ID (`placement.rs`); compute
//!   instances take compute slices of their GPU instance. Creation and destruction are
//!   atomic across processes (an `fcntl` lock per GPU, which the kernel drops when its
//!   holder dies; every change is published by one store).
//! - A process sees at most one MIG device (CUDA enumerates one compute instance): it is
//!   bound to it at `cuInit` ([`SimState::bind_mig_device`]), its memory then counts
//!   against the GPU instance's, and its kernels run on the compute instance's own
//!   timeline ([`MigDevice::timeline`]). A bound process keeps its compute instance from
//!   being destroyed (`IN_USE`).

mod devices;
mod instances;
pub mod placement;
pub mod profiles;

use placement::GI_IDS;
pub use profiles::*;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Compute instances one GPU instance can hold (IDs 0..8; at most 7 exist at once).
const CI_IDS: usize = 8;
/// Timelines per GPU: lane 0 runs the whole GPU, lanes 1..=7 its compute instances.
pub const LANES: usize = 8;
/// `nvmlDeviceGetMaxMigDeviceCount` of a MIG-enabled GPU of these products.
pub const MAX_MIG_DEVICES: u32 = 7;
/// First byte locked (blocking) by a process changing or reading GPU `d`'s instances:
/// `MIG_LOCK_BYTE + d` (inside the header).
pub(crate) const MIG_LOCK_BYTE: i64 = 192;

/// Why a MIG call was refused; the NVML library turns these into `nvmlReturn_t` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigError {
    /// The product has no MIG, or MIG is not enabled (`NVML_ERROR_NOT_SUPPORTED`).
    NotSupported,
    /// No such profile, placement or instance ID (`NVML_ERROR_INVALID_ARGUMENT`).
    InvalidArgument,
    /// No free placement, or the placement asked for is taken
    /// (`NVML_ERROR_INSUFFICIENT_RESOURCES`).
    InsufficientResources,
    /// Processes (or compute instances) use it (`NVML_ERROR_IN_USE`).
    InUse,
    /// No instance of that ID (`NVML_ERROR_NOT_FOUND`).
    NotFound,
    /// The change waits for a GPU reset (`NVML_ERROR_RESET_REQUIRED`).
    ResetRequired,
}

#[repr(C)]
struct CiRec {
    live: AtomicU32,
    profile: AtomicU32,
    start: AtomicU32,
    size: AtomicU32,
    serial: AtomicU32,
    lane: AtomicU32,
    uuid: [AtomicU32; 4],
}

#[repr(C)]
struct GiRec {
    live: AtomicU32,
    profile: AtomicU32,
    start: AtomicU32,
    size: AtomicU32,
    /// Bytes the processes bound to its compute instances hold (the allocation counter).
    used: AtomicU64,
    cis: [CiRec; CI_IDS],
}

/// One GPU's MIG state in the state file.
#[repr(C)]
pub(crate) struct MigRec {
    current: AtomicU32,
    pending: AtomicU32,
    /// Compute instances created on this GPU so far (each one's serial, for its UUID).
    created: AtomicU32,
    _pad: u32,
    gis: [GiRec; GI_IDS],
}

/// Bytes of one GPU's MIG record in the state file.
pub(crate) const MIG_REC_SIZE: usize = std::mem::size_of::<MigRec>().div_ceil(64) * 64;

/// A GPU instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    /// The GPU's index.
    pub device: usize,
    /// Its ID (`nvmlGpuInstanceInfo_t.id`, unique on the GPU).
    pub id: u32,
    pub profile: GiProfile,
    /// Placement: first memory slice and number of memory slices.
    pub start: u32,
    pub size: u32,
}

/// A compute instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeInstance {
    pub device: usize,
    /// Its GPU instance's ID.
    pub gpu_instance: u32,
    /// Its ID (unique in its GPU instance).
    pub id: u32,
    pub profile: CiProfile,
    /// Placement: first compute slice of the GPU instance, and compute slices.
    pub start: u32,
    pub size: u32,
    /// Which compute instance of the GPU this is, in creation order (from 1).
    pub serial: u32,
    /// The MIG device's UUID bytes (new at each creation).
    pub uuid: [u8; 16],
    /// Its timeline lane (1..[`LANES`]).
    pub lane: u32,
}

/// A MIG device: a compute instance as CUDA and NVML present it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// The parent GPU's index.
    pub device: usize,
    /// Its index among the parent's MIG devices (by GPU instance ID, then compute instance
    /// ID), as `nvmlDeviceGetMigDeviceHandleByIndex` and `nvidia-smi -L` number them.
    pub index: u32,
    pub gpu_instance: GpuInstance,
    pub compute_instance: ComputeInstance,
}

impl MigDevice {
    /// The profile name as CUDA and NVML give it after "MIG ": `3g.40gb`, or `1c.3g.40gb`
    /// for a compute instance smaller than its GPU instance.
    pub fn profile_name(&self) -> &str {
        &self.compute_instance.profile.name
    }
    /// Its memory: the GPU instance's, shared by its compute instances.
    pub fn memory(&self) -> u64 {
        self.gpu_instance.profile.memory_bytes()
    }
    /// Multiprocessors of the compute instance.
    pub fn sms(&self) -> u32 {
        self.compute_instance.profile.sms
    }
    /// The binding a process records for it.
    fn binding(&self) -> u32 {
        binding(self.gpu_instance.id, self.compute_instance.id)
    }
}

/// What a bound process records per GPU: `0x8000_0000 | gi << 8 | ci`, 0 when unbound.
fn binding(gi: u32, ci: u32) -> u32 {
    0x8000_0000 | (gi << 8) | ci
}

/// (GPU instance, compute instance) of a recorded binding.
pub(crate) fn unbinding(b: u32) -> Option<(u32, u32)> {
    (b & 0x8000_0000 != 0).then_some(((b >> 8) & 0xFF, b & 0xFF))
}

#[cfg(test)]
mod tests;
