//! NVML's event API (nvml.h, "Event Handling Methods") over the simulator's events
//! (`fgpu_sim_state::events`: XIDs and ECC errors that tests or `fgpu-sim-ctl` post, GPUs
//! that fall off the bus), and the inforom check.
//!
//! An event set lives in the process that made it: for each GPU registered, the event types
//! it records and the number of the next event it delivers (events posted before the
//! registration are not recorded, as nvml.h says). A wait delivers the first pending event
//! of a registered type, GPU by GPU in the order they were registered; a GPU lost since the
//! set last looked answers `NVML_ERROR_GPU_IS_LOST` once per loss, then the wait goes on as
//! usual (its calls keep answering `NVML_ERROR_GPU_IS_LOST` until it is recovered). Waits
//! sleep on the state's event word, so an event posted by any process wakes them at once.

use crate::boundary::*;
use fgpu_sim_state::events::{EventRead, SimEvent, EVENT_ALL, SUPPORTED_EVENTS};
use std::collections::BTreeMap;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) const NVML_ERROR_TIMEOUT: NvmlReturn = 10;

/// `nvmlEventData_t` (nvml.h, r450 and later: what `nvmlEventSetWait_v2` writes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlEventData {
    pub device: NvmlDevice,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlEventData_t` of drivers before r450, whose three fields the current one starts with:
/// what the unversioned `nvmlEventSetWait` writes, for callers built against those headers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlEventDataV1 {
    pub device: NvmlDevice,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
}

// The old struct is the new one's first three fields (abi_layout.rs checks the new one
// against nvml.h; no pinned header still declares the old one).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<NvmlEventDataV1>() == 24);
    assert!(offset_of!(NvmlEventDataV1, event_type) == offset_of!(NvmlEventData, event_type));
    assert!(offset_of!(NvmlEventDataV1, event_data) == offset_of!(NvmlEventData, event_data));
};

/// One GPU registered in a set.
#[derive(Clone, Copy)]
struct Registered {
    device: usize,
    types: u64,
    /// The number of the next event this set delivers.
    next: u64,
    /// The GPU's losses this set has reported.
    losses: u32,
}

/// The sets of this process, by handle (the address of a word of their own).
static SETS: Mutex<BTreeMap<usize, Vec<Registered>>> = Mutex::new(BTreeMap::new());

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<usize, Vec<Registered>>> {
    SETS.lock().unwrap_or_else(|e| e.into_inner())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // The handle is the address of a word of its own, freed with the set.
        let handle = Box::into_raw(Box::new(0u64)) as usize;
        sets().insert(handle, Vec::new());
        put(set, handle as *mut c_void);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if sets().remove(&(set as usize)).is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the address came from Box::into_raw in nvmlEventSetCreate and was just
        // removed from the sets, so it is freed once.
        drop(unsafe { Box::from_raw(set as *mut u64) });
        NVML_SUCCESS
    })
}

/// What a simulated GPU raises: XIDs and ECC errors. A MIG device handle answers
/// `NVML_ERROR_NOT_SUPPORTED` (nvml.h: no per-instance event reporting through MIG handles).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(h: NvmlDevice, types: *mut c_ulonglong) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if types.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(types, SUPPORTED_EVENTS);
        NVML_SUCCESS
    })
}

/// Starts recording `types` of GPU `h` in `set`, from now on. Types outside
/// `nvmlEventTypeAll` are invalid; a type the GPU does not raise makes the call answer
/// `NVML_ERROR_NOT_SUPPORTED` and register none of them (nvml.h).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(h: NvmlDevice, types: c_ulonglong, set: *mut c_void) -> NvmlReturn {
    guard(|| {
        let (s, device) = tri!(dev(h));
        if set.is_null() || types & !EVENT_ALL != 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mut sets = sets();
        let Some(registered) = sets.get_mut(&(set as usize)) else { return NVML_ERROR_INVALID_ARGUMENT };
        if types & !SUPPORTED_EVENTS != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        match registered.iter_mut().find(|r| r.device == device) {
            Some(r) => r.types |= types,
            None => registered.push(Registered { device, types, next: s.event_head(device), losses: s.gpu_losses(device) }),
        }
        NVML_SUCCESS
    })
}

/// What one look at a set found.
enum Found {
    Event(SimEvent),
    Lost,
    Nothing,
}

/// Looks at the set once: a loss not reported yet, else the first pending event of a type
/// it records. Moves the set past what it delivers and past events of other types.
fn look(s: &fgpu_sim_state::SimState, handle: usize) -> Result<Found, NvmlReturn> {
    let mut sets = sets();
    let registered = sets.get_mut(&handle).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    for r in registered.iter_mut() {
        let losses = s.gpu_losses(r.device);
        if losses != r.losses {
            r.losses = losses;
            return Ok(Found::Lost);
        }
    }
    for r in registered.iter_mut() {
        loop {
            match s.read_event(r.device, r.next) {
                EventRead::NotYet => break,
                EventRead::Gone(oldest) => r.next = oldest.max(r.next + 1),
                EventRead::Ready(e) => {
                    r.next = e.seq + 1;
                    if e.event_type & r.types != 0 {
                        return Ok(Found::Event(e));
                    }
                }
            }
        }
    }
    Ok(Found::Nothing)
}

/// Waits up to `timeout_ms` for an event of `set`.
fn wait(set: *mut c_void, timeout_ms: c_uint) -> Result<SimEvent, NvmlReturn> {
    let s = ready()?;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
    loop {
        // The word is read before the look, so that a post after the look wakes the sleep.
        let generation = s.event_generation();
        match look(&s, set as usize)? {
            Found::Event(e) => return Ok(e),
            Found::Lost => return Err(NVML_ERROR_GPU_IS_LOST),
            Found::Nothing => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(NVML_ERROR_TIMEOUT);
        }
        s.wait_for_events(generation, deadline - now);
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(set: *mut c_void, data: *mut NvmlEventData, timeout_ms: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if data.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let e = tri!(wait(set, timeout_ms));
        put(
            data,
            NvmlEventData {
                device: handle_of(e.device),
                event_type: e.event_type,
                event_data: e.data,
                gpu_instance_id: e.gpu_instance,
                compute_instance_id: e.compute_instance,
            },
        );
        NVML_SUCCESS
    })
}

/// The unversioned wait of drivers before r450: it writes the three fields of their
/// `nvmlEventData_t` only.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(set: *mut c_void, data: *mut NvmlEventDataV1, timeout_ms: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if data.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let e = tri!(wait(set, timeout_ms));
        put(data, NvmlEventDataV1 { device: handle_of(e.device), event_type: e.event_type, event_data: e.data });
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceValidateInforom(h: NvmlDevice) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_SUCCESS
    })
}
