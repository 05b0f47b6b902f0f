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
//! reader is gone). The driver is called through [`crate::driver::calls`], which finds every
//! function with glibc's own `dlsym`, so a preloaded shim never answers for the driver.

use crate::driver::calls::{Device, EventSet, Nvml};
use fgpu_abi::nvml::{NvmlReturn, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_TIMEOUT, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, NVML_SUCCESS};
use fgpu_core::sys::host::LoadError;
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

/// How long one wait on the event set lasts, and how often the GPUs are looked at.
const LOOK: Duration = Duration::from_secs(1);
/// How often `alive` is printed.
const ALIVE: Duration = Duration::from_secs(5);
/// At most this many GPUs are watched (more than any machine has).
const MAX_GPUS: u32 = 64;

/// Why NVML cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot load libnvidia-ml.so.1: {0}")]
    Load(#[from] LoadError),
    #[error("libnvidia-ml.so.1 has no {0}")]
    Missing(&'static str),
    #[error("{call} failed with NVML error {code}")]
    Failed { call: &'static str, code: NvmlReturn },
}

impl WatchError {
    /// NVML's return code, where a call failed.
    fn code(&self) -> Option<NvmlReturn> {
        match self {
            WatchError::Failed { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// NVML, opened and initialised, with the whole event API.
fn load() -> Result<Nvml, WatchError> {
    let nvml = Nvml::open()?;
    if let Some(name) = nvml.missing_event_api() {
        return Err(WatchError::Missing(name));
    }
    match nvml.init() {
        None => Err(WatchError::Missing("nvmlInit_v2")),
        Some(Err(code)) => Err(WatchError::Failed { call: "nvmlInit_v2", code }),
        Some(Ok(())) => Ok(nvml),
    }
}

/// One GPU as this command knows it.
struct Gpu<'a> {
    index: u32,
    /// None while it has not answered since the start.
    device: Option<Device<'a>>,
    uuid: Option<String>,
    lost: bool,
    /// XID events registered in the set.
    monitored: bool,
}

/// Registers XID events of `device` in `set`; why not, when it cannot.
fn register(nvml: &Nvml, device: Device<'_>, set: &EventSet<'_>) -> Result<(), RegisterError> {
    let supported = nvml.supported_event_types(device).map_err(RegisterError::Supported)?;
    if supported & NVML_EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
        return Err(RegisterError::NoXids);
    }
    nvml.register_events(device, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, set).map_err(RegisterError::Register)
}

/// Why a GPU's XID events cannot be watched.
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error("nvmlDeviceGetSupportedEventTypes failed with NVML error {0}")]
    Supported(NvmlReturn),
    #[error("the GPU does not report XID events")]
    NoXids,
    #[error("nvmlDeviceRegisterEvents failed with NVML error {0}")]
    Register(NvmlReturn),
}

/// NVML's answer to a call that needs the GPU itself (its memory figures).
fn answers(nvml: &Nvml, device: Device<'_>) -> NvmlReturn {
    nvml.memory_result(device).err().unwrap_or(NVML_SUCCESS)
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
fn look_at<'a>(nvml: &'a Nvml, set: &EventSet<'_>, gpu: &mut Gpu<'a>, out: &mut impl Write) -> bool {
    let rc = match gpu.device {
        Some(device) => answers(nvml, device),
        None => match nvml.device(gpu.index).unwrap_or(Err(NVML_ERROR_FUNCTION_NOT_FOUND)) {
            Ok(device) => {
                gpu.device = Some(device);
                gpu.uuid = gpu.uuid.take().or_else(|| nvml.uuid(device));
                answers(nvml, device)
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
    if let Some(device) = gpu.device {
        gpu.monitored = register(nvml, device, set).is_ok();
    }
    let mut line = gpu_line("back", gpu);
    line["code"] = rc.into();
    line["monitored"] = gpu.monitored.into();
    say(out, line)
}

/// The GPUs, each registered in `set` where it can be, with its `gpu` line said.
fn start<'a>(nvml: &'a Nvml, set: &EventSet<'_>, count: u32, out: &mut impl Write) -> Option<Vec<Gpu<'a>>> {
    let mut gpus = Vec::new();
    for index in 0..count.min(MAX_GPUS) {
        let mut gpu = Gpu { index, device: None, uuid: None, lost: false, monitored: false };
        let mut line = match nvml.device(index).unwrap_or(Err(NVML_ERROR_FUNCTION_NOT_FOUND)) {
            Ok(device) => {
                gpu.device = Some(device);
                gpu.uuid = nvml.uuid(device);
                let registered = register(nvml, device, set);
                gpu.monitored = registered.is_ok();
                let mut line = gpu_line("gpu", &gpu);
                if let Err(why) = registered {
                    line["reason"] = why.to_string().into();
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
            return None;
        }
        gpus.push(gpu);
    }
    for gpu in &mut gpus {
        if !look_at(nvml, set, gpu, out) {
            return None;
        }
    }
    Some(gpus)
}

/// Watches until the reader goes (0) or NVML cannot be watched (1, with an `error` line).
fn watch(nvml: &Nvml, out: &mut impl Write) -> i32 {
    let count = match nvml.device_count().unwrap_or(Err(NVML_ERROR_FUNCTION_NOT_FOUND)) {
        Ok(count) => count,
        Err(code) => return fail(out, &WatchError::Failed { call: "nvmlDeviceGetCount_v2", code }),
    };
    let set = match nvml.event_set() {
        Ok(set) => set,
        Err(code) => return fail(out, &WatchError::Failed { call: "nvmlEventSetCreate", code }),
    };
    let Some(mut gpus) = start(nvml, &set, count, out) else { return 0 };
    if !say(out, json!({"event": "ready", "gpus": gpus.len()})) {
        return 0;
    }
    let (mut last_look, mut last_alive) = (Instant::now(), Instant::now());
    let mut last_error: Option<Instant> = None;
    loop {
        match nvml.wait(&set, LOOK.as_millis() as u32) {
            Ok(data) if data.event_type & NVML_EVENT_TYPE_XID_CRITICAL_ERROR != 0 => {
                let gpu = gpus.iter().find(|g| g.device.is_some_and(|d| d.is(data.device)));
                let line = json!({
                    "event": "xid",
                    "index": gpu.map(|g| g.index),
                    "uuid": gpu.and_then(|g| g.uuid.clone()),
                    "xid": data.event_data,
                    "gpuInstanceId": data.gpu_instance_id,
                    "computeInstanceId": data.compute_instance_id,
                });
                if !say(out, line) {
                    return 0;
                }
            }
            Ok(_) | Err(NVML_ERROR_TIMEOUT) => {}
            // A GPU of the set was lost: the look below finds which.
            Err(NVML_ERROR_GPU_IS_LOST) => last_look = Instant::now() - LOOK,
            Err(code) => {
                // Said at most once a minute; the wait is tried again after a pause.
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    last_error = Some(Instant::now());
                    let e = WatchError::Failed { call: "nvmlEventSetWait_v2", code };
                    if !say(out, json!({"event": "error", "code": code, "message": e.to_string()})) {
                        return 0;
                    }
                }
                std::thread::sleep(LOOK);
            }
        }
        if last_look.elapsed() >= LOOK {
            last_look = Instant::now();
            for gpu in &mut gpus {
                if !look_at(nvml, &set, gpu, out) {
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

/// Says `e` in an `error` line: exit status 1.
fn fail(out: &mut impl Write, e: &WatchError) -> i32 {
    say(out, json!({"event": "error", "code": e.code(), "message": e.to_string()}));
    1
}

/// `fgpu __nvml-events`.
pub fn main() -> i32 {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match load() {
        Ok(nvml) => watch(&nvml, &mut out),
        Err(e) => fail(&mut out, &e),
    }
}
