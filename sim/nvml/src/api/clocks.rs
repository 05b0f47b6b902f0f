//! Clocks, clock event (throttle) reasons, energy.

use crate::boundary::*;
use std::ffi::{c_uint, c_ulonglong};

fn clock_mhz(kind: c_uint, max: bool) -> Option<c_uint> {
    Some(match (kind, max) {
        (0, false) | (1, false) => 345, // graphics / SM, idle
        (0, true) | (1, true) => 1980,
        (2, _) => 2619,    // memory
        (3, false) => 765, // video
        (3, true) => 1545,
        _ => return None,
    })
}

fn clock(h: NvmlDevice, kind: c_uint, out: *mut c_uint, max: bool) -> NvmlReturn {
    tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match clock_mhz(kind, max) {
        Some(v) => {
            put(out, v);
            NVML_SUCCESS
        }
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| clock(h, kind, mhz, false))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| clock(h, kind, mhz, true))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        clock(h, kind, mhz, true)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        clock(h, kind, mhz, true)
    })
}
/// `nvmlDeviceGetClock(device, clockType, clockId, *mhz)`: CURRENT 0, APP_TARGET 1,
/// APP_DEFAULT 2, CUSTOMER_BOOST_MAX 3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(h: NvmlDevice, kind: c_uint, id: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| match id {
        0 => clock(h, kind, mhz, false),
        1..=3 => clock(h, kind, mhz, true),
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

pub(super) fn u64_out(h: NvmlDevice, out: *mut c_ulonglong, v: c_ulonglong) -> NvmlReturn {
    tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(out, v);
    NVML_SUCCESS
}

/// Idle GPU: `nvmlClocksEventReasonGpuIdle`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0x1))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        u64_out(h, r, 0x1)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0x1ff))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0))
}
