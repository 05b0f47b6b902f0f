//! NVML types (`nvml.h`).

use std::ffi::{c_uint, c_void};

pub type NvmlReturn = u32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Instance IDs reported when MIG is off.
pub const NVML_NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`; `version` must be [`NVML_MEMORY_V2`].
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2` = sizeof(nvmlMemory_v2_t) | 2 << 24.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t`, also the layout of `nvmlProcessInfo_t` used by the `_v3` calls.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_t` as drivers 535.43 to 535.86 wrote it for the `_v3` calls.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfoV3Cc {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
    pub used_cc_protected_memory: u64,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<NvmlMemory>() == 24);
    assert!(size_of::<NvmlMemoryV2>() == 40);
    assert!(NVML_MEMORY_V2 == 0x0200_0028);
    assert!(offset_of!(NvmlMemoryV2, total) == 8);
    assert!(size_of::<NvmlProcessInfoV1>() == 16);
    assert!(size_of::<NvmlProcessInfoV2>() == 24);
    assert!(size_of::<NvmlProcessInfoV3Cc>() == 32);
    assert!(size_of::<NvmlProcessUtilizationSample>() == 32);
};
