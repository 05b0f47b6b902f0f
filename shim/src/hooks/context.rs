//! CUDA contexts hold device memory that no allocation call shows (hundreds of MiB).
//!
//! Before a context is created, its expected size is reserved: the last size measured on
//! that device by any process of the ledger, or 512 MiB before anyone has measured. A
//! context that does not fit is refused with `CUDA_ERROR_OUT_OF_MEMORY`. Once it exists,
//! the reservation is corrected to the size measured through NVML (this process's own
//! usage where its host PID is known, else the device's usage before and after), and it is
//! returned when the context is destroyed.

use crate::driver::raw;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::hooks::nvml::query;
use crate::state::{self, Active, Dev, Mode};
use fgpu_core::log::Level;
use fgpu_core::log_at;
use std::ffi::{c_int, c_uint, c_void};

const FIRST_ESTIMATE: u64 = 512 << 20;
/// Measurements outside (0, this] are treated as noise and the estimate is kept.
const MAX_PLAUSIBLE: u64 = 16 << 30;

fn estimate(active: &Active, dev: &Dev) -> u64 {
    match active.ledger.context_hint(dev.id) {
        0 => FIRST_ESTIMATE,
        hint => hint,
    }
}

/// Reserves, creates (through `create`), measures and records one context.
fn counted_creation(active: &Active, dev: &Dev, call: &'static str, create: impl FnOnce() -> CUresult) -> Result<u64, CUresult> {
    super::untracked::settling(active, || measured_creation(active, dev, call, create))
}

fn measured_creation(active: &Active, dev: &Dev, call: &'static str, create: impl FnOnce() -> CUresult) -> Result<u64, CUresult> {
    let reserved = estimate(active, dev);
    active.reserve(dev, reserved, call)?;
    fgpu_core::crash_point!("context.reserved");
    let before = query::before_context(dev);
    let rc = create();
    fgpu_core::crash_point!("context.created");
    if rc != CUDA_SUCCESS {
        active.release(dev, reserved);
        return Err(rc);
    }
    let measured = query::context_size(active, dev, reserved, before).filter(|m| *m > 0 && *m <= MAX_PLAUSIBLE);
    let actual = measured.unwrap_or(reserved);
    if let Some(m) = measured {
        active.ledger.set_context_hint(dev.id, m);
    }
    log_at!(Level::Debug, "{call}: context on device {} takes {} bytes ({})", dev.ordinal, actual, if measured.is_some() { "measured" } else { "estimated" });
    active.settle(dev, reserved, actual);
    if let Some(slot) = active.slot_if_joined() {
        active.ledger.add_context(slot, dev.id, actual as i64);
    }
    Ok(actual)
}

/// Returns `bytes` of context memory on `ordinal` (counted and shown as context memory).
pub(crate) fn forget(active: &Active, ordinal: CUdevice, bytes: u64) {
    if let Some(dev) = active.known_device(ordinal) {
        active.release(dev, bytes);
        if let Some(slot) = active.slot_if_joined() {
            active.ledger.add_context(slot, dev.id, -(bytes as i64));
        }
    }
}

/// Shared body of the `cuCtxCreate` variants.
fn create_context(call: &'static str, pctx: *mut CUcontext, ordinal: CUdevice, real: impl FnOnce() -> CUresult) -> CUresult {
    match state::mode() {
        Mode::Off => real(),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => {
            let dev = match active.device(ordinal) {
                Ok(dev) => dev,
                Err(_) => return real(),
            };
            match counted_creation(active, dev, call, real) {
                Ok(bytes) => {
                    // SAFETY: on success the driver wrote the new context to *pctx.
                    let ctx = unsafe { *pctx } as usize;
                    active.contexts.lock().insert(ctx, (ordinal, bytes));
                    CUDA_SUCCESS
                }
                Err(rc) => rc,
            }
        }
    }
}

fn destroy_context(ctx: CUcontext, real: impl FnOnce() -> CUresult) -> CUresult {
    crate::compute::before_context_destroyed(ctx);
    let rc = real();
    fgpu_core::crash_point!("context.destroyed");
    if rc == CUDA_SUCCESS {
        if let Mode::On(active) = state::mode() {
            let removed = active.contexts.lock().remove(&(ctx as usize));
            if let Some((ordinal, bytes)) = removed {
                forget(active, ordinal, bytes);
                super::untracked::forget_if_no_context(active, ordinal);
            }
        }
    }
    rc
}

/// # Safety
/// `cuCtxCreate_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuCtxCreate_v2(pctx, flags, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    if pctx.is_null() {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| create_context("cuCtxCreate", pctx, dev, answer.wrap(real)))
}

/// # Safety
/// Original `cuCtxCreate` contract (same arguments as `_v2`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuCtxCreate(pctx, flags, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    if pctx.is_null() {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| create_context("cuCtxCreate", pctx, dev, answer.wrap(real)))
}

/// # Safety
/// `cuCtxCreate_v3` contract (execution-affinity parameters, CUDA 11.4+).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuCtxCreate_v3(pctx, params, num_params, flags, dev) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    if pctx.is_null() {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| create_context("cuCtxCreate", pctx, dev, answer.wrap(real)))
}

/// # Safety
/// `cuCtxCreate_v4` contract (`CUctxCreateParams`, CUDA 12.5+; `cuCtxCreate` in CUDA 13).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuCtxCreate_v4(pctx, params, flags, dev) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    if pctx.is_null() {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| create_context("cuCtxCreate", pctx, dev, answer.wrap(real)))
}

/// # Safety
/// `cuCtxDestroy_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuCtxDestroy_v2(ctx) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| destroy_context(ctx, answer.wrap(real)))
}

/// # Safety
/// Original `cuCtxDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuCtxDestroy(ctx) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| destroy_context(ctx, answer.wrap(real)))
}

fn primary_active(ordinal: CUdevice) -> Option<bool> {
    driver().primary_context_active(ordinal)
}

/// # Safety
/// `cuDevicePrimaryCtxRetain` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxRetain(pctx, ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| match state::mode() {
        Mode::Off => answer.of(real()),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => {
            let Ok(dev) = active.device(ordinal) else { return answer.of(real()) };
            // Serialises this process's retains and releases, so exactly one retain counts
            // the creation of each primary context.
            let mut primary = active.primary.lock();
            if primary.contains_key(&ordinal) || primary_active(ordinal) == Some(true) {
                return answer.of(real());
            }
            match counted_creation(active, dev, "cuDevicePrimaryCtxRetain", answer.wrap(real)) {
                Ok(bytes) => {
                    primary.insert(ordinal, bytes);
                    CUDA_SUCCESS
                }
                Err(rc) => rc,
            }
        }
    })
}

/// After a release or reset, a primary context that is no longer active gives its memory back.
fn after_primary_release(ordinal: CUdevice, real: impl FnOnce() -> CUresult) -> CUresult {
    crate::compute::before_primary_released(ordinal);
    let Mode::On(active) = state::mode() else { return real() };
    let mut primary = active.primary.lock();
    let rc = real();
    fgpu_core::crash_point!("context.released");
    if rc == CUDA_SUCCESS && primary_active(ordinal) != Some(true) {
        if let Some(bytes) = primary.remove(&ordinal) {
            forget(active, ordinal, bytes);
            drop(primary);
            super::untracked::forget_if_no_context(active, ordinal);
        }
    }
    rc
}

/// # Safety
/// `cuDevicePrimaryCtxRelease_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxRelease_v2(ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| after_primary_release(ordinal, answer.wrap(real)))
}

/// # Safety
/// Original `cuDevicePrimaryCtxRelease` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxRelease(ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| after_primary_release(ordinal, answer.wrap(real)))
}

/// # Safety
/// `cuDevicePrimaryCtxReset_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxReset_v2(ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| after_primary_release(ordinal, answer.wrap(real)))
}

/// # Safety
/// Original `cuDevicePrimaryCtxReset` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxReset(ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| after_primary_release(ordinal, answer.wrap(real)))
}
