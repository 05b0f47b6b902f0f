//! `fgpu __nvml-events`: watches the GPUs' health through NVML and prints one JSON line per
//! thing seen, for as long as it runs. The DRA driver (`fgpu-kubelet-plugin`) runs it as a
//! child process and restarts it when it stops (docs/kubernetes.md, Device health): the
//! driver library then never runs inside the plugin, and a driver call that hangs or
//! crashes takes this process with it, not the plugin.
//!
//! It registers every GPU for XID errors (`nvmlEventTypeXidCriticalError`, where the GPU
//! supports it) in one event set, then waits on the set (`nvmlEventSetWait_v2`, a second at
//! a time), and looks once a second whether each GPU still answers (a GPU that fell off the
//! bus answers `NVML_ERROR_GPU_IS_LOST`). The lines, each a JSON object with `"event"`:
//!
//! - `gpu`: one per GPU at the start: `index`, `uuid`, `monitored` (XIDs registered), and
//!   `reason` when not (the GPU does not support XID events, or registering failed);
//! - `ready`: the start is done (`gpus`: how many);
//! - `xid`: an XID error: `index`, `uuid`, `xid`, `gpuInstanceId`, `computeInstanceId`
//!   (0xFFFFFFFF for the whole GPU);
//! - `lost` and `back`: a GPU stopped answering (`NVML_ERROR_GPU_IS_LOST`), or answers again
//!   (`index`, `uuid` where known, `code`: the NVML return code seen);
//! - `alive`: every 5 s, so a reader can tell a hung driver from a quiet one;
//! - `error`: NVML cannot be loaded or initialised (then it exits 1), or a wait failed
//!   (`code`, `message`).
//!
//! NVML only delivers the events that happen while a set is registered: XIDs raised while
//! this process is not running are not seen. It exits 0 when its output is closed (the
//! reader is gone). As `fgpu __driver-probe`, it finds every driver function with glibc's own
//! `dlsym` (`driver_probe::Library`), so a preloaded shim never answers for the driver.

use crate::driver_probe::Library;
use fgpu_abi::nvml::{NvmlDevice, NvmlEventData, NvmlEventSet, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_TIMEOUT, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, NVML_SUCCESS};
use fgpu_abi::prototypes::proto;
use serde_json::{json, Value};
use std::ffi::c_char;
use std::io::Write;
use std::time::{Duration, Instant};

/// How long one wait on the event set lasts, and how often the GPUs are looked at.
const LOOK: Duration = Duration::from_secs(1);
/// How often `alive` is printed.
const ALIVE: Duration = Duration::from_secs(5);
/// At most this many GPUs are watched (more than any machine has).
const MAX_GPUS: u32 = 64;

/// The NVML functions this command calls.
struct Nvml {
    _library: Library,
    count: proto::nvmlDeviceGetCount_v2,
    handle: proto::nvmlDeviceGetHandleByIndex_v2,
    uuid: proto::nvmlDeviceGetUUID,
    memory: proto::nvmlDeviceGetMemoryInfo,
    supported: proto::nvmlDeviceGetSupportedEventTypes,
    create: proto::nvmlEventSetCreate,
    register: proto::nvmlDeviceRegisterEvents,
    wait: proto::nvmlEventSetWait_v2,
}

fn load() -> Result<Nvml, String> {
    let library = Library::open(c"libnvidia-ml.so.1").map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
    // SAFETY: each type is the prototype of the function named (fgpu-abi's, checked against
    // nvml.h by tests/integration/abi_layout.rs).
    unsafe {
        let missing = |name: &str| format!("libnvidia-ml.so.1 has no {name}");
        let init = library.get::<proto::nvmlInit_v2>(c"nvmlInit_v2").ok_or_else(|| missing("nvmlInit_v2"))?;
        let nvml = Nvml {
            count: library.get(c"nvmlDeviceGetCount_v2").ok_or_else(|| missing("nvmlDeviceGetCount_v2"))?,
            handle: library.get(c"nvmlDeviceGetHandleByIndex_v2").ok_or_else(|| missing("nvmlDeviceGetHandleByIndex_v2"))?,
            uuid: library.get(c"nvmlDeviceGetUUID").ok_or_else(|| missing("nvmlDeviceGetUUID"))?,
            memory: library.get(c"nvmlDeviceGetMemoryInfo").ok_or_else(|| missing("nvmlDeviceGetMemoryInfo"))?,
            supported: library.get(c"nvmlDeviceGetSupportedEventTypes").ok_or_else(|| missing("nvmlDeviceGetSupportedEventTypes"))?,
            create: library.get(c"nvmlEventSetCreate").ok_or_else(|| missing("nvmlEventSetCreate"))?,
            register: library.get(c"nvmlDeviceRegisterEvents").ok_or_else(|| missing("nvmlDeviceRegisterEvents"))?,
            wait: library.get(c"nvmlEventSetWait_v2").ok_or_else(|| missing("nvmlEventSetWait_v2"))?,
            _library: library,
        };
        match init() {
            NVML_SUCCESS => Ok(nvml),
            rc => Err(format!("nvmlInit_v2 failed with NVML error {rc}")),
        }
    }
}

/// One GPU as this command knows it.
struct Gpu {
    index: u32,
    /// None while it has not answered since the start.
    handle: Option<NvmlDevice>,
    uuid: Option<String>,
    lost: bool,
    /// XID events registered in the set.
    monitored: bool,
}

impl Nvml {
    fn handle(&self, index: u32) -> Result<NvmlDevice, u32> {
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: models nvmlDeviceGetHandleByIndex_v2 with a pointer to a live local.
        match unsafe { (self.handle)(index, &mut device) } {
            NVML_SUCCESS => Ok(device),
            rc => Err(rc),
        }
    }

    fn uuid(&self, device: NvmlDevice) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: models nvmlDeviceGetUUID with a handle NVML gave and a buffer of the
        // length passed (NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96).
        if unsafe { (self.uuid)(device, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
            return None;
        }
        let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Whether the GPU answers: a call that needs the GPU itself (its memory figures).
    fn answers(&self, device: NvmlDevice) -> u32 {
        let mut memory = fgpu_abi::nvml::NvmlMemory::default();
        // SAFETY: models nvmlDeviceGetMemoryInfo with a handle NVML gave and a live local.
        unsafe { (self.memory)(device, &mut memory) }
    }

    /// Registers XID events of `device` in `set`; why not, when it cannot.
    fn register(&self, device: NvmlDevice, set: NvmlEventSet) -> Result<(), String> {
        let mut supported = 0u64;
        // SAFETY: models nvmlDeviceGetSupportedEventTypes with a live local.
        let rc = unsafe { (self.supported)(device, &mut supported) };
        if rc != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetSupportedEventTypes failed with NVML error {rc}"));
        }
        if supported & NVML_EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
            return Err("the GPU does not report XID events".into());
        }
        // SAFETY: models nvmlDeviceRegisterEvents with a handle and a set NVML gave.
        match unsafe { (self.register)(device, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, set) } {
            NVML_SUCCESS => Ok(()),
            rc => Err(format!("nvmlDeviceRegisterEvents failed with NVML error {rc}")),
        }
    }
}

/// Writes one line; false when the reader is gone.
fn say(out: &mut impl Write, line: Value) -> bool {
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

fn gpu_line(event: &str, gpu: &Gpu) -> Value {
    json!({"event": event, "index": gpu.index, "uuid": gpu.uuid})
}

/// Looks at GPU `gpu` once: says when it was lost or came back, and registers it when it
/// answers for the first time or again.
fn look_at(nvml: &Nvml, set: NvmlEventSet, gpu: &mut Gpu, out: &mut impl Write) -> bool {
    let rc = match gpu.handle {
        Some(device) => nvml.answers(device),
        None => match nvml.handle(gpu.index) {
            Ok(device) => {
                gpu.handle = Some(device);
                gpu.uuid = gpu.uuid.take().or_else(|| nvml.uuid(device));
                nvml.answers(device)
            }
            Err(rc) => rc,
        },
    };
    let lost = rc == NVML_ERROR_GPU_IS_LOST;
    if lost == gpu.lost {
        return true;
    }
    gpu.lost = lost;
    if lost {
        let mut line = gpu_line("lost", gpu);
        line["code"] = rc.into();
        return say(out, line);
    }
    // Back: a GPU that was reset or attached again is registered again.
    if let Some(device) = gpu.handle {
        gpu.monitored = nvml.register(device, set).is_ok();
    }
    let mut line = gpu_line("back", gpu);
    line["code"] = rc.into();
    line["monitored"] = gpu.monitored.into();
    say(out, line)
}

fn watch(nvml: &Nvml, out: &mut impl Write) -> i32 {
    let mut count = 0u32;
    // SAFETY: models nvmlDeviceGetCount_v2 with a pointer to a live local.
    let rc = unsafe { (nvml.count)(&mut count) };
    if rc != NVML_SUCCESS {
        say(out, json!({"event": "error", "code": rc, "message": format!("nvmlDeviceGetCount_v2 failed with NVML error {rc}")}));
        return 1;
    }
    let mut set: NvmlEventSet = std::ptr::null_mut();
    // SAFETY: models nvmlEventSetCreate with a pointer to a live local.
    let rc = unsafe { (nvml.create)(&mut set) };
    if rc != NVML_SUCCESS {
        say(out, json!({"event": "error", "code": rc, "message": format!("nvmlEventSetCreate failed with NVML error {rc}")}));
        return 1;
    }
    let mut gpus = Vec::new();
    for index in 0..count.min(MAX_GPUS) {
        let mut gpu = Gpu { index, handle: None, uuid: None, lost: false, monitored: false };
        let mut line = match nvml.handle(index) {
            Ok(device) => {
                gpu.handle = Some(device);
                gpu.uuid = nvml.uuid(device);
                let registered = nvml.register(device, set);
                gpu.monitored = registered.is_ok();
                let mut line = gpu_line("gpu", &gpu);
                if let Err(why) = registered {
                    line["reason"] = why.into();
                }
                line
            }
            Err(rc) => {
                let mut line = gpu_line("gpu", &gpu);
                line["reason"] = format!("nvmlDeviceGetHandleByIndex_v2 failed with NVML error {rc}").into();
                line
            }
        };
        line["monitored"] = gpu.monitored.into();
        if !say(out, line) {
            return 0;
        }
        gpus.push(gpu);
    }
    for gpu in &mut gpus {
        if !look_at(nvml, set, gpu, out) {
            return 0;
        }
    }
    if !say(out, json!({"event": "ready", "gpus": gpus.len()})) {
        return 0;
    }
    let (mut last_look, mut last_alive) = (Instant::now(), Instant::now());
    let mut last_error: Option<Instant> = None;
    loop {
        let mut data = NvmlEventData::default();
        // SAFETY: models nvmlEventSetWait_v2 with the set NVML gave and a live local.
        let rc = unsafe { (nvml.wait)(set, &mut data, LOOK.as_millis() as u32) };
        match rc {
            NVML_SUCCESS if data.event_type & NVML_EVENT_TYPE_XID_CRITICAL_ERROR != 0 => {
                let gpu = gpus.iter().find(|g| g.handle == Some(data.device));
                let line = json!({
                    "event": "xid",
                    "index": gpu.map(|g| g.index),
                    "uuid": gpu.and_then(|g| g.uuid.clone()).or_else(|| nvml.uuid(data.device)),
                    "xid": data.event_data,
                    "gpuInstanceId": data.gpu_instance_id,
                    "computeInstanceId": data.compute_instance_id,
                });
                if !say(out, line) {
                    return 0;
                }
            }
            NVML_SUCCESS | NVML_ERROR_TIMEOUT => {}
            // A GPU of the set was lost: the look below finds which.
            NVML_ERROR_GPU_IS_LOST => last_look = Instant::now() - LOOK,
            rc => {
                // Said at most once a minute; the wait is tried again after a pause.
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    last_error = Some(Instant::now());
                    if !say(out, json!({"event": "error", "code": rc, "message": format!("nvmlEventSetWait_v2 failed with NVML error {rc}")})) {
                        return 0;
                    }
                }
                std::thread::sleep(LOOK);
            }
        }
        if last_look.elapsed() >= LOOK {
            last_look = Instant::now();
            for gpu in &mut gpus {
                if !look_at(nvml, set, gpu, out) {
                    return 0;
                }
            }
        }
        if last_alive.elapsed() >= ALIVE {
            last_alive = Instant::now();
            if !say(out, json!({"event": "alive"})) {
                return 0;
            }
        }
    }
}

pub fn main() -> i32 {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match load() {
        Ok(nvml) => watch(&nvml, &mut out),
        Err(e) => {
            say(&mut out, json!({"event": "error", "message": e}));
            1
        }
    }
}
