//! CUDA driver API types (`cuda.h`, CUDA 11.x to 13.x).

use std::ffi::{c_uint, c_void};

pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
/// 32-bit device pointer of the pre-3.2 (`_v1`) entry points.
pub type CUdeviceptrV1 = u32;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUgraphExec = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUlibrary = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;

/// `CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
/// `CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
/// `CUevent_flags::CU_EVENT_DEFAULT` (timing enabled, spin on synchronisation: fgpu only
/// queries its events, never waits on them).
pub const CU_EVENT_DEFAULT: u32 = 0;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// `CUmemPool_attribute` values.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u32 = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;

/// `CUgraphMem_attribute` values.
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: u32 = 0;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: u32 = 2;
/// `CUgraphNodeType` values: a child graph, a memory allocation, a conditional.
pub const CU_GRAPH_NODE_TYPE_GRAPH: u32 = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: u32 = 10;
pub const CU_GRAPH_NODE_TYPE_CONDITIONAL: u32 = 13;
/// `CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;

/// `CUdriverProcAddress_flags`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub kind: u32,
    pub id: i32,
}

/// `CUmemAllocationProp` (the part before `allocFlags` is what fgpu reads).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub kind: u32,
    pub requested_handle_types: u32,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`: `size_t` extents).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (`unsigned int` extents).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaArrayDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: u32,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaArray3dDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: u32,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CudaArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// `CUarray_format` values whose channel size fgpu knows.
pub const CU_AD_FORMAT_UNSIGNED_INT8: u32 = 0x01;
pub const CU_AD_FORMAT_UNSIGNED_INT16: u32 = 0x02;
pub const CU_AD_FORMAT_UNSIGNED_INT32: u32 = 0x03;
pub const CU_AD_FORMAT_SIGNED_INT8: u32 = 0x08;
pub const CU_AD_FORMAT_SIGNED_INT16: u32 = 0x09;
pub const CU_AD_FORMAT_SIGNED_INT32: u32 = 0x0a;
pub const CU_AD_FORMAT_HALF: u32 = 0x10;
pub const CU_AD_FORMAT_FLOAT: u32 = 0x20;

/// Bytes per channel of a `CUarray_format`; unknown formats count as 4 (the common case).
pub fn array_format_bytes(format: u32) -> u64 {
    match format {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => 1,
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => 2,
        CU_AD_FORMAT_UNSIGNED_INT32 | CU_AD_FORMAT_SIGNED_INT32 | CU_AD_FORMAT_FLOAT => 4,
        _ => 4,
    }
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CUuuid>() == 16);
    assert!(size_of::<CUmemLocation>() == 8);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(offset_of!(CUmemAllocationProp, location) == 8);
    assert!(offset_of!(CUmemAllocationProp, compression_type) == 24);
    assert!(size_of::<CudaArrayDescriptor>() == 24);
    assert!(size_of::<CudaArrayDescriptorV1>() == 16);
    assert!(size_of::<CudaArray3dDescriptor>() == 40);
    assert!(size_of::<CudaArray3dDescriptorV1>() == 24);
    assert!(size_of::<CudaArrayMemoryRequirements>() == 32);
};

/// `CUmemPoolProps` (cuda.h, CUDA 13 layout: 88 bytes; CUDA 12 has `reserved[54]` where
/// CUDA 13 has `gpuDirectRDMACapable` and `reserved[53]`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub gpu_direct_rdma_capable: u8,
    pub reserved: [u8; 53],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`; `_v2` is the same struct).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaMemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

impl Default for CudaMemAllocNodeParams {
    fn default() -> Self {
        // SAFETY: a plain C struct of integers and pointers, for which all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `CUlaunchConfig` (11.8+): fgpu reads `hStream`.
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (12.0+).
#[repr(C)]
pub struct CudaGraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub error_node_out: CUgraphNode,
    pub result_out: i32,
}

const _: () = {
    assert!(std::mem::size_of::<CUmemPoolProps>() == 88);
    assert!(std::mem::size_of::<CudaMemAllocNodeParams>() == 120);
    assert!(std::mem::offset_of!(CudaMemAllocNodeParams, bytesize) == 104);
    assert!(std::mem::offset_of!(CudaMemAllocNodeParams, dptr) == 112);
    assert!(std::mem::size_of::<CudaGraphInstantiateParams>() == 32);
    assert!(std::mem::offset_of!(CudaGraphInstantiateParams, result_out) == 24);
    assert!(std::mem::size_of::<CUlaunchConfig>() == 56);
    assert!(std::mem::offset_of!(CUlaunchConfig, h_stream) == 32);
};
