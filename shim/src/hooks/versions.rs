//! The driver's versioning of the entry points the shim hooks: which exported variant
//! (`_v2`, `_ptsz`, ...) `cuGetProcAddress` gives for a base name, a CUDA version and a
//! stream mode. `table.rs` falls back on it when the driver hands back an address fgpu does
//! not know for a name it wraps.

use crate::driver::symbols::Sym;
use std::ffi::c_int;

/// The exported variant the driver maps a base name to for a CUDA version and stream mode.
/// `(minimum version, variant)` lists are the driver's own versioning of these entry points.
pub fn variant_for(base: &str, version: c_int, per_thread_stream: bool) -> Option<Sym> {
    use Sym::*;
    let pick = |table: &[(c_int, Sym)]| table.iter().rev().find(|(min, _)| version >= *min).map(|(_, s)| *s);
    let stream = |plain: Sym, ptsz: Sym| if per_thread_stream { ptsz } else { plain };
    match base {
        "cuGetProcAddress" => pick(&[(11030, cuGetProcAddress), (12000, cuGetProcAddress_v2)]),
        "cuMemAlloc" => pick(&[(0, cuMemAlloc), (3020, cuMemAlloc_v2)]),
        "cuMemAllocPitch" => pick(&[(0, cuMemAllocPitch), (3020, cuMemAllocPitch_v2)]),
        "cuMemFree" => pick(&[(0, cuMemFree), (3020, cuMemFree_v2)]),
        "cuMemGetInfo" => pick(&[(0, cuMemGetInfo), (3020, cuMemGetInfo_v2)]),
        "cuDeviceTotalMem" => pick(&[(0, cuDeviceTotalMem), (3020, cuDeviceTotalMem_v2)]),
        "cuCtxCreate" => pick(&[(0, cuCtxCreate), (3020, cuCtxCreate_v2), (11040, cuCtxCreate_v3), (12050, cuCtxCreate_v4)]),
        "cuCtxDestroy" => pick(&[(0, cuCtxDestroy), (4000, cuCtxDestroy_v2)]),
        "cuDevicePrimaryCtxRelease" => pick(&[(7000, cuDevicePrimaryCtxRelease), (11000, cuDevicePrimaryCtxRelease_v2)]),
        "cuDevicePrimaryCtxReset" => pick(&[(7000, cuDevicePrimaryCtxReset), (11000, cuDevicePrimaryCtxReset_v2)]),
        "cuDevicePrimaryCtxRetain" => Some(cuDevicePrimaryCtxRetain),
        "cuArrayCreate" => pick(&[(0, cuArrayCreate), (3020, cuArrayCreate_v2)]),
        "cuArray3DCreate" => pick(&[(0, cuArray3DCreate), (3020, cuArray3DCreate_v2)]),
        "cuMipmappedArrayCreate" => Some(cuMipmappedArrayCreate),
        "cuArrayDestroy" => Some(cuArrayDestroy),
        "cuMipmappedArrayDestroy" => Some(cuMipmappedArrayDestroy),
        "cuMemAllocManaged" => Some(cuMemAllocManaged),
        "cuMemAllocAsync" => Some(stream(cuMemAllocAsync, cuMemAllocAsync_ptsz)),
        "cuMemAllocFromPoolAsync" => Some(stream(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)),
        "cuMemFreeAsync" => Some(stream(cuMemFreeAsync, cuMemFreeAsync_ptsz)),
        "cuStreamSynchronize" => Some(stream(cuStreamSynchronize, cuStreamSynchronize_ptsz)),
        "cuEventSynchronize" => Some(cuEventSynchronize),
        "cuCtxSynchronize" => Some(cuCtxSynchronize),
        "cuMemPoolTrimTo" => Some(cuMemPoolTrimTo),
        "cuMemPoolDestroy" => Some(cuMemPoolDestroy),
        "cuMemCreate" => Some(cuMemCreate),
        "cuMemRelease" => Some(cuMemRelease),
        "cuMemMap" => Some(cuMemMap),
        "cuMemUnmap" => Some(cuMemUnmap),
        "cuGraphInstantiate" => pick(&[(0, cuGraphInstantiate), (11000, cuGraphInstantiate_v2), (12000, cuGraphInstantiateWithFlags)]),
        "cuGraphInstantiateWithFlags" => Some(cuGraphInstantiateWithFlags),
        "cuGraphInstantiateWithParams" => Some(stream(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz)),
        "cuGraphLaunch" => Some(stream(cuGraphLaunch, cuGraphLaunch_ptsz)),
        "cuGraphUpload" => Some(stream(cuGraphUpload, cuGraphUpload_ptsz)),
        "cuDeviceGraphMemTrim" => Some(cuDeviceGraphMemTrim),
        "cuGraphExecDestroy" => Some(cuGraphExecDestroy),
        "cuModuleLoad" => Some(cuModuleLoad),
        "cuModuleLoadData" => Some(cuModuleLoadData),
        "cuModuleLoadDataEx" => Some(cuModuleLoadDataEx),
        "cuModuleLoadFatBinary" => Some(cuModuleLoadFatBinary),
        "cuLibraryLoadData" => Some(cuLibraryLoadData),
        "cuLibraryLoadFromFile" => Some(cuLibraryLoadFromFile),
        "cuLaunchKernel" => Some(stream(cuLaunchKernel, cuLaunchKernel_ptsz)),
        "cuLaunchKernelEx" => Some(stream(cuLaunchKernelEx, cuLaunchKernelEx_ptsz)),
        "cuLaunchCooperativeKernel" => Some(stream(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_pick_the_driver_variant() {
        assert_eq!(variant_for("cuMemAlloc", 3010, false), Some(Sym::cuMemAlloc));
        assert_eq!(variant_for("cuMemAlloc", 12030, false), Some(Sym::cuMemAlloc_v2));
        assert_eq!(variant_for("cuCtxCreate", 11080, false), Some(Sym::cuCtxCreate_v3));
        assert_eq!(variant_for("cuCtxCreate", 13000, false), Some(Sym::cuCtxCreate_v4));
        assert_eq!(variant_for("cuMemAllocAsync", 12000, true), Some(Sym::cuMemAllocAsync_ptsz));
        assert_eq!(variant_for("cuGetProcAddress", 11080, false), Some(Sym::cuGetProcAddress));
        assert_eq!(variant_for("cuGetProcAddress", 12000, false), Some(Sym::cuGetProcAddress_v2));
        assert_eq!(variant_for("cuMemcpy", 12000, false), None);
        assert_eq!(variant_for("cuLaunchKernel", 12000, true), Some(Sym::cuLaunchKernel_ptsz));
        assert_eq!(variant_for("cuLaunchKernelEx", 12000, false), Some(Sym::cuLaunchKernelEx));
        assert_eq!(variant_for("cuLaunchCooperativeKernel", 12000, true), Some(Sym::cuLaunchCooperativeKernel_ptsz));
    }
}
