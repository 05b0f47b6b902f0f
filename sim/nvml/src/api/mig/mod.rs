//! Multi-Instance GPU management (nvml.h, "Multi Instance GPU Management"): MIG mode, GPU
//! and compute instance profiles, placements, capacity, creation and destruction, and the
//! instance handles, over the shared MIG state of `fgpu_sim_state::mig`.

use crate::boundary::*;
use fgpu_sim_state::{ComputeInstance, GpuInstance, MigError, SimState};
use std::ffi::{c_char, c_uint, c_ulonglong};

/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
const NAME_V2: usize = 96;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub(crate) const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0;

pub type NvmlGpuInstance = *const u64;
pub type NvmlComputeInstance = *const u64;

/// `nvmlGpuInstancePlacement_t` (memory slices).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GpuInstancePlacement {
    pub start: c_uint,
    pub size: c_uint,
}

/// `nvmlComputeInstancePlacement_t` (compute slices of the GPU instance).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ComputeInstancePlacement {
    pub start: c_uint,
    pub size: c_uint,
}

/// `nvmlGpuInstanceProfileInfo_t`.
#[repr(C)]
pub struct GpuInstanceProfileInfo {
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
}

/// `nvmlGpuInstanceProfileInfo_v2_t`.
#[repr(C)]
pub struct GpuInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; NAME_V2],
}

/// `nvmlGpuInstanceProfileInfo_v3_t` (no `isP2pSupported`; `capabilities` at the end).
#[repr(C)]
pub struct GpuInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; NAME_V2],
    pub capabilities: c_uint,
}

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
pub struct GpuInstanceInfo {
    pub device: NvmlDevice,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: GpuInstancePlacement,
}

/// `nvmlComputeInstanceProfileInfo_t`.
#[repr(C)]
pub struct ComputeInstanceProfileInfo {
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
}

/// `nvmlComputeInstanceProfileInfo_v2_t`.
#[repr(C)]
pub struct ComputeInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; NAME_V2],
}

/// `nvmlComputeInstanceProfileInfo_v3_t` (v2's members and `capabilities`).
#[repr(C)]
pub struct ComputeInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; NAME_V2],
    pub capabilities: c_uint,
}

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
pub struct ComputeInstanceInfo {
    pub device: NvmlDevice,
    pub gpu_instance: NvmlGpuInstance,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: ComputeInstancePlacement,
}

/// `NVML_STRUCT_VERSION(data, ver)`: the struct's size and the version in the top byte.
const fn version(size: usize, v: u32) -> c_uint {
    size as c_uint | (v << 24)
}
pub(crate) const GI_PROFILE_INFO_V2: c_uint = version(std::mem::size_of::<GpuInstanceProfileInfoV2>(), 2);
pub(crate) const GI_PROFILE_INFO_V3: c_uint = version(std::mem::size_of::<GpuInstanceProfileInfoV3>(), 3);
pub(crate) const CI_PROFILE_INFO_V2: c_uint = version(std::mem::size_of::<ComputeInstanceProfileInfoV2>(), 2);
pub(crate) const CI_PROFILE_INFO_V3: c_uint = version(std::mem::size_of::<ComputeInstanceProfileInfoV3>(), 3);

/// GPU instance handles: the address of the word of (GPU, GPU instance ID).
static GI_HANDLES: [[u64; GI_IDS]; fgpu_sim_state::MAX_DEVICES] = [[0; GI_IDS]; fgpu_sim_state::MAX_DEVICES];
/// Compute instance handles: the address of the word of (GPU, GPU instance ID, ID).
static CI_HANDLES: [[[u64; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES] = [[[0; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES];

fn gi_handle(g: &GpuInstance) -> NvmlGpuInstance {
    &GI_HANDLES[g.device][g.id as usize] as *const u64
}

fn ci_handle(c: &ComputeInstance) -> NvmlComputeInstance {
    &CI_HANDLES[c.device][c.gpu_instance as usize][c.id as usize] as *const u64
}

/// The NVML code of a MIG error.
pub(crate) fn code(e: MigError) -> NvmlReturn {
    match e {
        MigError::NotSupported => NVML_ERROR_NOT_SUPPORTED,
        MigError::InvalidArgument => NVML_ERROR_INVALID_ARGUMENT,
        MigError::InsufficientResources => NVML_ERROR_INSUFFICIENT_RESOURCES,
        MigError::InUse => NVML_ERROR_IN_USE,
        MigError::NotFound => NVML_ERROR_NOT_FOUND,
        MigError::ResetRequired => NVML_ERROR_RESET_REQUIRED,
    }
}

macro_rules! mig {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return code(e),
        }
    };
}

/// The GPU instance behind a handle (it must still exist).
fn gi_of(h: NvmlGpuInstance) -> Result<(SimState, GpuInstance), NvmlReturn> {
    let s = ready()?;
    let k = word_index(h as usize, GI_HANDLES.as_ptr() as *const u64, fgpu_sim_state::MAX_DEVICES * GI_IDS).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    present(&s, k / GI_IDS)?;
    let g = s.gpu_instance(k / GI_IDS, (k % GI_IDS) as u32).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((s, g))
}

/// The compute instance behind a handle (it must still exist).
fn ci_of(h: NvmlComputeInstance) -> Result<(SimState, GpuInstance, ComputeInstance), NvmlReturn> {
    let s = ready()?;
    let k = word_index(h as usize, CI_HANDLES.as_ptr() as *const u64, fgpu_sim_state::MAX_DEVICES * GI_IDS * CI_IDS).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let (d, gi, ci) = (k / (GI_IDS * CI_IDS), ((k / CI_IDS) % GI_IDS) as u32, (k % CI_IDS) as u32);
    present(&s, d)?;
    let g = s.gpu_instance(d, gi).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    let c = s.compute_instances(d, gi).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?.into_iter().find(|c| c.id == ci).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((s, g, c))
}

/// Whether the caller may create and destroy instances: root, or read access to the
/// simulator's `mig/config` capability file (as to `/proc/driver/nvidia/capabilities/mig/config`).
fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let path = fgpu_sim_state::mig_config_capability_path(&SimState::default_path());
    let Ok(c) = std::ffi::CString::new(path.into_os_string().into_encoded_bytes()) else { return false };
    // SAFETY: c is a NUL-terminated path; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::R_OK, libc::AT_EACCESS) == 0 }
}

fn name_field(name: &str) -> [c_char; NAME_V2] {
    let mut out = [0 as c_char; NAME_V2];
    for (k, b) in name.bytes().take(NAME_V2 - 1).enumerate() {
        out[k] = b as c_char;
    }
    out
}

mod compute_instances;
mod gpu_instances;
