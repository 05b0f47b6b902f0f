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
pub(crate) const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub(crate) const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub(crate) const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub(crate) const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub(crate) const NVML_ERROR_RESET_REQUIRED: NvmlReturn = 16;
pub(crate) const NVML_ERROR_IN_USE: NvmlReturn = 19;
pub(crate) const NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlReturn = 23;
pub(crate) const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub(crate) const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

pub(crate) static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// Device handles are the addresses of these words.
pub(crate) static HANDLES: [u64; fgpu_sim_state::MAX_DEVICES] = [0; fgpu_sim_state::MAX_DEVICES];
/// GPU instance IDs of a GPU (0..=14) and compute instance IDs of a GPU instance (0..8).
pub(crate) const GI_IDS: usize = 15;
pub(crate) const CI_IDS: usize = 8;
/// MIG device handles (`nvmlDevice_t` of a MIG device): the address of the word of (GPU,
/// GPU instance ID, compute instance ID). A handle whose compute instance was destroyed is
/// invalid, and names the next one made with the same IDs (NVML: "Handles may be reused").
pub(crate) static MIG_HANDLES: [[[u64; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES] = [[[0; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES];

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

/// Index of the word `p` points at in `table` (a static array of `len` u64), if it does.
pub(crate) fn word_index(p: usize, table: *const u64, len: usize) -> Option<usize> {
    let base = table as usize;
    (p >= base && (p - base).is_multiple_of(8) && (p - base) / 8 < len).then(|| (p - base) / 8)
}

/// What a device handle names.
pub(crate) enum Target {
    Gpu(usize),
    Mig(Box<fgpu_sim_state::MigDevice>),
}

/// `NVML_ERROR_GPU_IS_LOST` when GPU `i` fell off the bus (`fgpu_sim_state::events`): every
/// call on it, its MIG devices and their instances answers that until it is recovered.
pub(crate) fn present(s: &SimState, i: usize) -> Result<(), NvmlReturn> {
    if s.gpu_lost(i) {
        Err(NVML_ERROR_GPU_IS_LOST)
    } else {
        Ok(())
    }
}

/// The GPU or MIG device behind a handle (`NVML_ERROR_INVALID_ARGUMENT` for neither, or a
/// MIG handle whose compute instance is gone; `NVML_ERROR_GPU_IS_LOST` for a lost GPU's).
pub(crate) fn target(h: NvmlDevice) -> Result<(SimState, Target), NvmlReturn> {
    let s = ready()?;
    if let Some(i) = word_index(h as usize, HANDLES.as_ptr(), fgpu_sim_state::MAX_DEVICES) {
        if i >= s.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        present(&s, i)?;
        return Ok((s, Target::Gpu(i)));
    }
    let k = word_index(h as usize, MIG_HANDLES.as_ptr() as *const u64, fgpu_sim_state::MAX_DEVICES * GI_IDS * CI_IDS).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let (d, gi, ci) = (k / (GI_IDS * CI_IDS), (k / CI_IDS) % GI_IDS, k % CI_IDS);
    if d < s.device_count() {
        present(&s, d)?;
    }
    match s.mig_device(d, gi as u32, ci as u32) {
        Some(m) => Ok((s, Target::Mig(Box::new(m)))),
        None => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// The GPU behind a handle. A MIG device handle is a valid handle of a device that does
/// not answer the query: `NVML_ERROR_NOT_SUPPORTED`.
pub(crate) fn dev(h: NvmlDevice) -> Result<(SimState, usize), NvmlReturn> {
    match target(h)? {
        (s, Target::Gpu(i)) => Ok((s, i)),
        (_, Target::Mig(_)) => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

pub(crate) fn handle_of(i: usize) -> NvmlDevice {
    &HANDLES[i] as *const u64
}

/// The handle of MIG device `m`.
pub(crate) fn mig_handle_of(m: &fgpu_sim_state::MigDevice) -> NvmlDevice {
    &MIG_HANDLES[m.device][m.gpu_instance.id as usize][m.compute_instance.id as usize] as *const u64
}

pub(crate) use tri;
