//! A programmable driver for the shim's unit tests (`cargo test` builds call it instead of
//! the real one: `instance.rs`). One per test binary: a test takes [`serial`] first, then
//! sets up what it needs with [`Fake::reset`] and [`Fake::with`].

use super::seam::{Capture, CudaDriver, EventState, NvmlDriver, SamplesError};
use crate::abi::cuda::*;
use crate::abi::nvml::*;
use fgpu_core::compute::Sample;
use fgpu_core::uuid::DeviceUuid;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

/// What the fake driver holds and answers.
pub struct State {
    /// By ordinal: (UUID, memory). Other ordinals do not exist. NVML lists them in this
    /// order, as handles 1, 2, ...
    pub devices: Vec<(DeviceUuid, u64)>,
    /// The device of the calling thread's context (every thread's).
    pub current: CUdevice,
    /// `cuCtxGetCurrent`'s answer.
    pub context: usize,
    /// What `cuEventQuery` says of each event created; new events are `Pending`.
    pub events: HashMap<usize, EventState>,
    pub next_event: usize,
    /// Events destroyed, in order.
    pub destroyed: Vec<usize>,
    /// Events recorded, in order.
    pub recorded: Vec<usize>,
    /// What `cuEventElapsedTime` says of any two events.
    pub elapsed_ns: Option<u64>,
    pub capture: Capture,
    /// The calling threads' capture interaction mode, and how often it was exchanged.
    pub capture_mode: u32,
    pub mode_exchanges: u32,
    /// `cuMemPoolGetAttribute` and `cuDeviceGetGraphMemAttribute`: (pool or ordinal, attribute).
    pub attributes: HashMap<(usize, u32), u64>,
    /// Whether NVML answers at all.
    pub nvml: bool,
    pub samples: Result<Vec<Sample>, SamplesError>,
}

impl Default for State {
    fn default() -> State {
        State {
            devices: Vec::new(),
            current: 0,
            context: 0x1000,
            events: HashMap::new(),
            next_event: 0x10,
            destroyed: Vec::new(),
            recorded: Vec::new(),
            elapsed_ns: None,
            capture: Capture::No,
            capture_mode: 0,
            mode_exchanges: 0,
            attributes: HashMap::new(),
            nvml: false,
            samples: Ok(Vec::new()),
        }
    }
}

pub struct Fake {
    state: Mutex<Option<State>>,
}

pub static FAKE: Fake = Fake { state: Mutex::new(None) };

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests that use the fake (there is one per test binary).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fake {
    /// Starts over with `state`.
    pub fn reset(&self, state: State) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
    }

    /// Reads or changes the fake's state.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.get_or_insert_with(State::default))
    }
}

impl CudaDriver for Fake {
    fn device_uuid(&self, ordinal: CUdevice) -> Result<DeviceUuid, CUresult> {
        self.with(|s| s.devices.get(ordinal as usize).map(|d| d.0).ok_or(CUDA_ERROR_INVALID_VALUE))
    }

    fn device_total_mem(&self, ordinal: CUdevice) -> Result<u64, CUresult> {
        self.with(|s| s.devices.get(ordinal as usize).map(|d| d.1).ok_or(CUDA_ERROR_INVALID_VALUE))
    }

    fn context_device(&self) -> Result<CUdevice, CUresult> {
        Ok(self.with(|s| s.current))
    }

    fn current_context(&self) -> Option<CUcontext> {
        self.with(|s| (s.context != 0).then_some(s.context as CUcontext))
    }

    fn primary_context_active(&self, _ordinal: CUdevice) -> Option<bool> {
        Some(false)
    }

    fn device_mem_pool(&self, ordinal: CUdevice) -> Option<CUmemoryPool> {
        Some((0x100 + ordinal as usize) as CUmemoryPool)
    }

    fn mem_pool_attribute(&self, pool: CUmemoryPool, attribute: u32) -> Option<u64> {
        self.with(|s| s.attributes.get(&(pool as usize, attribute)).copied())
    }

    fn graph_mem_attribute(&self, ordinal: CUdevice, attribute: u32) -> Option<u64> {
        self.with(|s| s.attributes.get(&(ordinal as usize, attribute)).copied())
    }

    fn graph_nodes(&self, _graph: CUgraph) -> Option<Vec<CUgraphNode>> {
        None
    }

    fn graph_node_type(&self, _node: CUgraphNode) -> Option<u32> {
        None
    }

    fn mem_alloc_node_params(&self, _node: CUgraphNode) -> Option<Result<CudaMemAllocNodeParams, CUresult>> {
        None
    }

    fn array_size(&self, _array: *mut c_void, _mipmapped: bool, _ordinal: CUdevice) -> Option<u64> {
        None
    }

    fn event_create(&self) -> Option<CUevent> {
        self.with(|s| {
            s.next_event += 1;
            s.events.insert(s.next_event, EventState::Pending);
            Some(s.next_event as CUevent)
        })
    }

    fn event_record(&self, event: CUevent, _stream: CUstream, _ptsz: bool) -> bool {
        self.with(|s| s.recorded.push(event as usize));
        true
    }

    fn event_query(&self, event: CUevent) -> EventState {
        self.with(|s| s.events.get(&(event as usize)).copied().unwrap_or(EventState::Failed))
    }

    fn event_elapsed_ns(&self, _start: CUevent, _end: CUevent) -> Option<u64> {
        self.with(|s| s.elapsed_ns)
    }

    fn event_destroy(&self, event: CUevent) {
        self.with(|s| s.destroyed.push(event as usize));
    }

    fn stream_capturing(&self, _stream: CUstream, _ptsz: bool) -> Capture {
        self.with(|s| s.capture)
    }

    fn exchange_capture_mode(&self, mode: u32) -> Option<u32> {
        self.with(|s| {
            s.mode_exchanges += 1;
            Some(std::mem::replace(&mut s.capture_mode, mode))
        })
    }
}

impl NvmlDriver for Fake {
    fn nvml_ready(&self) -> bool {
        self.with(|s| s.nvml)
    }

    fn nvml_device_by_uuid(&self, uuid: &DeviceUuid) -> Option<NvmlDevice> {
        self.with(|s| s.nvml.then(|| s.devices.iter().position(|d| d.0 == *uuid)).flatten().map(|i| (i + 1) as NvmlDevice))
    }

    fn nvml_instance_ids(&self, _device: NvmlDevice) -> Option<(u32, u32)> {
        None
    }

    fn nvml_device_uuid(&self, device: NvmlDevice) -> Option<String> {
        let index = (device as usize).checked_sub(1)?;
        self.with(|s| s.devices.get(index).map(|d| d.0.to_string()))
    }

    fn nvml_all_uuids(&self) -> Result<Vec<String>, String> {
        self.with(|s| Ok(s.devices.iter().map(|d| d.0.to_string()).collect()))
    }

    fn nvml_memory(&self, _device: NvmlDevice) -> Option<NvmlMemory> {
        None
    }

    fn nvml_compute_processes(&self, _device: NvmlDevice) -> Option<Vec<NvmlProcessInfoV2>> {
        None
    }

    fn nvml_process_samples(&self, _device: NvmlDevice, _last_seen_us: u64) -> Result<Vec<Sample>, SamplesError> {
        self.with(|s| s.samples.clone())
    }

    fn nvml_driver_version(&self) -> Option<String> {
        None
    }
}
