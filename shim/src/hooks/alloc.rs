//! Plain device allocations: `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`,
//! `cuMemFree`, in their `_v2` and original 32-bit forms.
//!
//! Reserve, call and settle are the accounting's (`accounting/alloc.rs`); these hooks read
//! the caller's arguments and the driver's answer.

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::c_uint;

/// A counted allocation on the current device (`Active::counted_alloc`): `allocate`
/// returns the driver's result and, on success, the pointer and the bytes taken.
pub(crate) fn counted(call: &'static str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
    match accounting::mode() {
        Mode::Off => allocate().0,
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => match active.account().current_device() {
            Ok(dev) => active.counted_alloc(dev, call, bytes, allocate),
            Err(rc) => rc,
        },
    }
}

/// As [`counted`], for a call whose real size is only known afterwards (a pitch).
fn counted_settling(call: &'static str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
    match accounting::mode() {
        Mode::On(active) => active.counted_alloc_settling(call, bytes, allocate),
        _ => counted(call, bytes, allocate),
    }
}

/// A free through `free`, then what the allocation held goes back.
pub(crate) fn counted_free(ptr: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::On(active) => active.counted_free(ptr, free),
        _ => free(),
    }
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
        let rc = unsafe { raw::cuMemAllocPitch_v2(dptr, pitch, width, height, element_size) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
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
        let rc = unsafe { raw::cuMemAllocPitch(dptr, pitch, width, height, element_size) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
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
        let rc = unsafe { raw::cuMemAllocManaged(dptr, bytesize, flags) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
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
