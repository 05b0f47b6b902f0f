//! CUDA contexts: `cuCtxCreate*`, `cuCtxDestroy*`, and the primary context's retain,
//! release and reset. What a context is counted at (reserved before, measured after) is the
//! accounting's (`accounting/context.rs`); the compute limiter hears of contexts going away
//! first, so that it never touches its markers in them again.

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::{c_int, c_uint, c_void};

/// Shared body of the `cuCtxCreate` variants.
fn create_context(call: &'static str, pctx: *mut CUcontext, ordinal: CUdevice, real: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::Off => real(),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active.create_context(call, ordinal, real, || {
            // SAFETY: called only on success, when the driver wrote the new context to *pctx
            // (checked non-null by the hook).
            unsafe { *pctx as usize }
        }),
    }
}

fn destroy_context(ctx: CUcontext, real: impl FnOnce() -> CUresult) -> CUresult {
    crate::compute::before_context_destroyed(ctx);
    match accounting::mode() {
        Mode::On(active) => active.destroy_context(ctx as usize, real),
        _ => {
            let rc = real();
            fgpu_core::crash_point!("context.destroyed");
            rc
        }
    }
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
        unsafe { raw::cuCtxCreate_v3(pctx, params, num_params, flags, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
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
        unsafe { raw::cuCtxCreate_v4(pctx, params, flags, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
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

/// # Safety
/// `cuDevicePrimaryCtxRetain` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, ordinal: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDevicePrimaryCtxRetain(pctx, ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| match accounting::mode() {
        Mode::Off => answer.of(real()),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active.retain_primary(ordinal, answer.wrap(real)),
    })
}

/// After a release or reset, a primary context that is no longer active gives its memory back.
fn after_primary_release(ordinal: CUdevice, real: impl FnOnce() -> CUresult) -> CUresult {
    crate::compute::before_primary_released(ordinal, || match accounting::mode() {
        Mode::On(active) => active.created_contexts(),
        _ => Vec::new(),
    });
    match accounting::mode() {
        Mode::On(active) => active.release_primary(ordinal, real),
        _ => real(),
    }
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
