//! Initialisation and shutdown (nvmlInit, nvmlInitWithFlags, nvmlShutdown) and error
//! strings.

use crate::boundary::*;
use std::ffi::{c_char, c_uint};
use std::sync::atomic::Ordering;

fn init_common() -> NvmlReturn {
    if state().is_none() {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> NvmlReturn {
    guard(init_common)
}
#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(init_common)
}
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    guard(init_common)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(|| {
        let r = INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        if r.is_ok() {
            NVML_SUCCESS
        } else {
            NVML_ERROR_UNINITIALIZED
        }
    })
}

static ERROR_STRINGS: &[(NvmlReturn, &str)] = &[
    (0, "Success\0"),
    (1, "Uninitialized\0"),
    (2, "Invalid Argument\0"),
    (3, "Not Supported\0"),
    (4, "Insufficient Permissions\0"),
    (5, "Already Initialized\0"),
    (6, "Not Found\0"),
    (7, "Insufficient Size\0"),
    (8, "Insufficient External Power\0"),
    (9, "Driver Not Loaded\0"),
    (10, "Timeout\0"),
    (11, "Interrupt Request Issue\0"),
    (12, "NVML Shared Library Not Found\0"),
    (13, "Function Not Found\0"),
    (14, "Corrupted infoROM\0"),
    (15, "GPU is lost\0"),
    (16, "GPU requires restart\0"),
    (17, "The operating system has blocked the request.\0"),
    (18, "RM has detected an NVML/RM version mismatch.\0"),
    (19, "In use by another client\0"),
    (20, "Insufficient Memory\0"),
    (21, "No data\0"),
    (22, "The requested vgpu operation is not available on target device, becasue ECC is enabled\0"),
    (23, "Insufficient resources\0"),
    (24, "Frequency not supported\0"),
    (25, "Argument version mismatch\0"),
    (26, "Deprecated\0"),
    (27, "Not Ready\0"),
    (28, "GPU not found\0"),
    (29, "Invalid state\0"),
    (999, "Unknown Error\0"),
];

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s = ERROR_STRINGS.iter().find(|e| e.0 == result).map(|e| e.1).unwrap_or("Unknown Error\0");
    s.as_ptr() as *const c_char
}
