//! The table from each driver symbol the shim hooks to its exported wrapper here, and the
//! `cuGetProcAddress` hooks that hand those wrappers out (they are in the table themselves,
//! so they live with it). `dlsym.rs` hands them out too. Each wrapper's signature is
//! checked at compile time against the symbol's prototype in `driver/table.rs` (which tests
//! check against NVIDIA's headers).
//!
//! `cuGetProcAddress` / `cuGetProcAddress_v2` are how cudart and most bindings reach every
//! driver function (base name + CUDA version + flags). The real resolver runs first with the
//! caller's exact arguments, so the caller gets exactly the variant the driver picks for its
//! version and flags. Only then, if the returned function is one we wrap, is it replaced by
//! our wrapper *of that same variant*: we recognise the variant by its address. If the
//! driver hands back an address we do not recognise for a name we wrap, we fall back to the
//! driver's documented name/version rules (`versions.rs`, and say so at debug level) rather
//! than let the caller run uncapped.

use super::versions::variant_for;
use super::{alloc, array, context, graph, info, launch, module, nvml, pool, vmm};
use crate::abi::cuda::*;
use crate::driver::raw::{self, proto};
use crate::driver::symbols::{self, Lib, Sym};
use fgpu_core::log::Level;
use fgpu_core::log_at;
use std::ffi::{c_char, c_int, c_void, CStr};

macro_rules! hooked {
    ($( $name:ident => $wrapper:path ; )*) => {
        /// Every symbol the shim hooks.
        pub const HOOKED: &[Sym] = &[ $( Sym::$name, )* ];

        /// Our exported replacement for `sym`, if the shim hooks it.
        pub fn wrapper(sym: Sym) -> Option<*mut c_void> {
            match sym {
                $( Sym::$name => Some($wrapper as *mut c_void), )*
                _ => None,
            }
        }

        /// The hooked symbol with this exact name.
        pub fn hooked_by_name(name: &[u8]) -> Option<Sym> {
            $( if name == stringify!($name).as_bytes() { return Some(Sym::$name); } )*
            None
        }

        // Each wrapper has the C prototype of the symbol it stands for.
        $( const _: proto::$name = $wrapper; )*
    };
}

hooked! {
    cuGetProcAddress => self::cuGetProcAddress;
    cuGetProcAddress_v2 => self::cuGetProcAddress_v2;
    cuMemAlloc => alloc::cuMemAlloc;
    cuMemAlloc_v2 => alloc::cuMemAlloc_v2;
    cuMemAllocPitch => alloc::cuMemAllocPitch;
    cuMemAllocPitch_v2 => alloc::cuMemAllocPitch_v2;
    cuMemAllocManaged => alloc::cuMemAllocManaged;
    cuMemFree => alloc::cuMemFree;
    cuMemFree_v2 => alloc::cuMemFree_v2;
    cuMemGetInfo => info::cuMemGetInfo;
    cuMemGetInfo_v2 => info::cuMemGetInfo_v2;
    cuDeviceTotalMem => info::cuDeviceTotalMem;
    cuDeviceTotalMem_v2 => info::cuDeviceTotalMem_v2;
    cuCtxCreate => context::cuCtxCreate;
    cuCtxCreate_v2 => context::cuCtxCreate_v2;
    cuCtxCreate_v3 => context::cuCtxCreate_v3;
    cuCtxCreate_v4 => context::cuCtxCreate_v4;
    cuCtxDestroy => context::cuCtxDestroy;
    cuCtxDestroy_v2 => context::cuCtxDestroy_v2;
    cuDevicePrimaryCtxRetain => context::cuDevicePrimaryCtxRetain;
    cuDevicePrimaryCtxRelease => context::cuDevicePrimaryCtxRelease;
    cuDevicePrimaryCtxRelease_v2 => context::cuDevicePrimaryCtxRelease_v2;
    cuDevicePrimaryCtxReset => context::cuDevicePrimaryCtxReset;
    cuDevicePrimaryCtxReset_v2 => context::cuDevicePrimaryCtxReset_v2;
    cuMemAllocAsync => pool::cuMemAllocAsync;
    cuMemAllocAsync_ptsz => pool::cuMemAllocAsync_ptsz;
    cuMemAllocFromPoolAsync => pool::cuMemAllocFromPoolAsync;
    cuMemAllocFromPoolAsync_ptsz => pool::cuMemAllocFromPoolAsync_ptsz;
    cuMemFreeAsync => pool::cuMemFreeAsync;
    cuMemFreeAsync_ptsz => pool::cuMemFreeAsync_ptsz;
    cuMemPoolTrimTo => pool::cuMemPoolTrimTo;
    cuMemPoolDestroy => pool::cuMemPoolDestroy;
    cuStreamSynchronize => pool::cuStreamSynchronize;
    cuStreamSynchronize_ptsz => pool::cuStreamSynchronize_ptsz;
    cuEventSynchronize => pool::cuEventSynchronize;
    cuCtxSynchronize => pool::cuCtxSynchronize;
    cuMemCreate => vmm::cuMemCreate;
    cuMemRelease => vmm::cuMemRelease;
    cuMemMap => vmm::cuMemMap;
    cuMemUnmap => vmm::cuMemUnmap;
    cuArrayCreate => array::cuArrayCreate;
    cuArrayCreate_v2 => array::cuArrayCreate_v2;
    cuArray3DCreate => array::cuArray3DCreate;
    cuArray3DCreate_v2 => array::cuArray3DCreate_v2;
    cuMipmappedArrayCreate => array::cuMipmappedArrayCreate;
    cuArrayDestroy => array::cuArrayDestroy;
    cuMipmappedArrayDestroy => array::cuMipmappedArrayDestroy;
    cuGraphInstantiate => graph::cuGraphInstantiate;
    cuGraphInstantiate_v2 => graph::cuGraphInstantiate_v2;
    cuGraphInstantiateWithFlags => graph::cuGraphInstantiateWithFlags;
    cuGraphInstantiateWithParams => graph::cuGraphInstantiateWithParams;
    cuGraphInstantiateWithParams_ptsz => graph::cuGraphInstantiateWithParams_ptsz;
    cuGraphLaunch => graph::cuGraphLaunch;
    cuGraphLaunch_ptsz => graph::cuGraphLaunch_ptsz;
    cuGraphUpload => graph::cuGraphUpload;
    cuGraphUpload_ptsz => graph::cuGraphUpload_ptsz;
    cuDeviceGraphMemTrim => graph::cuDeviceGraphMemTrim;
    cuGraphExecDestroy => graph::cuGraphExecDestroy;
    cuModuleLoad => module::cuModuleLoad;
    cuModuleLoadData => module::cuModuleLoadData;
    cuModuleLoadDataEx => module::cuModuleLoadDataEx;
    cuModuleLoadFatBinary => module::cuModuleLoadFatBinary;
    cuLibraryLoadData => module::cuLibraryLoadData;
    cuLibraryLoadFromFile => module::cuLibraryLoadFromFile;
    cuLaunchKernel => launch::cuLaunchKernel;
    cuLaunchKernel_ptsz => launch::cuLaunchKernel_ptsz;
    cuLaunchKernelEx => launch::cuLaunchKernelEx;
    cuLaunchKernelEx_ptsz => launch::cuLaunchKernelEx_ptsz;
    cuLaunchCooperativeKernel => launch::cuLaunchCooperativeKernel;
    cuLaunchCooperativeKernel_ptsz => launch::cuLaunchCooperativeKernel_ptsz;
    nvmlDeviceGetMemoryInfo => nvml::memory::nvmlDeviceGetMemoryInfo;
    nvmlDeviceGetMemoryInfo_v2 => nvml::memory::nvmlDeviceGetMemoryInfo_v2;
    nvmlDeviceGetComputeRunningProcesses => nvml::lists::nvmlDeviceGetComputeRunningProcesses;
    nvmlDeviceGetComputeRunningProcesses_v2 => nvml::lists::nvmlDeviceGetComputeRunningProcesses_v2;
    nvmlDeviceGetComputeRunningProcesses_v3 => nvml::lists::nvmlDeviceGetComputeRunningProcesses_v3;
    nvmlDeviceGetGraphicsRunningProcesses => nvml::lists::nvmlDeviceGetGraphicsRunningProcesses;
    nvmlDeviceGetGraphicsRunningProcesses_v2 => nvml::lists::nvmlDeviceGetGraphicsRunningProcesses_v2;
    nvmlDeviceGetGraphicsRunningProcesses_v3 => nvml::lists::nvmlDeviceGetGraphicsRunningProcesses_v3;
    nvmlDeviceGetMPSComputeRunningProcesses => nvml::lists::nvmlDeviceGetMPSComputeRunningProcesses;
    nvmlDeviceGetMPSComputeRunningProcesses_v2 => nvml::lists::nvmlDeviceGetMPSComputeRunningProcesses_v2;
    nvmlDeviceGetMPSComputeRunningProcesses_v3 => nvml::lists::nvmlDeviceGetMPSComputeRunningProcesses_v3;
    nvmlDeviceGetProcessUtilization => nvml::filtered::nvmlDeviceGetProcessUtilization;
    nvmlDeviceGetAccountingPids => nvml::filtered::nvmlDeviceGetAccountingPids;
    nvmlDeviceGetAccountingStats => nvml::filtered::nvmlDeviceGetAccountingStats;
    nvmlDeviceGetAccountingStats_v2 => nvml::filtered::nvmlDeviceGetAccountingStats_v2;
    nvmlDeviceGetRunningProcessDetailList => nvml::lists::nvmlDeviceGetRunningProcessDetailList;
    nvmlDeviceGetProcessesUtilizationInfo => nvml::filtered::nvmlDeviceGetProcessesUtilizationInfo;
    nvmlDeviceGetEncoderSessions => nvml::filtered::nvmlDeviceGetEncoderSessions;
    nvmlDeviceGetFBCSessions => nvml::filtered::nvmlDeviceGetFBCSessions;
}

/// Which hooked CUDA symbol's real implementation lives at `address`, if any.
pub fn identify(address: *mut c_void) -> Option<Sym> {
    HOOKED.iter().copied().filter(|s| s.lib() == Lib::Cuda).find(|s| crate::driver::symbols::get(*s) == address)
}

/// # Safety
/// `cuGetProcAddress` contract (CUDA 11.3+): NUL-terminated `symbol`, writable `pfn`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::cuGetProcAddress(symbol, pfn, cuda_version, flags) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(rc, || {
        // SAFETY: forwarded caller pointers, checked for null inside.
        unsafe { substitute(rc, symbol, pfn, cuda_version, flags) };
        rc
    })
}

/// # Safety
/// `cuGetProcAddress_v2` contract (CUDA 12.0+): as above plus an optional `symbol_status`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut u32,
) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, symbol_status) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(rc, || {
        // SAFETY: forwarded caller pointers, checked for null inside.
        unsafe { substitute(rc, symbol, pfn, cuda_version, flags) };
        rc
    })
}

/// Replaces `*pfn` with our wrapper when the driver returned a function we wrap.
///
/// # Safety
/// `symbol` NUL-terminated or null; `pfn` writable or null.
unsafe fn substitute(rc: CUresult, symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
    if rc != CUDA_SUCCESS || pfn.is_null() || symbol.is_null() {
        return;
    }
    // SAFETY: pfn is non-null and the driver just wrote it.
    let found = unsafe { *pfn };
    if found.is_null() {
        return;
    }
    if let Some(sym) = identify(found) {
        if let Some(wrapper) = wrapper(sym) {
            // SAFETY: as above.
            unsafe { *pfn = wrapper };
        }
        return;
    }
    // SAFETY: caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    if let Some(sym) = variant_for(&name, cuda_version, ptds) {
        if let Some(wrapper) = wrapper(sym) {
            if found != wrapper {
                log_at!(Level::Debug, "cuGetProcAddress({name}, {cuda_version}) returned an address fgpu does not know; using its {} wrapper", sym.name());
                symbols::remember(sym, found);
                // SAFETY: as above.
                unsafe { *pfn = wrapper };
            }
        }
    }
}
