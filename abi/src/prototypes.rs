//! The C prototype of every driver function fgpu calls, each declared once, written from
//! `cuda.h` and `nvml.h` with their parameter names: the shim's ([`prototypes!`]) and the
//! tools' ([`tool_prototypes!`]), and each as a function pointer type ([`proto`]).
//!
//! [`prototypes!`](crate::prototypes) hands the whole list to another macro: the shim's
//! `driver/symbols.rs` makes the symbol table of it, `driver/raw.rs` the forwarders, and
//! tests/integration/abi_layout.rs a check of every parameter and return value against
//! NVIDIA's headers, as the C++ compiler reads them: size, alignment, signedness and pointer
//! level, and the size of what a pointer points to. A parameter written `*mut c_void` is a
//! pointer the shim never reads: only its pointer level is compared.
//!
//! The types are named at the place the list is expanded: this crate's types, and `c_char`,
//! `c_int`, `c_uint`, `c_float`, `c_void` of `std::ffi`.

/// `prototypes!(then)` expands to `then! { Lib fn name(param: Type, ...) -> Ret; ... }`,
/// `Lib` being `Cuda` (`libcuda.so.1`) or `Nvml` (`libnvidia-ml.so.1`).
#[macro_export]
macro_rules! prototypes {
    ($then:ident) => {
        $then! {
            // Entry points (cuGetProcAddress) and allocations.
            Cuda fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: u64) -> CUresult;
            Cuda fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: u64, symbolStatus: *mut u32) -> CUresult;
            Cuda fn cuMemAlloc(dptr: *mut CUdeviceptrV1, bytesize: c_uint) -> CUresult;
            Cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
            Cuda fn cuMemAllocPitch(dptr: *mut CUdeviceptrV1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint) -> CUresult;
            Cuda fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) -> CUresult;
            Cuda fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult;
            Cuda fn cuMemFree(dptr: CUdeviceptrV1) -> CUresult;
            Cuda fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
            Cuda fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult;
            Cuda fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
            Cuda fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult;
            Cuda fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;
            // Contexts.
            Cuda fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
            Cuda fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
            Cuda fn cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut c_void, numParams: c_int, flags: c_uint, dev: CUdevice) -> CUresult;
            Cuda fn cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult;
            Cuda fn cuCtxDestroy(ctx: CUcontext) -> CUresult;
            Cuda fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult;
            Cuda fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
            Cuda fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
            Cuda fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
            Cuda fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
            Cuda fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
            Cuda fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult;
            Cuda fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult;
            Cuda fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult;
            Cuda fn cuCtxSynchronize() -> CUresult;
            Cuda fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
            Cuda fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
            // Stream-ordered pools.
            Cuda fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult;
            Cuda fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult;
            Cuda fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult;
            Cuda fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult;
            Cuda fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
            Cuda fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
            Cuda fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult;
            Cuda fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
            Cuda fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
            Cuda fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: u32, value: *mut c_void) -> CUresult;
            // Synchronisation.
            Cuda fn cuStreamSynchronize(hStream: CUstream) -> CUresult;
            Cuda fn cuStreamSynchronize_ptsz(hStream: CUstream) -> CUresult;
            Cuda fn cuEventSynchronize(hEvent: CUevent) -> CUresult;
            // Virtual memory management.
            Cuda fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult;
            Cuda fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
            Cuda fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult;
            Cuda fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
            // Arrays.
            Cuda fn cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CudaArrayDescriptorV1) -> CUresult;
            Cuda fn cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CudaArrayDescriptor) -> CUresult;
            Cuda fn cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CudaArray3dDescriptorV1) -> CUresult;
            Cuda fn cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CudaArray3dDescriptor) -> CUresult;
            Cuda fn cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CudaArray3dDescriptor, numMipmapLevels: c_uint) -> CUresult;
            Cuda fn cuArrayDestroy(hArray: CUarray) -> CUresult;
            Cuda fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult;
            Cuda fn cuArrayGetMemoryRequirements(memoryRequirements: *mut CudaArrayMemoryRequirements, array: CUarray, device: CUdevice) -> CUresult;
            Cuda fn cuMipmappedArrayGetMemoryRequirements(memoryRequirements: *mut CudaArrayMemoryRequirements, mipmap: CUmipmappedArray, device: CUdevice) -> CUresult;
            // Graphs.
            Cuda fn cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult;
            Cuda fn cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) -> CUresult;
            Cuda fn cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64) -> CUresult;
            Cuda fn cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CudaGraphInstantiateParams) -> CUresult;
            Cuda fn cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CudaGraphInstantiateParams) -> CUresult;
            Cuda fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            Cuda fn cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            Cuda fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            Cuda fn cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult;
            Cuda fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult;
            Cuda fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult;
            Cuda fn cuDeviceGetGraphMemAttribute(device: CUdevice, attr: u32, value: *mut c_void) -> CUresult;
            Cuda fn cuGraphGetNodes(hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize) -> CUresult;
            Cuda fn cuGraphNodeGetType(hNode: CUgraphNode, type_: *mut u32) -> CUresult;
            Cuda fn cuGraphMemAllocNodeGetParams(hNode: CUgraphNode, params_out: *mut CudaMemAllocNodeParams) -> CUresult;
            // Modules and libraries.
            Cuda fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult;
            Cuda fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult;
            Cuda fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut c_uint, optionValues: *mut *mut c_void) -> CUresult;
            Cuda fn cuModuleLoadFatBinary(module: *mut CUmodule, fatCubin: *const c_void) -> CUresult;
            Cuda fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jitOptions: *mut c_uint, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut c_uint, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) -> CUresult;
            Cuda fn cuLibraryLoadFromFile(library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut c_uint, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut c_uint, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint) -> CUresult;
            // Kernel launches.
            Cuda fn cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            Cuda fn cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            Cuda fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            Cuda fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult;
            Cuda fn cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult;
            Cuda fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) -> CUresult;
            // The compute limiter's markers and capture state.
            Cuda fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult;
            Cuda fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult;
            Cuda fn cuEventRecord_ptsz(hEvent: CUevent, hStream: CUstream) -> CUresult;
            Cuda fn cuEventQuery(hEvent: CUevent) -> CUresult;
            Cuda fn cuEventElapsedTime(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent) -> CUresult;
            Cuda fn cuEventElapsedTime_v2(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent) -> CUresult;
            Cuda fn cuEventDestroy(hEvent: CUevent) -> CUresult;
            Cuda fn cuEventDestroy_v2(hEvent: CUevent) -> CUresult;
            Cuda fn cuStreamIsCapturing(hStream: CUstream, captureStatus: *mut u32) -> CUresult;
            Cuda fn cuStreamIsCapturing_ptsz(hStream: CUstream, captureStatus: *mut u32) -> CUresult;
            Cuda fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult;
            // NVML: memory and process lists.
            Nvml fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV1) -> NvmlReturn;
            Nvml fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV1) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV1) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: NvmlDevice, infoCount: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetRunningProcessDetailList(device: NvmlDevice, plist: *mut NvmlProcessDetailList) -> NvmlReturn;
            // NVML: utilisation, accounting and sessions.
            Nvml fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, utilization: *mut NvmlProcessUtilizationSample, processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64) -> NvmlReturn;
            Nvml fn nvmlDeviceGetProcessesUtilizationInfo(device: NvmlDevice, procesesUtilInfo: *mut NvmlProcessesUtilizationInfo) -> NvmlReturn;
            Nvml fn nvmlDeviceGetAccountingPids(device: NvmlDevice, count: *mut c_uint, pids: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetAccountingStats(device: NvmlDevice, pid: c_uint, stats: *mut c_void) -> NvmlReturn;
            Nvml fn nvmlDeviceGetAccountingStats_v2(device: NvmlDevice, stats: *mut NvmlAccountingStatsV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetEncoderSessions(device: NvmlDevice, sessionCount: *mut c_uint, sessionInfos: *mut NvmlEncoderSessionInfo) -> NvmlReturn;
            Nvml fn nvmlDeviceGetFBCSessions(device: NvmlDevice, sessionCount: *mut c_uint, sessionInfo: *mut NvmlFbcSessionInfo) -> NvmlReturn;
            // NVML: the shim's own questions (devices, UUIDs, MIG, the driver's version).
            Nvml fn nvmlInit_v2() -> NvmlReturn;
            Nvml fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn;
            Nvml fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn;
            Nvml fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, length: c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMigMode(device: NvmlDevice, currentMode: *mut c_uint, pendingMode: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMaxMigDeviceCount(device: NvmlDevice, count: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMigDeviceHandleByIndex(device: NvmlDevice, index: c_uint, migDevice: *mut NvmlDevice) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGpuInstanceId(device: NvmlDevice, id: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetComputeInstanceId(device: NvmlDevice, id: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> NvmlReturn;
        }
    };
}

/// `tool_prototypes!(then)`: as [`prototypes!`](crate::prototypes), the driver functions
/// fgpu's tools call and the shim does not (`fgpu doctor`'s driver probe and the observers'
/// NVML lists in `cli/`: the driver's version, `cuInit`, the unversioned NVML names a
/// driver older than their `_v2` has, a device's name, `nvmlShutdown`; the event API that
/// `fgpu __nvml-events` watches GPU health with). The tools call the shim's list too; a
/// function is in one list only.
#[macro_export]
macro_rules! tool_prototypes {
    ($then:ident) => {
        $then! {
            Cuda fn cuInit(Flags: c_uint) -> CUresult;
            Cuda fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult;
            Cuda fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
            Nvml fn nvmlInit() -> NvmlReturn;
            Nvml fn nvmlShutdown() -> NvmlReturn;
            Nvml fn nvmlSystemGetCudaDriverVersion(cudaDriverVersion: *mut c_int) -> NvmlReturn;
            Nvml fn nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion: *mut c_int) -> NvmlReturn;
            Nvml fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetName(device: NvmlDevice, name: *mut c_char, length: c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetMinorNumber(device: NvmlDevice, minorNumber: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetSupportedEventTypes(device: NvmlDevice, eventTypes: *mut u64) -> NvmlReturn;
            Nvml fn nvmlEventSetCreate(set: *mut NvmlEventSet) -> NvmlReturn;
            Nvml fn nvmlDeviceRegisterEvents(device: NvmlDevice, eventTypes: u64, set: NvmlEventSet) -> NvmlReturn;
            Nvml fn nvmlEventSetWait_v2(set: NvmlEventSet, data: *mut NvmlEventData, timeoutms: c_uint) -> NvmlReturn;
            Nvml fn nvmlEventSetFree(set: NvmlEventSet) -> NvmlReturn;
            // MIG: `fgpu mig` and `fgpu run --mig` (profiles, placements, instances).
            Nvml fn nvmlDeviceGetGpuInstanceProfileInfoV(device: NvmlDevice, profile: c_uint, info: *mut NvmlGpuInstanceProfileInfoV2) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(device: NvmlDevice, profileId: c_uint, placements: *mut NvmlGpuInstancePlacement, count: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGpuInstanceRemainingCapacity(device: NvmlDevice, profileId: c_uint, count: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceCreateGpuInstanceWithPlacement(device: NvmlDevice, profileId: c_uint, placement: *const NvmlGpuInstancePlacement, gpuInstance: *mut NvmlGpuInstance) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGpuInstances(device: NvmlDevice, profileId: c_uint, gpuInstances: *mut NvmlGpuInstance, count: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlDeviceGetGpuInstanceById(device: NvmlDevice, id: c_uint, gpuInstance: *mut NvmlGpuInstance) -> NvmlReturn;
            Nvml fn nvmlGpuInstanceGetInfo(gpuInstance: NvmlGpuInstance, info: *mut NvmlGpuInstanceInfo) -> NvmlReturn;
            Nvml fn nvmlGpuInstanceDestroy(gpuInstance: NvmlGpuInstance) -> NvmlReturn;
            Nvml fn nvmlGpuInstanceGetComputeInstanceProfileInfo(gpuInstance: NvmlGpuInstance, profile: c_uint, engProfile: c_uint, info: *mut NvmlComputeInstanceProfileInfo) -> NvmlReturn;
            Nvml fn nvmlGpuInstanceCreateComputeInstance(gpuInstance: NvmlGpuInstance, profileId: c_uint, computeInstance: *mut NvmlComputeInstance) -> NvmlReturn;
            Nvml fn nvmlGpuInstanceGetComputeInstances(gpuInstance: NvmlGpuInstance, profileId: c_uint, computeInstances: *mut NvmlComputeInstance, count: *mut c_uint) -> NvmlReturn;
            Nvml fn nvmlComputeInstanceGetInfo_v2(computeInstance: NvmlComputeInstance, info: *mut NvmlComputeInstanceInfo) -> NvmlReturn;
            Nvml fn nvmlComputeInstanceDestroy(computeInstance: NvmlComputeInstance) -> NvmlReturn;
        }
    };
}

/// The C prototype of every function of both lists as a Rust function pointer type:
/// `proto::cuMemAlloc_v2` is `unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult`.
/// What a caller casts a looked-up address to (the shim's `driver/raw.rs`, the tools'
/// `dlsym`), and what the shim's hooks are checked against at compile time.
#[allow(non_camel_case_types)]
pub mod proto {
    #[allow(unused_imports)]
    use crate::cuda::*;
    #[allow(unused_imports)]
    use crate::nvml::*;
    #[allow(unused_imports)]
    use std::ffi::{c_char, c_float, c_int, c_uint, c_void};

    macro_rules! function_types {
        ($( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($lib), ").")]
                pub type $name = unsafe extern "C" fn($($ty),*) -> $ret;
            )*
        };
    }

    crate::prototypes!(function_types);
    crate::tool_prototypes!(function_types);
}
