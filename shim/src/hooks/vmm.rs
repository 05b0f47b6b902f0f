//! Virtual memory management (`cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`),
//! used by PyTorch's expandable segments, JAX/XLA and vLLM. `cuMemCreate` with a device
//! location takes physical memory, reserved before the call; it goes back when the handle
//! is released and no mapping of it remains (`accounting/vmm.rs`). Host-located handles
//! are not device memory.

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;

/// # Safety
/// `cuMemCreate` contract: `handle` writable, `prop` readable.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemCreate(handle, size, prop, flags) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    if handle.is_null() || prop.is_null() || size == 0 {
        return real();
    }
    // SAFETY: non-null, caller-provided property struct of the documented layout.
    let location = unsafe { (*prop).location };
    if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| match accounting::mode() {
        Mode::Off => answer.of(real()),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active.vmm_create(location.id, size as u64, answer.wrap(real), || {
            // SAFETY: called on success only, when the driver wrote the new handle.
            unsafe { *handle }
        }),
    })
}

/// # Safety
/// `cuMemRelease` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemRelease(handle) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| match accounting::mode() {
        Mode::On(active) => active.vmm_release(handle, answer.wrap(real)),
        _ => answer.of(real()),
    })
}

/// # Safety
/// `cuMemMap` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemMap(ptr, size, offset, handle, flags) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| match accounting::mode() {
        Mode::On(active) => active.vmm_map(ptr, size, handle, answer.wrap(real)),
        _ => answer.of(real()),
    })
}

/// # Safety
/// `cuMemUnmap` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemUnmap(ptr, size) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| match accounting::mode() {
        Mode::On(active) => active.vmm_unmap(ptr, size, answer.wrap(real)),
        _ => answer.of(real()),
    })
}
