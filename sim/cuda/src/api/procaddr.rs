//! cuGetProcAddress(_v2): base name + CUDA version + flags -> one of this library's own
//! entry points, the way the real driver resolves them (never through dlsym); and
//! cuGetExportTable, which has no table to give.
//!
//! For a base name the table lists each exported variant with the CUDA version that
//! introduced it. The answer is the newest variant introduced at or before the requested
//! version; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM a `_ptds`/`_ptsz` variant
//! is preferred where one exists. CU_GET_PROC_ADDRESS_DEFAULT (0) means the legacy
//! default stream: the driver cannot see the caller's CUDA_API_PER_THREAD_DEFAULT_STREAM
//! macro, which only selects the flag at compile time.

use super::{
    array::*, capture::*, context::*, copy::*, device::*, error_strings::*, graph::*, graph_nodes::*, graph_pool::*, launch::*, memory::*, module::*, pool::*,
    stream::*, vmm::*,
};
use crate::boundary::*;
use crate::driver;
use crate::errors::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

pub const CU_GET_PROC_ADDRESS_SUCCESS: c_uint = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_uint = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_uint = 2;

/// The real runtime needs private export tables the simulator does not have.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const [u8; 16]) -> CUresult {
    guard(|| {
        put(table, std::ptr::null());
        CUDA_ERROR_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CUresult {
    guard(|| get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_uint) -> CUresult {
    guard(|| get_proc_address(symbol, pfn, cuda_version, flags, status))
}

pub struct Entry {
    pub base: &'static str,
    pub version: c_int,
    pub per_thread: bool,
    pub name: &'static str,
    pub ptr: usize,
}

macro_rules! entries {
    ($( $base:literal : $( $ver:literal $(ptds $pt:tt)? => $f:ident ),+ ;)*) => {
        vec![ $( $( Entry {
            base: $base,
            version: $ver,
            per_thread: entries!(@pt $($pt)?),
            name: stringify!($f),
            ptr: $f as *const () as usize,
        }, )+ )* ]
    };
    (@pt) => { false };
    (@pt $x:tt) => { true };
}

pub fn table() -> &'static [Entry] {
    static T: OnceLock<Vec<Entry>> = OnceLock::new();
    T.get_or_init(|| {
        entries! {
            "cuInit": 2000 => cuInit;
            "cuDriverGetVersion": 2020 => cuDriverGetVersion;
            "cuDeviceGet": 2000 => cuDeviceGet;
            "cuDeviceGetCount": 2000 => cuDeviceGetCount;
            "cuDeviceGetName": 2000 => cuDeviceGetName;
            "cuDeviceGetUuid": 9020 => cuDeviceGetUuid, 11040 => cuDeviceGetUuid_v2;
            "cuDeviceTotalMem": 2000 => cuDeviceTotalMem, 3020 => cuDeviceTotalMem_v2;
            "cuDeviceGetAttribute": 2000 => cuDeviceGetAttribute;
            "cuDeviceComputeCapability": 2000 => cuDeviceComputeCapability;
            "cuDeviceGetPCIBusId": 4010 => cuDeviceGetPCIBusId;
            "cuDeviceGetByPCIBusId": 4010 => cuDeviceGetByPCIBusId;
            "cuCtxCreate": 2000 => cuCtxCreate, 3020 => cuCtxCreate_v2, 11040 => cuCtxCreate_v3, 12050 => cuCtxCreate_v4;
            "cuCtxDestroy": 2000 => cuCtxDestroy, 4000 => cuCtxDestroy_v2;
            "cuCtxGetCurrent": 4000 => cuCtxGetCurrent;
            "cuCtxSetCurrent": 4000 => cuCtxSetCurrent;
            "cuCtxPushCurrent": 2000 => cuCtxPushCurrent, 4000 => cuCtxPushCurrent_v2;
            "cuCtxPopCurrent": 2000 => cuCtxPopCurrent, 4000 => cuCtxPopCurrent_v2;
            "cuCtxGetDevice": 2000 => cuCtxGetDevice;
            "cuCtxGetFlags": 7000 => cuCtxGetFlags;
            "cuCtxSynchronize": 2000 => cuCtxSynchronize;
            "cuCtxGetStreamPriorityRange": 5050 => cuCtxGetStreamPriorityRange;
            "cuDevicePrimaryCtxRetain": 7000 => cuDevicePrimaryCtxRetain;
            "cuDevicePrimaryCtxRelease": 7000 => cuDevicePrimaryCtxRelease, 11000 => cuDevicePrimaryCtxRelease_v2;
            "cuDevicePrimaryCtxReset": 7000 => cuDevicePrimaryCtxReset, 11000 => cuDevicePrimaryCtxReset_v2;
            "cuDevicePrimaryCtxSetFlags": 7000 => cuDevicePrimaryCtxSetFlags, 11000 => cuDevicePrimaryCtxSetFlags_v2;
            "cuDevicePrimaryCtxGetState": 7000 => cuDevicePrimaryCtxGetState;
            "cuMemAlloc": 2000 => cuMemAlloc, 3020 => cuMemAlloc_v2;
            "cuMemAllocPitch": 2000 => cuMemAllocPitch, 3020 => cuMemAllocPitch_v2;
            "cuMemFree": 2000 => cuMemFree, 3020 => cuMemFree_v2;
            "cuMemGetInfo": 2000 => cuMemGetInfo, 3020 => cuMemGetInfo_v2;
            "cuMemGetAddressRange": 2000 => cuMemGetAddressRange, 3020 => cuMemGetAddressRange_v2;
            "cuMemAllocManaged": 6000 => cuMemAllocManaged;
            "cuMemAllocHost": 2000 => cuMemAllocHost, 3020 => cuMemAllocHost_v2;
            "cuMemHostAlloc": 2020 => cuMemHostAlloc;
            "cuMemFreeHost": 2000 => cuMemFreeHost;
            "cuMemcpyHtoD": 2000 => cuMemcpyHtoD, 3020 => cuMemcpyHtoD_v2, 7000 ptds x => cuMemcpyHtoD_v2_ptds;
            "cuMemcpyDtoH": 2000 => cuMemcpyDtoH, 3020 => cuMemcpyDtoH_v2, 7000 ptds x => cuMemcpyDtoH_v2_ptds;
            "cuMemcpyDtoD": 3020 => cuMemcpyDtoD_v2, 7000 ptds x => cuMemcpyDtoD_v2_ptds;
            "cuMemcpyHtoDAsync": 3020 => cuMemcpyHtoDAsync_v2, 7000 ptds x => cuMemcpyHtoDAsync_v2_ptsz;
            "cuMemcpyDtoHAsync": 3020 => cuMemcpyDtoHAsync_v2, 7000 ptds x => cuMemcpyDtoHAsync_v2_ptsz;
            "cuMemsetD8": 2000 => cuMemsetD8, 3020 => cuMemsetD8_v2, 7000 ptds x => cuMemsetD8_v2_ptds;
            "cuMemsetD32": 3020 => cuMemsetD32_v2, 7000 ptds x => cuMemsetD32_v2_ptds;
            "cuMemsetD8Async": 3020 => cuMemsetD8Async, 7000 ptds x => cuMemsetD8Async_ptsz;
            "cuStreamCreate": 2000 => cuStreamCreate;
            "cuStreamCreateWithPriority": 5050 => cuStreamCreateWithPriority;
            "cuStreamDestroy": 2000 => cuStreamDestroy, 4000 => cuStreamDestroy_v2;
            "cuStreamSynchronize": 2000 => cuStreamSynchronize, 7000 ptds x => cuStreamSynchronize_ptsz;
            "cuStreamQuery": 2000 => cuStreamQuery, 7000 ptds x => cuStreamQuery_ptsz;
            "cuStreamWaitEvent": 3020 => cuStreamWaitEvent, 7000 ptds x => cuStreamWaitEvent_ptsz;
            "cuEventCreate": 2000 => cuEventCreate;
            "cuEventRecord": 2000 => cuEventRecord, 7000 ptds x => cuEventRecord_ptsz;
            "cuEventRecordWithFlags": 11010 => cuEventRecordWithFlags, 11010 ptds x => cuEventRecordWithFlags_ptsz;
            "cuEventSynchronize": 2000 => cuEventSynchronize;
            "cuEventQuery": 2000 => cuEventQuery;
            "cuEventElapsedTime": 2000 => cuEventElapsedTime, 12080 => cuEventElapsedTime_v2;
            "cuEventDestroy": 2000 => cuEventDestroy, 4000 => cuEventDestroy_v2;
            "cuDeviceGetDefaultMemPool": 11020 => cuDeviceGetDefaultMemPool;
            "cuDeviceGetMemPool": 11020 => cuDeviceGetMemPool;
            "cuDeviceSetMemPool": 11020 => cuDeviceSetMemPool;
            "cuMemPoolCreate": 11020 => cuMemPoolCreate;
            "cuMemPoolDestroy": 11020 => cuMemPoolDestroy;
            "cuMemPoolSetAttribute": 11020 => cuMemPoolSetAttribute;
            "cuMemPoolGetAttribute": 11020 => cuMemPoolGetAttribute;
            "cuMemPoolTrimTo": 11020 => cuMemPoolTrimTo;
            "cuGraphCreate": 10000 => cuGraphCreate;
            "cuModuleLoad": 2000 => cuModuleLoad;
            "cuModuleLoadData": 2000 => cuModuleLoadData;
            "cuModuleLoadDataEx": 2010 => cuModuleLoadDataEx;
            "cuModuleLoadFatBinary": 2000 => cuModuleLoadFatBinary;
            "cuModuleUnload": 2000 => cuModuleUnload;
            "cuModuleGetFunction": 2000 => cuModuleGetFunction;
            "cuFuncGetModule": 11000 => cuFuncGetModule;
            "cuFuncGetName": 12030 => cuFuncGetName;
            "cuLibraryLoadData": 12000 => cuLibraryLoadData;
            "cuLibraryLoadFromFile": 12000 => cuLibraryLoadFromFile;
            "cuLibraryUnload": 12000 => cuLibraryUnload;
            "cuLibraryGetKernel": 12000 => cuLibraryGetKernel;
            "cuLibraryGetModule": 12000 => cuLibraryGetModule;
            "cuKernelGetFunction": 12000 => cuKernelGetFunction;
            "cuLaunchKernel": 4000 => cuLaunchKernel, 7000 ptds x => cuLaunchKernel_ptsz;
            "cuLaunchKernelEx": 11060 => cuLaunchKernelEx, 11060 ptds x => cuLaunchKernelEx_ptsz;
            "cuLaunchCooperativeKernel": 9000 => cuLaunchCooperativeKernel, 9000 ptds x => cuLaunchCooperativeKernel_ptsz;
            "cuGraphAddKernelNode": 10000 => cuGraphAddKernelNode, 12000 => cuGraphAddKernelNode_v2;
            "cuStreamBeginCapture": 10000 => cuStreamBeginCapture, 10010 => cuStreamBeginCapture_v2, 10000 ptds x => cuStreamBeginCapture_ptsz, 10010 ptds x => cuStreamBeginCapture_v2_ptsz;
            "cuStreamEndCapture": 10000 => cuStreamEndCapture, 10000 ptds x => cuStreamEndCapture_ptsz;
            "cuStreamIsCapturing": 10000 => cuStreamIsCapturing, 10000 ptds x => cuStreamIsCapturing_ptsz;
            "cuStreamGetCaptureInfo": 11030 => cuStreamGetCaptureInfo_v2, 12030 => cuStreamGetCaptureInfo_v3, 11030 ptds x => cuStreamGetCaptureInfo_v2_ptsz, 12030 ptds x => cuStreamGetCaptureInfo_v3_ptsz;
            "cuGraphDestroy": 10000 => cuGraphDestroy;
            "cuGraphAddMemAllocNode": 11040 => cuGraphAddMemAllocNode;
            "cuGraphAddMemFreeNode": 11040 => cuGraphAddMemFreeNode;
            "cuGraphInstantiate": 10000 => cuGraphInstantiate, 11000 => cuGraphInstantiate_v2, 12000 => cuGraphInstantiateWithFlags;
            "cuGraphInstantiateWithFlags": 11040 => cuGraphInstantiateWithFlags;
            "cuGraphInstantiateWithParams": 12000 => cuGraphInstantiateWithParams, 12000 ptds x => cuGraphInstantiateWithParams_ptsz;
            "cuGraphExecDestroy": 10000 => cuGraphExecDestroy;
            "cuGraphGetNodes": 10000 => cuGraphGetNodes;
            "cuGraphAddChildGraphNode": 10000 => cuGraphAddChildGraphNode;
            "cuGraphNodeGetType": 10000 => cuGraphNodeGetType;
            "cuGraphMemAllocNodeGetParams": 11040 => cuGraphMemAllocNodeGetParams;
            "cuGraphLaunch": 10000 => cuGraphLaunch, 10000 ptds x => cuGraphLaunch_ptsz;
            "cuGraphUpload": 11010 => cuGraphUpload, 11010 ptds x => cuGraphUpload_ptsz;
            "cuDeviceGetGraphMemAttribute": 11040 => cuDeviceGetGraphMemAttribute;
            "cuDeviceSetGraphMemAttribute": 11040 => cuDeviceSetGraphMemAttribute;
            "cuDeviceGraphMemTrim": 11040 => cuDeviceGraphMemTrim;
            "cuMemAllocAsync": 11020 => cuMemAllocAsync, 11020 ptds x => cuMemAllocAsync_ptsz;
            "cuMemAllocFromPoolAsync": 11020 => cuMemAllocFromPoolAsync, 11020 ptds x => cuMemAllocFromPoolAsync_ptsz;
            "cuMemFreeAsync": 11020 => cuMemFreeAsync, 11020 ptds x => cuMemFreeAsync_ptsz;
            "cuMemGetAllocationGranularity": 10020 => cuMemGetAllocationGranularity;
            "cuMemCreate": 10020 => cuMemCreate;
            "cuMemRelease": 10020 => cuMemRelease;
            "cuMemAddressReserve": 10020 => cuMemAddressReserve;
            "cuMemAddressFree": 10020 => cuMemAddressFree;
            "cuMemMap": 10020 => cuMemMap;
            "cuMemUnmap": 10020 => cuMemUnmap;
            "cuMemSetAccess": 10020 => cuMemSetAccess;
            "cuArrayCreate": 2000 => cuArrayCreate, 3020 => cuArrayCreate_v2;
            "cuArray3DCreate": 2000 => cuArray3DCreate, 3020 => cuArray3DCreate_v2;
            "cuArrayDestroy": 2000 => cuArrayDestroy;
            "cuMipmappedArrayCreate": 5000 => cuMipmappedArrayCreate;
            "cuMipmappedArrayDestroy": 5000 => cuMipmappedArrayDestroy;
            "cuArrayGetMemoryRequirements": 11060 => cuArrayGetMemoryRequirements;
            "cuMipmappedArrayGetMemoryRequirements": 11060 => cuMipmappedArrayGetMemoryRequirements;
            "cuGetErrorName": 6000 => cuGetErrorName;
            "cuGetErrorString": 6000 => cuGetErrorString;
            "cuGetProcAddress": 11030 => cuGetProcAddress, 12000 => cuGetProcAddress_v2;
            "cuGetExportTable": 3000 => cuGetExportTable;
        }
    })
}

/// Resolution result: Ok(pointer) or Err(query status).
pub fn resolve(base: &str, version: c_int, per_thread: bool) -> Result<&'static Entry, c_uint> {
    let mut any = false;
    let mut best: Option<&Entry> = None;
    let mut best_pt: Option<&Entry> = None;
    for e in table().iter().filter(|e| e.base == base) {
        any = true;
        if e.version > version {
            continue;
        }
        let slot = if e.per_thread { &mut best_pt } else { &mut best };
        if slot.is_none_or(|b| e.version >= b.version) {
            *slot = Some(e);
        }
    }
    if !any {
        return Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    let pick = if per_thread { best_pt.or(best) } else { best };
    pick.ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

fn trace_enabled() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("FGPU_SIM_TRACE").is_some_and(|v| !v.is_empty() && v != "0"))
}

pub fn get_proc_address(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_uint) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM && flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let driver_version = match driver::state_only() {
        Some(s) => s.driver_version() as c_int,
        None => 12080,
    };
    if cuda_version > driver_version {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated symbol name (CUDA API contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let r = resolve(name, cuda_version, flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    if trace_enabled() {
        match &r {
            Ok(e) => eprintln!("fgpu-sim: cuGetProcAddress({name}, {cuda_version}, {flags}) -> {}", e.name),
            Err(s) => eprintln!("fgpu-sim: cuGetProcAddress({name}, {cuda_version}, {flags}) -> status {s}"),
        }
    }
    match r {
        Ok(e) => {
            put(pfn, e.ptr as *mut c_void);
            put(status, CU_GET_PROC_ADDRESS_SUCCESS);
        }
        Err(s) => {
            put(pfn, std::ptr::null_mut());
            put(status, s);
        }
    }
    CUDA_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(base: &str, v: c_int, pt: bool) -> Result<&'static str, c_uint> {
        resolve(base, v, pt).map(|e| e.name)
    }

    #[test]
    fn versions_and_variants() {
        assert_eq!(name("cuMemAlloc", 3010, false), Ok("cuMemAlloc"));
        assert_eq!(name("cuMemAlloc", 12030, false), Ok("cuMemAlloc_v2"));
        assert_eq!(name("cuMemAlloc", 12030, true), Ok("cuMemAlloc_v2"));
        assert_eq!(name("cuCtxCreate", 3020, false), Ok("cuCtxCreate_v2"));
        assert_eq!(name("cuCtxCreate", 11040, false), Ok("cuCtxCreate_v3"));
        assert_eq!(name("cuCtxCreate", 12080, false), Ok("cuCtxCreate_v4"));
        assert_eq!(name("cuDevicePrimaryCtxRelease", 10020, false), Ok("cuDevicePrimaryCtxRelease"));
        assert_eq!(name("cuDevicePrimaryCtxRelease", 11000, false), Ok("cuDevicePrimaryCtxRelease_v2"));
        assert_eq!(name("cuMemGetInfo", 12000, false), Ok("cuMemGetInfo_v2"));
        assert_eq!(name("cuStreamSynchronize", 12000, true), Ok("cuStreamSynchronize_ptsz"));
        assert_eq!(name("cuStreamSynchronize", 12000, false), Ok("cuStreamSynchronize"));
        assert_eq!(name("cuMemcpyHtoD", 12000, true), Ok("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(name("cuMemAllocAsync", 11020, true), Ok("cuMemAllocAsync_ptsz"));
        assert_eq!(name("cuMemAllocAsync", 11010, false), Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        assert_eq!(name("cuNoSuchThing", 12000, false), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(name("cuMemAlloc_v2", 12000, false), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(name("cuGetProcAddress", 12000, false), Ok("cuGetProcAddress_v2"));
        assert_eq!(name("cuGetProcAddress", 11030, false), Ok("cuGetProcAddress"));
        assert_eq!(name("cuLaunchKernel", 12080, false), Ok("cuLaunchKernel"));
        assert_eq!(name("cuLaunchKernel", 12080, true), Ok("cuLaunchKernel_ptsz"));
        assert_eq!(name("cuLaunchKernel", 3020, false), Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        assert_eq!(name("cuLaunchKernelEx", 12000, true), Ok("cuLaunchKernelEx_ptsz"));
        assert_eq!(name("cuLaunchCooperativeKernel", 12000, false), Ok("cuLaunchCooperativeKernel"));
        assert_eq!(name("cuGraphAddKernelNode", 11000, false), Ok("cuGraphAddKernelNode"));
        assert_eq!(name("cuGraphAddKernelNode", 12000, false), Ok("cuGraphAddKernelNode_v2"));
        assert_eq!(name("cuEventElapsedTime", 12080, false), Ok("cuEventElapsedTime_v2"));
        assert_eq!(name("cuEventElapsedTime", 12000, false), Ok("cuEventElapsedTime"));
        assert_eq!(name("cuStreamBeginCapture", 10010, true), Ok("cuStreamBeginCapture_v2_ptsz"));
        assert_eq!(name("cuStreamGetCaptureInfo", 12030, false), Ok("cuStreamGetCaptureInfo_v3"));
    }

    #[test]
    fn every_entry_has_a_distinct_pointer() {
        let t = table();
        for (i, a) in t.iter().enumerate() {
            for b in &t[i + 1..] {
                assert!(a.ptr != b.ptr || a.name == b.name, "{} {}", a.name, b.name);
            }
        }
    }
}
