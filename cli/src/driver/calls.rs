//! The driver's functions as the tools call them: the one module of `fgpu-cli` that may use
//! `unsafe` (the crate is `#![deny(unsafe_code)]`, this module opts in), rustix style: each
//! function is found under the name of its C prototype in `fgpu-abi`
//! (`fgpu_abi::prototypes::proto`, checked against `cuda.h` and `nvml.h`), and each call is a
//! safe method that names the C call it models and turns out-parameters into return values.
//!
//! The libraries are opened with `fgpu_core::sys::host::dlopen`, and every function is looked
//! up with glibc's own `dlsym` (`Library::symbol`), never through a `dlsym` a preloaded
//! library defines: fgpu's front hands out its own wrappers, and the tools must see the
//! driver as it is (`probe.rs`).

use fgpu_abi::cuda::{CUresult, CUDA_SUCCESS};
use fgpu_abi::nvml::{
    NvmlDevice, NvmlEventData, NvmlEventSet, NvmlMemory, NvmlProcessInfoV1, NvmlReturn, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_SUCCESS,
};
use fgpu_abi::prototypes::proto;
use fgpu_core::sys::host::{dlopen, Library, LoadError};
use std::ffi::c_char;
use std::marker::PhantomData;

/// `lookup!(library, name)`: the driver's `name` as the function pointer type
/// `proto::name`, or `None` when the library lacks it. The name and the type come from the
/// one identifier, so they cannot disagree.
macro_rules! lookup {
    ($library:expr, $name:ident) => {
        $library.symbol(&std::ffi::CString::new(stringify!($name)).expect("a C identifier")).map(|address| {
            // SAFETY: `address` is the driver's `$name`, whose C prototype is
            // `proto::$name` (fgpu-abi, checked against NVIDIA's headers); a function
            // pointer and a data pointer have the same size on every target fgpu supports.
            unsafe { std::mem::transmute::<*mut std::ffi::c_void, proto::$name>(address.as_ptr()) }
        })
    };
}

/// A string NVML wrote into `buf`, up to its NUL.
fn c_buffer_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `CUresult` as a `Result`.
fn cuda(rc: CUresult) -> Result<(), CUresult> {
    if rc == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

/// `nvmlReturn_t` as a `Result`.
fn nvml(rc: NvmlReturn) -> Result<(), NvmlReturn> {
    if rc == NVML_SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

/// `libcuda.so.1` and the functions of it the tools call.
pub struct Cuda {
    _library: Library,
    init: Option<proto::cuInit>,
    driver_get_version: Option<proto::cuDriverGetVersion>,
    device_get_count: Option<proto::cuDeviceGetCount>,
}

impl Cuda {
    /// `dlopen("libcuda.so.1")`, or the loader's message.
    pub fn open() -> Result<Cuda, LoadError> {
        let library = dlopen(c"libcuda.so.1")?;
        Ok(Cuda {
            init: lookup!(library, cuInit),
            driver_get_version: lookup!(library, cuDriverGetVersion),
            device_get_count: lookup!(library, cuDeviceGetCount),
            _library: library,
        })
    }

    /// `cuInit(0)`; `None` when the library has no `cuInit`.
    pub fn init(&self) -> Option<Result<(), CUresult>> {
        // SAFETY: models cuInit(unsigned int Flags) with Flags 0, the only value cuda.h allows.
        self.init.map(|f| cuda(unsafe { f(0) }))
    }

    /// `cuDriverGetVersion(int *)`: the CUDA version the driver supports (12080 for 12.8).
    pub fn driver_version(&self) -> Option<i32> {
        let f = self.driver_get_version?;
        let mut version = 0;
        // SAFETY: models cuDriverGetVersion(int *driverVersion) with a live local.
        cuda(unsafe { f(&mut version) }).ok().map(|()| version)
    }

    /// `cuDeviceGetCount(int *)`, after [`Cuda::init`] succeeded.
    pub fn device_count(&self) -> Option<i32> {
        let f = self.device_get_count?;
        let mut count = 0;
        // SAFETY: models cuDeviceGetCount(int *count) with a live local.
        cuda(unsafe { f(&mut count) }).ok().map(|()| count)
    }
}

/// `libnvidia-ml.so.1` and the functions of it the tools call. NVML is thread-safe (nvml.h:
/// "NVML is thread-safe so it is safe to make simultaneous NVML calls from multiple
/// threads"), so one may be shared between threads.
pub struct Nvml {
    _library: Library,
    init: Option<proto::nvmlInit_v2>,
    shutdown: Option<proto::nvmlShutdown>,
    system_get_driver_version: Option<proto::nvmlSystemGetDriverVersion>,
    system_get_cuda_driver_version: Option<proto::nvmlSystemGetCudaDriverVersion_v2>,
    device_get_count: Option<proto::nvmlDeviceGetCount_v2>,
    device_get_handle_by_index: Option<proto::nvmlDeviceGetHandleByIndex_v2>,
    device_get_uuid: Option<proto::nvmlDeviceGetUUID>,
    device_get_name: Option<proto::nvmlDeviceGetName>,
    device_get_minor_number: Option<proto::nvmlDeviceGetMinorNumber>,
    device_get_memory_info: Option<proto::nvmlDeviceGetMemoryInfo>,
    device_get_compute_running_processes: Option<proto::nvmlDeviceGetComputeRunningProcesses>,
    device_get_supported_event_types: Option<proto::nvmlDeviceGetSupportedEventTypes>,
    event_set_create: Option<proto::nvmlEventSetCreate>,
    device_register_events: Option<proto::nvmlDeviceRegisterEvents>,
    event_set_wait: Option<proto::nvmlEventSetWait_v2>,
    event_set_free: Option<proto::nvmlEventSetFree>,
}

/// A device handle NVML gave ([`Nvml::device`]), valid while the [`Nvml`] it came from is.
#[derive(Clone, Copy)]
pub struct Device<'a> {
    handle: NvmlDevice,
    _nvml: PhantomData<&'a Nvml>,
}

impl<'a> Device<'a> {
    /// The handle as NVML gave it, for the MIG calls beside this module (`mig.rs`).
    pub(super) fn raw(self) -> NvmlDevice {
        self.handle
    }

    /// A handle NVML gave through `nvml` (a MIG device's, from `mig.rs`).
    pub(super) fn from_raw(handle: NvmlDevice, _nvml: &'a Nvml) -> Device<'a> {
        Device { handle, _nvml: PhantomData }
    }
}

/// Why [`Nvml::compute_processes`] gave no list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListError {
    /// The library has no `nvmlDeviceGetComputeRunningProcesses`.
    Missing,
    /// `NVML_ERROR_INSUFFICIENT_SIZE`: the list has this many entries now.
    TooSmall(u32),
    /// Another `nvmlReturn_t`.
    Failed(NvmlReturn),
}

impl Nvml {
    /// `dlopen("libnvidia-ml.so.1")`, or the loader's message. Each versioned function
    /// falls back to its unversioned name, which a driver older than the `_v2` has (the
    /// same C prototype).
    pub fn open() -> Result<Nvml, LoadError> {
        let library = dlopen(c"libnvidia-ml.so.1")?;
        Ok(Nvml {
            init: lookup!(library, nvmlInit_v2).or_else(|| lookup!(library, nvmlInit)),
            shutdown: lookup!(library, nvmlShutdown),
            system_get_driver_version: lookup!(library, nvmlSystemGetDriverVersion),
            system_get_cuda_driver_version: lookup!(library, nvmlSystemGetCudaDriverVersion_v2).or_else(|| lookup!(library, nvmlSystemGetCudaDriverVersion)),
            device_get_count: lookup!(library, nvmlDeviceGetCount_v2).or_else(|| lookup!(library, nvmlDeviceGetCount)),
            device_get_handle_by_index: lookup!(library, nvmlDeviceGetHandleByIndex_v2),
            device_get_uuid: lookup!(library, nvmlDeviceGetUUID),
            device_get_name: lookup!(library, nvmlDeviceGetName),
            device_get_minor_number: lookup!(library, nvmlDeviceGetMinorNumber),
            device_get_memory_info: lookup!(library, nvmlDeviceGetMemoryInfo),
            // The unversioned name keeps the v1 entry (`nvmlProcessInfo_v1_t`).
            device_get_compute_running_processes: lookup!(library, nvmlDeviceGetComputeRunningProcesses),
            device_get_supported_event_types: lookup!(library, nvmlDeviceGetSupportedEventTypes),
            event_set_create: lookup!(library, nvmlEventSetCreate),
            device_register_events: lookup!(library, nvmlDeviceRegisterEvents),
            event_set_wait: lookup!(library, nvmlEventSetWait_v2),
            event_set_free: lookup!(library, nvmlEventSetFree),
            _library: library,
        })
    }

    /// `nvmlInit_v2()` (else `nvmlInit()`); `None` when the library has neither.
    pub fn init(&self) -> Option<Result<(), NvmlReturn>> {
        // SAFETY: models nvmlInit_v2(void).
        self.init.map(|f| nvml(unsafe { f() }))
    }

    /// `nvmlShutdown()`, after a successful [`Nvml::init`]. Takes the library: no handle of
    /// it may be used afterwards.
    pub fn shutdown(self) {
        if let Some(f) = self.shutdown {
            // SAFETY: models nvmlShutdown(void); `self` is consumed, so no Device outlives it.
            unsafe { f() };
        }
    }

    /// `nvmlSystemGetDriverVersion(char *, unsigned)`: the driver's version, such as `570.86`.
    pub fn driver_version(&self) -> Option<String> {
        let f = self.system_get_driver_version?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: models nvmlSystemGetDriverVersion(char *version, unsigned length) with a
        // live buffer and its length (nvml.h asks for 80).
        nvml(unsafe { f(buf.as_mut_ptr(), buf.len() as u32) }).ok().map(|()| c_buffer_to_string(&buf))
    }

    /// `nvmlSystemGetCudaDriverVersion_v2(int *)` (else the unversioned name).
    pub fn cuda_driver_version(&self) -> Option<i32> {
        let f = self.system_get_cuda_driver_version?;
        let mut version = 0;
        // SAFETY: models nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) with a live local.
        nvml(unsafe { f(&mut version) }).ok().map(|()| version)
    }

    /// `nvmlDeviceGetCount_v2(unsigned *)` (else `nvmlDeviceGetCount`); `None` when missing.
    pub fn device_count(&self) -> Option<Result<u32, NvmlReturn>> {
        let f = self.device_get_count?;
        let mut count = 0;
        // SAFETY: models nvmlDeviceGetCount_v2(unsigned *deviceCount) with a live local.
        Some(nvml(unsafe { f(&mut count) }).map(|()| count))
    }

    /// Whether devices can be named: the library has `nvmlDeviceGetHandleByIndex_v2` and
    /// `nvmlDeviceGetUUID`.
    pub fn can_name_devices(&self) -> bool {
        self.device_get_handle_by_index.is_some() && self.device_get_uuid.is_some()
    }

    /// Whether process lists can be asked: the library has a device count,
    /// `nvmlDeviceGetHandleByIndex_v2` and `nvmlDeviceGetComputeRunningProcesses`.
    pub fn can_list_processes(&self) -> bool {
        self.device_get_count.is_some() && self.device_get_handle_by_index.is_some() && self.device_get_compute_running_processes.is_some()
    }

    /// `nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *)`.
    pub fn device(&self, index: u32) -> Option<Result<Device<'_>, NvmlReturn>> {
        let f = self.device_get_handle_by_index?;
        let mut handle: NvmlDevice = std::ptr::null_mut();
        // SAFETY: models nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device)
        // with a live local; NVML checks the index.
        Some(nvml(unsafe { f(index, &mut handle) }).map(|()| Device { handle, _nvml: PhantomData }))
    }

    /// `nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned)`: `GPU-...`.
    pub fn uuid(&self, device: Device<'_>) -> Option<String> {
        let f = self.device_get_uuid?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: models nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length)
        // with a handle NVML gave and a live buffer with its length (nvml.h asks for 80).
        nvml(unsafe { f(device.handle, buf.as_mut_ptr(), buf.len() as u32) }).ok().map(|()| c_buffer_to_string(&buf))
    }

    /// `nvmlDeviceGetMinorNumber(nvmlDevice_t, unsigned *)`: N of the GPU's `/dev/nvidiaN`,
    /// which also numbers it in `/proc/driver/nvidia-caps/mig-minors` (`gpuN/...`).
    pub fn minor_number(&self, device: Device<'_>) -> Option<u32> {
        let f = self.device_get_minor_number?;
        let mut minor = 0;
        // SAFETY: models nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned *minorNumber)
        // with a handle NVML gave and a live local.
        nvml(unsafe { f(device.handle, &mut minor) }).ok().map(|()| minor)
    }

    /// `nvmlDeviceGetName(nvmlDevice_t, char *, unsigned)`: the product's name.
    pub fn name(&self, device: Device<'_>) -> Option<String> {
        let f = self.device_get_name?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: models nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length)
        // with a handle NVML gave and a live buffer with its length (nvml.h asks for 96).
        nvml(unsafe { f(device.handle, buf.as_mut_ptr(), buf.len() as u32) }).ok().map(|()| c_buffer_to_string(&buf))
    }

    /// `nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *)`: total, free and used.
    pub fn memory(&self, device: Device<'_>) -> Option<NvmlMemory> {
        self.memory_result(device).ok()
    }

    /// [`Nvml::memory`] with NVML's code when it fails (`NVML_ERROR_FUNCTION_NOT_FOUND` when
    /// the library lacks the function). The call needs the GPU itself: a GPU that fell off
    /// the bus answers `NVML_ERROR_GPU_IS_LOST`.
    pub fn memory_result(&self, device: Device<'_>) -> Result<NvmlMemory, NvmlReturn> {
        let f = self.device_get_memory_info.ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
        let mut memory = NvmlMemory::default();
        // SAFETY: models nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
        // with a handle NVML gave and a live nvmlMemory_t.
        nvml(unsafe { f(device.handle, &mut memory) }).map(|()| memory)
    }

    /// The first function of NVML's event API the library lacks, if any.
    pub fn missing_event_api(&self) -> Option<&'static str> {
        [
            ("nvmlDeviceGetSupportedEventTypes", self.device_get_supported_event_types.is_none()),
            ("nvmlEventSetCreate", self.event_set_create.is_none()),
            ("nvmlDeviceRegisterEvents", self.device_register_events.is_none()),
            ("nvmlEventSetWait_v2", self.event_set_wait.is_none()),
            ("nvmlEventSetFree", self.event_set_free.is_none()),
        ]
        .into_iter()
        .find_map(|(name, missing)| missing.then_some(name))
    }

    /// `nvmlDeviceGetSupportedEventTypes(nvmlDevice_t, unsigned long long *)`: the event
    /// types the device reports. The event calls answer `NVML_ERROR_FUNCTION_NOT_FOUND` when
    /// the library lacks the function ([`Nvml::missing_event_api`]).
    pub fn supported_event_types(&self, device: Device<'_>) -> Result<u64, NvmlReturn> {
        let f = self.device_get_supported_event_types.ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
        let mut types = 0u64;
        // SAFETY: models nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long
        // long *eventTypes) with a handle NVML gave and a live local.
        nvml(unsafe { f(device.handle, &mut types) }).map(|()| types)
    }

    /// `nvmlEventSetCreate(nvmlEventSet_t *)`: an empty set, freed when dropped.
    pub fn event_set(&self) -> Result<EventSet<'_>, NvmlReturn> {
        let f = self.event_set_create.ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
        let mut set: NvmlEventSet = std::ptr::null_mut();
        // SAFETY: models nvmlEventSetCreate(nvmlEventSet_t *set) with a live local.
        nvml(unsafe { f(&mut set) })?;
        Ok(EventSet { set, free: self.event_set_free, _nvml: PhantomData })
    }

    /// `nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long, nvmlEventSet_t)`: from
    /// now on, the `types` events of `device` are recorded in `set`.
    pub fn register_events(&self, device: Device<'_>, types: u64, set: &EventSet<'_>) -> Result<(), NvmlReturn> {
        let f = self.device_register_events.ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
        // SAFETY: models nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long
        // eventTypes, nvmlEventSet_t set) with a handle NVML gave and a set it gave, not freed
        // (an EventSet frees its set when dropped, and `set` is borrowed).
        nvml(unsafe { f(device.handle, types, set.set) })
    }

    /// `nvmlEventSetWait_v2(nvmlEventSet_t, nvmlEventData_t *, unsigned)`: the next event of
    /// `set`, waiting up to `timeout_ms`: `NVML_ERROR_TIMEOUT` when none came,
    /// `NVML_ERROR_GPU_IS_LOST` when a GPU of the set fell off the bus.
    pub fn wait(&self, set: &EventSet<'_>, timeout_ms: u32) -> Result<NvmlEventData, NvmlReturn> {
        let f = self.event_set_wait.ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
        let mut data = NvmlEventData::default();
        // SAFETY: models nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
        // unsigned int timeoutms) with a live set NVML gave and a live nvmlEventData_t, the
        // layout the _v2 name writes (fgpu-abi's, checked against nvml.h).
        nvml(unsafe { f(set.set, &mut data, timeout_ms) }).map(|()| data)
    }

    /// `nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)`
    /// with room for `room` entries: the processes running compute work on the device.
    pub fn compute_processes(&self, device: Device<'_>, room: usize) -> Result<Vec<NvmlProcessInfoV1>, ListError> {
        let f = self.device_get_compute_running_processes.ok_or(ListError::Missing)?;
        let mut entries = vec![NvmlProcessInfoV1::default(); room];
        let mut count = u32::try_from(room).unwrap_or(u32::MAX);
        // SAFETY: models nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned
        // *infoCount, nvmlProcessInfo_v1_t *infos) with a handle NVML gave and `count` set to
        // the number of entries the live buffer holds.
        match unsafe { f(device.handle, &mut count, entries.as_mut_ptr()) } {
            NVML_SUCCESS => {
                entries.truncate((count as usize).min(room));
                Ok(entries)
            }
            NVML_ERROR_INSUFFICIENT_SIZE => Err(ListError::TooSmall(count)),
            rc => Err(ListError::Failed(rc)),
        }
    }
}

/// An NVML event set ([`Nvml::event_set`]), freed when dropped.
pub struct EventSet<'a> {
    set: NvmlEventSet,
    free: Option<proto::nvmlEventSetFree>,
    _nvml: PhantomData<&'a Nvml>,
}

impl Drop for EventSet<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.free {
            // SAFETY: models nvmlEventSetFree(nvmlEventSet_t set) with the set
            // nvmlEventSetCreate gave, once: the set is dropped once, and no wait can be in
            // flight on it (a wait borrows it).
            unsafe { f(self.set) };
        }
    }
}

impl Device<'_> {
    /// Whether `handle` (the device an event names) is this device.
    pub fn is(&self, handle: NvmlDevice) -> bool {
        self.handle == handle
    }
}
