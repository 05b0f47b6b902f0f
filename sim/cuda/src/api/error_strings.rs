//! Exported CUDA driver entry points: error names and strings (cuGetErrorName,
//! cuGetErrorString).

use crate::boundary::*;
use crate::errors::*;
use std::ffi::c_char;

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        if pstr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match ERRORS.iter().find(|e| e.0 == error) {
            Some(e) => {
                put(pstr, e.1.as_ptr() as *const c_char);
                CUDA_SUCCESS
            }
            None => {
                put(pstr, std::ptr::null());
                CUDA_ERROR_INVALID_VALUE
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        if pstr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match ERRORS.iter().find(|e| e.0 == error) {
            Some(e) => {
                put(pstr, e.2.as_ptr() as *const c_char);
                CUDA_SUCCESS
            }
            None => {
                put(pstr, std::ptr::null());
                CUDA_ERROR_INVALID_VALUE
            }
        }
    })
}
