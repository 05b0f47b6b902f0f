//! What programs see: `cuMemGetInfo` and `cuDeviceTotalMem` report the cap as the GPU's
//! memory (the GPU's own memory when the cap is larger: a cap never makes a GPU look bigger
//! than it is), and free memory as what is left of it (never more than the device really has).

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::c_uint;

/// Runs the real `cuMemGetInfo` and rewrites its answer.
fn mem_get_info(real: impl FnOnce(&mut u64, &mut u64) -> CUresult) -> (CUresult, u64, u64) {
    let (mut free, mut total) = (0u64, 0u64);
    let rc = real(&mut free, &mut total);
    if rc != CUDA_SUCCESS {
        return (rc, free, total);
    }
    match accounting::mode() {
        Mode::Off => (rc, free, total),
        Mode::Closed(_) => (rc, 0, total),
        Mode::On(active) => match active.account().current_device() {
            Ok(dev) => {
                let (free, total) = active.memory_view(dev, free);
                (rc, free, total)
            }
            Err(_) => (rc, 0, total),
        },
    }
}

/// # Safety
/// `cuMemGetInfo_v2` contract: both outputs writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        return unsafe { raw::cuMemGetInfo_v2(free, total) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    }
    super::guard(CUDA_ERROR_INVALID_VALUE, || {
        let (rc, f, t) = mem_get_info(|f, t| {
            let (mut rf, mut rt) = (0usize, 0usize);
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let rc = unsafe { raw::cuMemGetInfo_v2(&mut rf, &mut rt) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
            (*f, *t) = (rf as u64, rt as u64);
            rc
        });
        if rc == CUDA_SUCCESS {
            // SAFETY: both checked non-null above; caller-provided outputs.
            unsafe { (*free, *total) = (f as usize, t as usize) };
        }
        rc
    })
}

/// # Safety
/// Pre-3.2 `cuMemGetInfo` contract (32-bit outputs, saturated).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    if free.is_null() || total.is_null() {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        return unsafe { raw::cuMemGetInfo(free, total) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    }
    super::guard(CUDA_ERROR_INVALID_VALUE, || {
        let (rc, f, t) = mem_get_info(|f, t| {
            let (mut rf, mut rt) = (0 as c_uint, 0 as c_uint);
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let rc = unsafe { raw::cuMemGetInfo(&mut rf, &mut rt) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
            (*f, *t) = (rf as u64, rt as u64);
            rc
        });
        if rc == CUDA_SUCCESS {
            // SAFETY: both checked non-null above.
            unsafe { (*free, *total) = (f.min(u32::MAX as u64) as c_uint, t.min(u32::MAX as u64) as c_uint) };
        }
        rc
    })
}

fn capped_total(ordinal: CUdevice, real_total: u64) -> u64 {
    match accounting::mode() {
        Mode::On(active) => active.account().device(ordinal).map(|dev| dev.shown).unwrap_or(real_total),
        _ => real_total,
    }
}

/// # Safety
/// `cuDeviceTotalMem_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::cuDeviceTotalMem_v2(bytes, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    super::guard(rc, || {
        // SAFETY: the driver just wrote *bytes.
        unsafe { *bytes = capped_total(dev, *bytes as u64) as usize };
        rc
    })
}

/// # Safety
/// Pre-3.2 `cuDeviceTotalMem` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::cuDeviceTotalMem(bytes, dev) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    super::guard(rc, || {
        // SAFETY: the driver just wrote *bytes.
        unsafe { *bytes = capped_total(dev, *bytes as u64).min(u32::MAX as u64) as c_uint };
        rc
    })
}
