//! Plain device allocations: `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`,
//! `cuMemFree`, in their `_v2` and original 32-bit forms.
//!
//! The bytes are reserved in the ledger *before* the driver is called, so racing
//! allocations can never pass the cap together; a failed driver call gives them back.

use crate::driver::raw;
use crate::abi::cuda::*;
use crate::state::{self, Active, Alloc, Dev, Mode};
use std::ffi::c_uint;

/// Reserves `bytes` on the current device, runs `allocate` (which returns the driver's result
/// and, on success, the pointer and the bytes actually taken), and records the allocation.
pub(crate) fn counted(call: &'static str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
    match state::mode() {
        Mode::Off => allocate().0,
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => {
            let dev = match active.current_device() {
                Ok(dev) => dev,
                Err(rc) => return rc,
            };
            counted_on(active, dev, call, bytes, allocate)
        }
    }
}

pub(crate) fn counted_on(active: &Active, dev: &Dev, call: &'static str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
    if let Err(rc) = active.reserve(dev, bytes, call) {
        return rc;
    }
    fgpu_core::crash_point!("alloc.reserved");
    let (rc, ptr, actual) = allocate();
    fgpu_core::crash_point!("alloc.allocated");
    if rc == CUDA_SUCCESS {
        active.settle(dev, bytes, actual);
        active.allocs.insert(ptr, Alloc { ordinal: dev.ordinal, bytes: actual });
    } else {
        active.release(dev, bytes);
    }
    rc
}

/// As [`counted`], for a call whose real size is only known afterwards (see
/// `hooks/untracked.rs`).
fn counted_settling(call: &'static str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
    match state::mode() {
        Mode::On(active) => super::untracked::settling(active, || counted(call, bytes, allocate)),
        _ => counted(call, bytes, allocate),
    }
}

/// Frees through `free`, then returns what the allocation held. The record is taken out
/// first, so a concurrent allocation that reuses the address is never mistaken for it.
pub(crate) fn counted_free(ptr: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    let Mode::On(active) = state::mode() else {
        return free();
    };
    let record = active.allocs.remove(ptr);
    let rc = free();
    fgpu_core::crash_point!("free.freed");
    match (rc, record) {
        (CUDA_SUCCESS, Some(alloc)) => {
            if let Some(dev) = active.known_device(alloc.ordinal) {
                active.release(dev, alloc.bytes);
            }
        }
        (CUDA_SUCCESS, None) => crate::hooks::pool::refresh_pools(active),
        (_, Some(alloc)) => active.allocs.insert(ptr, alloc),
        (_, None) => {}
    }
    rc
}

/// # Safety
/// `cuMemAlloc_v2` contract: `dptr` writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        let rc = unsafe { raw::cuMemAlloc_v2(dptr, bytesize) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
        // SAFETY: on success the driver wrote *dptr.
        let ptr = if rc == CUDA_SUCCESS { unsafe { *dptr } } else { 0 };
        (rc, ptr, bytesize as u64)
    };
    if bytesize == 0 || dptr.is_null() {
        return real().0;
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted("cuMemAlloc", bytesize as u64, answer.wrap(real)))
}

/// # Safety
/// Pre-3.2 `cuMemAlloc` contract: 32-bit pointer and size.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptrV1, bytesize: c_uint) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        let rc = unsafe { raw::cuMemAlloc(dptr, bytesize) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
        // SAFETY: on success the driver wrote *dptr.
        let ptr = if rc == CUDA_SUCCESS { unsafe { *dptr as u64 } } else { 0 };
        (rc, ptr, bytesize as u64)
    };
    if bytesize == 0 || dptr.is_null() {
        return real().0;
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted("cuMemAlloc", bytesize as u64, answer.wrap(real)))
}

/// The driver rounds each row up to its pitch (512 bytes here, the real alignment on every
/// current GPU); we reserve that estimate and settle on `pitch * height` once it answers.
fn pitch_estimate(width: u64, height: u64) -> u64 {
    width.div_ceil(512).saturating_mul(512).saturating_mul(height)
}

/// # Safety
/// `cuMemAllocPitch_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_size: c_uint) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        let rc = unsafe { raw::cuMemAllocPitch_v2(dptr, pitch, width, height, element_size) }
        .unwrap_or(CUDA_ERROR_NOT_FOUND);
        if rc != CUDA_SUCCESS {
            return (rc, 0, 0);
        }
        // SAFETY: on success the driver wrote both outputs.
        unsafe { (rc, *dptr, (*pitch as u64).saturating_mul(height as u64)) }
    };
    if width == 0 || height == 0 || dptr.is_null() || pitch.is_null() {
        return real().0;
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted_settling("cuMemAllocPitch", pitch_estimate(width as u64, height as u64), answer.wrap(real)))
}

/// # Safety
/// Pre-3.2 `cuMemAllocPitch` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(dptr: *mut CUdeviceptrV1, pitch: *mut c_uint, width: c_uint, height: c_uint, element_size: c_uint) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        let rc = unsafe { raw::cuMemAllocPitch(dptr, pitch, width, height, element_size) }
        .unwrap_or(CUDA_ERROR_NOT_FOUND);
        if rc != CUDA_SUCCESS {
            return (rc, 0, 0);
        }
        // SAFETY: on success the driver wrote both outputs.
        unsafe { (rc, *dptr as u64, (*pitch as u64) * height as u64) }
    };
    if width == 0 || height == 0 || dptr.is_null() || pitch.is_null() {
        return real().0;
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted_settling("cuMemAllocPitch", pitch_estimate(width as u64, height as u64), answer.wrap(real)))
}

/// Managed memory can live on the device in full, so all of it counts against the cap.
///
/// # Safety
/// `cuMemAllocManaged` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        let rc = unsafe { raw::cuMemAllocManaged(dptr, bytesize, flags) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND);
        // SAFETY: on success the driver wrote *dptr.
        let ptr = if rc == CUDA_SUCCESS { unsafe { *dptr } } else { 0 };
        (rc, ptr, bytesize as u64)
    };
    if bytesize == 0 || dptr.is_null() {
        return real().0;
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted("cuMemAllocManaged", bytesize as u64, answer.wrap(real)))
}

/// # Safety
/// `cuMemFree_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemFree_v2(dptr) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_free(dptr, answer.wrap(real)))
}

/// # Safety
/// Pre-3.2 `cuMemFree` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptrV1) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemFree(dptr) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_free(dptr as u64, answer.wrap(real)))
}
