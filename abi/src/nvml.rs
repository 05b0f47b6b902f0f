//! NVML types (`nvml.h`).

use std::ffi::{c_char, c_uint, c_void};

pub type NvmlReturn = u32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Instance IDs reported when MIG is off.
pub const NVML_NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlEventSet_t`: a handle on an opaque set.
pub type NvmlEventSet = *mut c_void;

/// `nvmlEventTypeSingleBitEccError`.
pub const NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`: `eventData` is the XID.
pub const NVML_EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8;

/// `nvmlEventData_t` (r450 and later), what `nvmlEventSetWait_v2` writes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlEventData {
    pub device: NvmlDevice,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

impl Default for NvmlEventData {
    fn default() -> Self {
        NvmlEventData { device: std::ptr::null_mut(), event_type: 0, event_data: 0, gpu_instance_id: 0, compute_instance_id: 0 }
    }
}

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

/// `nvmlProcessDetail_v1_t` (r550+): the same 32 bytes as the wide `_v3` entry.
pub type NvmlProcessDetailV1 = NvmlProcessInfoV3Cc;

/// `nvmlProcessDetailList_v1_t`; `version` must be [`NVML_PROCESS_DETAIL_LIST_V1`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessDetailList {
    pub version: c_uint,
    /// One of `NVML_PROCESS_MODE_*`.
    pub mode: c_uint,
    pub num_proc_array_entries: c_uint,
    pub proc_array: *mut NvmlProcessDetailV1,
}

/// `nvmlProcessDetailList_v1` = sizeof(nvmlProcessDetailList_v1_t) | 1 << 24.
pub const NVML_PROCESS_DETAIL_LIST_V1: c_uint = std::mem::size_of::<NvmlProcessDetailList>() as c_uint | (1 << 24);
pub const NVML_PROCESS_MODE_COMPUTE: c_uint = 0;
pub const NVML_PROCESS_MODE_GRAPHICS: c_uint = 1;
pub const NVML_PROCESS_MODE_MPS: c_uint = 2;

/// `nvmlProcessUtilizationInfo_v1_t` (r550+).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationInfoV1 {
    pub time_stamp: u64,
    pub pid: c_uint,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
    pub jpg_util: c_uint,
    pub ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1_t`; `version` must be
/// [`NVML_PROCESSES_UTILIZATION_INFO_V1`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessesUtilizationInfo {
    pub version: c_uint,
    pub process_samples_count: c_uint,
    pub last_seen_time_stamp: u64,
    pub proc_util_array: *mut NvmlProcessUtilizationInfoV1,
}

/// `nvmlProcessesUtilizationInfo_v1` = sizeof(nvmlProcessesUtilizationInfo_v1_t) | 1 << 24.
pub const NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint = std::mem::size_of::<NvmlProcessesUtilizationInfo>() as c_uint | (1 << 24);

/// `nvmlEncoderSessionInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlEncoderSessionInfo {
    pub session_id: c_uint,
    pub pid: c_uint,
    pub vgpu_instance: c_uint,
    pub codec_type: c_uint,
    pub h_resolution: c_uint,
    pub v_resolution: c_uint,
    pub average_fps: c_uint,
    pub average_latency: c_uint,
}

/// `nvmlFBCSessionInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlFbcSessionInfo {
    pub session_id: c_uint,
    pub pid: c_uint,
    pub vgpu_instance: c_uint,
    pub display_ordinal: c_uint,
    pub session_type: c_uint,
    pub session_flags: c_uint,
    pub h_max_resolution: c_uint,
    pub v_max_resolution: c_uint,
    pub h_resolution: c_uint,
    pub v_resolution: c_uint,
    pub average_fps: c_uint,
    pub average_latency: c_uint,
}

/// `nvmlAccountingStats_v2_t` (r610+): the PID to ask about is its first field, set by the
/// caller (`nvmlDeviceGetAccountingStats_v2(device, stats)` has no PID argument).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlAccountingStatsV2 {
    pub pid: c_uint,
    pub is_running: c_uint,
    pub gpu_utilization: c_uint,
    pub memory_utilization: c_uint,
    pub max_memory_usage: u64,
    pub sample_count: c_uint,
    pub sum_gpu_util: u64,
    pub sum_fb_util: u64,
    pub time: u64,
    pub start_time: u64,
}

/// `nvmlGpuInstance_t`: a GPU instance handle (MIG).
pub type NvmlGpuInstance = *mut c_void;
/// `nvmlComputeInstance_t`: a compute instance handle (MIG).
pub type NvmlComputeInstance = *mut c_void;

pub const NVML_ERROR_IN_USE: NvmlReturn = 19;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlReturn = 23;
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`: the only engine profile.
pub const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0;

/// `nvmlGpuInstancePlacement_t` (and `nvmlComputeInstancePlacement_t`, the same layout):
/// the first memory slice and the number of slices.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct NvmlGpuInstancePlacement {
    pub start: c_uint,
    pub size: c_uint,
}

/// `nvmlGpuInstanceProfileInfo_v2_t`; `version` must be [`NVML_GPU_INSTANCE_PROFILE_INFO_V2`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlGpuInstanceProfileInfoV2 {
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
    pub memory_size_mb: u64,
    pub name: [c_char; 96],
}

/// `nvmlGpuInstanceProfileInfo_v2` = sizeof(nvmlGpuInstanceProfileInfo_v2_t) | 2 << 24.
pub const NVML_GPU_INSTANCE_PROFILE_INFO_V2: c_uint = std::mem::size_of::<NvmlGpuInstanceProfileInfoV2>() as c_uint | (2 << 24);

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlGpuInstanceInfo {
    pub device: NvmlDevice,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: NvmlGpuInstancePlacement,
}

/// `nvmlComputeInstanceProfileInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlComputeInstanceProfileInfo {
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

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlComputeInstanceInfo {
    pub device: NvmlDevice,
    pub gpu_instance: NvmlGpuInstance,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: NvmlGpuInstancePlacement,
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
    assert!(size_of::<NvmlProcessDetailV1>() == 32);
    assert!(offset_of!(NvmlProcessDetailV1, used_cc_protected_memory) == 24);
    assert!(size_of::<NvmlProcessDetailList>() == 24);
    assert!(offset_of!(NvmlProcessDetailList, proc_array) == 16);
    assert!(NVML_PROCESS_DETAIL_LIST_V1 == 0x0100_0018);
    assert!(size_of::<NvmlProcessUtilizationInfoV1>() == 40);
    assert!(offset_of!(NvmlProcessUtilizationInfoV1, pid) == 8);
    assert!(size_of::<NvmlProcessesUtilizationInfo>() == 24);
    assert!(offset_of!(NvmlProcessesUtilizationInfo, proc_util_array) == 16);
    assert!(NVML_PROCESSES_UTILIZATION_INFO_V1 == 0x0100_0018);
    assert!(size_of::<NvmlEncoderSessionInfo>() == 32);
    assert!(offset_of!(NvmlEncoderSessionInfo, pid) == 4);
    assert!(size_of::<NvmlFbcSessionInfo>() == 48);
    assert!(offset_of!(NvmlFbcSessionInfo, pid) == 4);
    assert!(size_of::<NvmlEventData>() == 32);
    assert!(offset_of!(NvmlEventData, gpu_instance_id) == 24);
    assert!(size_of::<NvmlAccountingStatsV2>() == 64);
    assert!(offset_of!(NvmlAccountingStatsV2, pid) == 0);
    assert!(offset_of!(NvmlAccountingStatsV2, sum_gpu_util) == 32);
    assert!(size_of::<NvmlGpuInstanceProfileInfoV2>() == 152);
    assert!(offset_of!(NvmlGpuInstanceProfileInfoV2, memory_size_mb) == 48);
    assert!(size_of::<NvmlGpuInstanceInfo>() == 24);
    assert!(size_of::<NvmlComputeInstanceProfileInfo>() == 36);
    assert!(size_of::<NvmlComputeInstanceInfo>() == 32);
};
