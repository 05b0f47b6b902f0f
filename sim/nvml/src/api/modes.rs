//! Modes, ECC, MIG, retired and remapped pages, field values.

use super::clocks::u64_out;
use super::sensors::no_sessions;
use crate::boundary::*;
use std::ffi::{c_int, c_uint, c_ulonglong};

fn pair(h: NvmlDevice, a: *mut c_uint, b: *mut c_uint, va: c_uint, vb: c_uint) -> NvmlReturn {
    tri!(dev(h));
    if a.is_null() || b.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(a, va);
    put(b, vb);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(h: NvmlDevice, current: *mut c_uint, pending: *mut c_uint) -> NvmlReturn {
    guard(|| pair(h, current, pending, 1, 1))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(h: NvmlDevice, _t: c_uint, _c: c_uint, n: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, n, 0))
}
#[no_mangle]
/// No memory error, on a GPU or a MIG device (nvidia-smi's MIG table asks each).
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(h: NvmlDevice, _t: c_uint, _c: c_uint, _l: c_uint, n: *mut c_ulonglong) -> NvmlReturn {
    guard(|| {
        tri!(target(h));
        if n.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(n, 0);
        NVML_SUCCESS
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(h: NvmlDevice, _cause: c_uint, count: *mut c_uint, _addrs: *mut c_ulonglong) -> NvmlReturn {
    guard(|| no_sessions(h, count))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    h: NvmlDevice,
    _cause: c_uint,
    count: *mut c_uint,
    _addrs: *mut c_ulonglong,
    _ts: *mut c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        no_sessions(h, count)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    h: NvmlDevice,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if corr.is_null() || unc.is_null() || pending.is_null() || failed.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for p in [corr, unc, pending, failed] {
            put(p, 0);
        }
        NVML_SUCCESS
    })
}

/// Every requested field answers NVML_ERROR_NOT_SUPPORTED in its `nvmlReturn`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(h: NvmlDevice, count: c_int, values: *mut u8) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if count < 0 || (count > 0 && values.is_null()) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for k in 0..count as usize {
            // nvmlFieldValue_t is 40 bytes; its nvmlReturn sits at offset 28.
            // SAFETY: the caller passes `count` nvmlFieldValue_t entries.
            put(unsafe { values.add(k * 40 + 28) } as *mut c_uint, NVML_ERROR_NOT_SUPPORTED);
        }
        NVML_SUCCESS
    })
}
