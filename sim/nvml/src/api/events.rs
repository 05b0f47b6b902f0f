//! Event sets (nothing is ever signalled) and the inforom check.

use crate::boundary::*;
use std::ffi::{c_uint, c_ulonglong, c_void};

pub(crate) const NVML_ERROR_TIMEOUT: NvmlReturn = 10;

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    static SETS: [u64; 1] = [0];
    guard(|| {
        tri!(ready());
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(set, SETS.as_ptr() as *mut c_void);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(_set: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        NVML_SUCCESS
    })
}

/// The simulated device raises no events (`nvmlDeviceGetSupportedEventTypes` is 0).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(h: NvmlDevice, _types: c_ulonglong, _set: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_ERROR_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(_set: *mut c_void, _data: *mut c_void, _timeout_ms: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        NVML_ERROR_TIMEOUT
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceValidateInforom(h: NvmlDevice) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_SUCCESS
    })
}
