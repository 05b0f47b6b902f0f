//! Module and library loads (`cuModuleLoad*`, `cuLibraryLoad*`): the driver takes device
//! memory for their code and data without saying how much. The load is not refused (its
//! size is unknown beforehand), but what NVML shows this process holding beyond the ledger
//! is counted right after it (`accounting/records/untracked.rs`), not at the next synchronisation, so the
//! next allocation already sees it; where NVML has no figure of this process's own, the
//! device's usage before and after the load is.

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::{c_char, c_uint, c_void};

/// Runs a load, then counts what it took (`accounting/records/untracked.rs`).
fn counted_load(real: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::On(active) => active.around_load(real),
        _ => real(),
    }
}

/// # Safety
/// `cuModuleLoad` contract.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuModuleLoad(module, fname) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}

/// # Safety
/// `cuModuleLoadData` contract.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuModuleLoadData(module, image) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}

/// # Safety
/// `cuModuleLoadDataEx` contract.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuModuleLoadDataEx(module, image, num_options, options, option_values) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}

/// # Safety
/// `cuModuleLoadFatBinary` contract.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(module: *mut *mut c_void, fat_cubin: *const c_void) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuModuleLoadFatBinary(module, fat_cubin) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}

/// # Safety
/// `cuLibraryLoadData` contract (CUDA 12.0+).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut c_void,
    code: *const c_void,
    jit_options: *mut c_uint,
    jit_option_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut c_uint,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe {
            raw::cuLibraryLoadData(library, code, jit_options, jit_option_values, num_jit_options, library_options, library_option_values, num_library_options)
        }
        .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}

/// # Safety
/// `cuLibraryLoadFromFile` contract (CUDA 12.0+).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut *mut c_void,
    file_name: *const c_char,
    jit_options: *mut c_uint,
    jit_option_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut c_uint,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe {
            raw::cuLibraryLoadFromFile(
                library,
                file_name,
                jit_options,
                jit_option_values,
                num_jit_options,
                library_options,
                library_option_values,
                num_library_options,
            )
        }
        .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_load(answer.wrap(real)))
}
