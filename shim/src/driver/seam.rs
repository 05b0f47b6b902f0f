//! The calls the shim makes to the driver on its own behalf, as two traits: what the
//! accounting and the compute limiter need, typed and safe. The real driver implements
//! them (`cuda.rs`, `nvml.rs`); unit tests swap in a programmable fake (`fake.rs`), as
//! youki's `Syscall` does, chosen at compile time (`instance.rs`): no call goes through a
//! `dyn`.
//!
//! Handles (contexts, streams, events, pools, graphs, NVML devices) are opaque tokens the
//! driver gave out and gets back; nothing here dereferences them.

use crate::abi::cuda::*;
use crate::abi::nvml::*;
use fgpu_core::compute::Sample;
use fgpu_core::uuid::DeviceUuid;
use std::ffi::c_void;

/// The real driver (`libcuda.so.1`, `libnvidia-ml.so.1`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Real;

/// What `cuEventQuery` says of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventState {
    Done,
    Pending,
    /// Any other answer: the event cannot tell any more.
    Failed,
}

/// What `cuStreamIsCapturing` says of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Work sent to the stream runs.
    No,
    /// Work sent to the stream goes into a graph being captured (it does not run now).
    Yes,
    /// The driver answered an error: whether the stream is being captured is unknown.
    Unknown,
}

/// Why NVML's per-process samples cannot be had for a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplesError {
    /// The driver does not give them (`NVML_ERROR_NOT_SUPPORTED`, no NVML, no such call).
    Unavailable(NvmlReturn),
    /// This call failed; the next may work.
    Transient(NvmlReturn),
}

/// The CUDA driver API as the shim uses it itself. Each method names the C call it makes.
pub trait CudaDriver: Sync {
    /// `cuDeviceGetUuid_v2` (the MIG device's UUID on a MIG device, cuda.h), else
    /// `cuDeviceGetUuid`; a MIG device where the two differ (the first, older than MIG
    /// UUIDs, gives the GPU's).
    fn device_uuid(&self, ordinal: CUdevice) -> Result<DeviceUuid, CUresult>;
    /// `cuDeviceTotalMem_v2`: the device's physical memory.
    fn device_total_mem(&self, ordinal: CUdevice) -> Result<u64, CUresult>;
    /// `cuCtxGetDevice`: the device of the calling thread's context.
    fn context_device(&self) -> Result<CUdevice, CUresult>;
    /// `cuCtxGetCurrent`: the calling thread's context (none: `None`).
    fn current_context(&self) -> Option<CUcontext>;
    /// `cuDevicePrimaryCtxGetState`: whether the device's primary context is active.
    fn primary_context_active(&self, ordinal: CUdevice) -> Option<bool>;
    /// `cuDeviceGetMemPool`: the device's current stream-ordered pool.
    fn device_mem_pool(&self, ordinal: CUdevice) -> Option<CUmemoryPool>;
    /// `cuMemPoolGetAttribute` of a 64-bit attribute.
    fn mem_pool_attribute(&self, pool: CUmemoryPool, attribute: u32) -> Option<u64>;
    /// `cuDeviceGetGraphMemAttribute` of a 64-bit attribute.
    fn graph_mem_attribute(&self, ordinal: CUdevice, attribute: u32) -> Option<u64>;
    /// `cuGraphGetNodes`: a graph's nodes (a count first, then the nodes).
    fn graph_nodes(&self, graph: CUgraph) -> Option<Vec<CUgraphNode>>;
    /// `cuGraphNodeGetType`.
    fn graph_node_type(&self, node: CUgraphNode) -> Option<u32>;
    /// `cuGraphMemAllocNodeGetParams`: `None` when the driver lacks the call, else its
    /// answer.
    fn mem_alloc_node_params(&self, node: CUgraphNode) -> Option<Result<CudaMemAllocNodeParams, CUresult>>;
    /// `cuArrayGetMemoryRequirements` (or, `mipmapped`, `cuMipmappedArrayGetMemoryRequirements`):
    /// the bytes an array holds on `ordinal`, if the driver can say (CUDA 11.6+).
    fn array_size(&self, array: *mut c_void, mipmapped: bool, ordinal: CUdevice) -> Option<u64>;
    /// `cuEventCreate(CU_EVENT_DEFAULT)` in the current context.
    fn event_create(&self) -> Option<CUevent>;
    /// `cuEventRecord`, or `cuEventRecord_ptsz` (`ptsz`: stream 0 is the thread's own).
    fn event_record(&self, event: CUevent, stream: CUstream, ptsz: bool) -> bool;
    /// `cuEventQuery`.
    fn event_query(&self, event: CUevent) -> EventState;
    /// Nanoseconds between two completed events: `cuEventElapsedTime_v2` (CUDA 12.8+) or
    /// `cuEventElapsedTime`.
    fn event_elapsed_ns(&self, start: CUevent, end: CUevent) -> Option<u64>;
    /// `cuEventDestroy_v2`, else `cuEventDestroy` (returns at once even if the event is still
    /// pending; the driver frees it when it completes).
    fn event_destroy(&self, event: CUevent);
    /// `cuStreamIsCapturing` (or `_ptsz`).
    fn stream_capturing(&self, stream: CUstream, ptsz: bool) -> Capture;
    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture interaction
    /// mode to `mode`; the mode it had, or `None` when the driver refused (nothing changed).
    fn exchange_capture_mode(&self, mode: u32) -> Option<u32>;
}

/// NVML as the shim uses it itself.
pub trait NvmlDriver: Sync {
    /// `nvmlInit_v2` succeeded (once per process).
    fn nvml_ready(&self) -> bool;
    /// `nvmlDeviceGetHandleByUUID`, with the UUID as NVML prints it (`GPU-…`, `MIG-…`).
    fn nvml_device_by_uuid(&self, uuid: &DeviceUuid) -> Option<NvmlDevice>;
    /// `nvmlDeviceGetGpuInstanceId` and `nvmlDeviceGetComputeInstanceId`: the GPU and
    /// compute instance of a MIG device handle (`None` for any other handle).
    fn nvml_instance_ids(&self, device: NvmlDevice) -> Option<(u32, u32)>;
    /// `nvmlDeviceGetUUID` as NVML writes it: `GPU-…`, or `MIG-…` for a MIG instance.
    fn nvml_device_uuid(&self, device: NvmlDevice) -> Option<String>;
    /// The UUID of every GPU NVML lists (`nvmlDeviceGetCount_v2`,
    /// `nvmlDeviceGetHandleByIndex_v2`) and of every MIG instance on them, or why they
    /// cannot be listed.
    fn nvml_all_uuids(&self) -> Result<Vec<String>, String>;
    /// `nvmlDeviceGetMemoryInfo`.
    fn nvml_memory(&self, device: NvmlDevice) -> Option<NvmlMemory>;
    /// The compute-process list (`_v3` layout, falling back to `_v2` and `_v1`).
    fn nvml_compute_processes(&self, device: NvmlDevice) -> Option<Vec<NvmlProcessInfoV2>>;
    /// `nvmlDeviceGetProcessUtilization`: the per-process samples newer than `last_seen_us`
    /// (none newer is an empty answer).
    fn nvml_process_samples(&self, device: NvmlDevice, last_seen_us: u64) -> Result<Vec<Sample>, SamplesError>;
    /// `nvmlSystemGetDriverVersion`.
    fn nvml_driver_version(&self) -> Option<String>;
}

/// The calling thread's stream-capture interaction mode set to relaxed while this lives
/// (`cuThreadExchangeStreamCaptureMode`), and given back when it is dropped, by a panic's
/// unwinding too: the shim's own event calls must never invalidate a capture the program
/// has under way in this or another thread (CUDA forbids "potentially unsafe" calls during
/// a capture in the default global mode), and the program's mode must never stay changed.
pub struct RelaxedCapture<'a, D: CudaDriver> {
    driver: &'a D,
    /// The mode to give back; `None` when the driver refused the exchange.
    previous: Option<u32>,
}

impl<'a, D: CudaDriver> RelaxedCapture<'a, D> {
    pub fn new(driver: &'a D) -> Self {
        RelaxedCapture { driver, previous: driver.exchange_capture_mode(CU_STREAM_CAPTURE_MODE_RELAXED) }
    }
}

impl<D: CudaDriver> Drop for RelaxedCapture<'_, D> {
    fn drop(&mut self) {
        if let Some(mode) = self.previous.take() {
            let _ = self.driver.exchange_capture_mode(mode);
        }
    }
}

/// Runs `f` with the calling thread's capture mode relaxed ([`RelaxedCapture`]).
pub fn relaxed<D: CudaDriver, T>(driver: &D, f: impl FnOnce() -> T) -> T {
    let _relaxed = RelaxedCapture::new(driver);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fake::{serial, State, FAKE};

    /// The capture mode the program had comes back, after the closure and after a panic in it.
    #[test]
    fn relaxed_capture_is_given_back_even_after_a_panic() {
        let _serial = serial();
        FAKE.reset(State { capture_mode: 1, ..State::default() });
        let seen = relaxed(&FAKE, || FAKE.with(|s| s.capture_mode));
        assert_eq!(seen, CU_STREAM_CAPTURE_MODE_RELAXED);
        assert_eq!(FAKE.with(|s| (s.capture_mode, s.mode_exchanges)), (1, 2));
        let unwound = std::panic::catch_unwind(|| relaxed(&FAKE, || panic!("a bug in the closure")));
        assert!(unwound.is_err());
        assert_eq!(FAKE.with(|s| (s.capture_mode, s.mode_exchanges)), (1, 4), "restored by the unwinding");
    }
}
