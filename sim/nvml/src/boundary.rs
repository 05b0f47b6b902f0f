//! What every entry point shares: the return codes, device handles, the guard that keeps
//! a panic from crossing the C boundary, writing through the caller's pointers, and the
//! simulated driver's shared state (opened once, usable after nvmlInit).

use fgpu_sim_state::SimState;
use std::ffi::{c_char, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub type NvmlReturn = c_uint;
pub type NvmlDevice = *const u64;

pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
pub(crate) const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub(crate) const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub(crate) const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub(crate) const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub(crate) const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub(crate) const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub(crate) const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub(crate) const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

pub(crate) static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// Device handles are the addresses of these words.
pub(crate) static HANDLES: [u64; fgpu_sim_state::MAX_DEVICES] = [0; fgpu_sim_state::MAX_DEVICES];

pub(crate) fn state() -> Option<SimState> {
    // The state file is opened once and never closed (see fgpu-sim-state).
    static S: OnceLock<Option<SimState>> = OnceLock::new();
    *S.get_or_init(|| SimState::open_default().ok())
}

pub(crate) fn guard<F: FnOnce() -> NvmlReturn>(f: F) -> NvmlReturn {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

/// Writes through a caller's output pointer (ignored when NULL).
pub(crate) fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: the NVML API contract makes the caller pass a pointer valid for one T.
        unsafe { p.write_unaligned(v) }
    }
}

/// Copies `s` (NUL-terminated) into a caller buffer of `len` bytes.
pub(crate) fn put_str(dst: *mut c_char, len: c_uint, s: &str) -> NvmlReturn {
    if dst.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (len as usize) < s.len() + 1 {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, s.len());
        *dst.add(s.len()) = 0;
    }
    NVML_SUCCESS
}

pub(crate) fn ready() -> Result<SimState, NvmlReturn> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    state().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The device index behind a handle.
pub(crate) fn dev(h: NvmlDevice) -> Result<(SimState, usize), NvmlReturn> {
    let s = ready()?;
    let base = HANDLES.as_ptr() as usize;
    let p = h as usize;
    if p < base || !(p - base).is_multiple_of(8) || (p - base) / 8 >= s.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((s, (p - base) / 8))
}

pub(crate) fn handle_of(i: usize) -> NvmlDevice {
    &HANDLES[i] as *const u64
}

pub(crate) use tri;
