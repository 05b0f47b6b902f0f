//! Utilisation rates, codec utilisation and sessions, temperatures, fans and power limits.

use crate::boundary::*;
use std::ffi::{c_uint, c_void};

#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `gpu`: percent of the last completed sample period (1/6 s unless
/// `FGPU_SIM_SAMPLE_PERIOD` says otherwise) during which some kernel ran
/// on the device timeline. `memory` (global memory traffic) is not modelled: 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(h: NvmlDevice, u: *mut NvmlUtilization) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if u.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
        if s.mig_on(i) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let p = s.sample_period_ns();
        let last_end = fgpu_sim_state::now_ns() / p * p;
        let after = s.timestamp_us(last_end.saturating_sub(p));
        let gpu = s.utilisation_periods(i, after).last().map(|period| period.percent(period.device_busy_ns)).unwrap_or(0);
        put(u, NvmlUtilization { gpu, memory: 0 });
        NVML_SUCCESS
    })
}

/// Encoder, decoder, JPEG and OFA utilisation: 0 (no engine runs); not supported on a
/// MIG-enabled GPU (nvml.h says so of each).
fn codec_utilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if u.is_null() || period.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if s.mig_on(i) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    put(u, 0);
    put(period, 167_000);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| codec_utilization(h, u, period))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        codec_utilization(h, u, period)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetJpgUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        codec_utilization(h, u, period)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetOfaUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(4u32);
        codec_utilization(h, u, period)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(h: NvmlDevice, sessions: *mut c_uint, fps: *mut c_uint, latency: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if sessions.is_null() || fps.is_null() || latency.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(sessions, 0);
        put(fps, 0);
        put(latency, 0);
        NVML_SUCCESS
    })
}

pub(super) fn no_sessions(h: NvmlDevice, count: *mut c_uint) -> NvmlReturn {
    tri!(dev(h));
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(count, 0);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(h: NvmlDevice, count: *mut c_uint, _info: *mut c_void) -> NvmlReturn {
    guard(|| no_sessions(h, count))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(h: NvmlDevice, count: *mut c_uint, _info: *mut c_void) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        no_sessions(h, count)
    })
}

#[repr(C)]
pub struct NvmlFbcStats {
    pub sessions_count: c_uint,
    pub average_fps: c_uint,
    pub average_latency: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCStats(h: NvmlDevice, stats: *mut NvmlFbcStats) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if stats.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(stats, NvmlFbcStats { sessions_count: 0, average_fps: 0, average_latency: 0 });
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(h: NvmlDevice, sensor: c_uint, temp: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if sensor != 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if temp.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(temp, 32);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(h: NvmlDevice, kind: c_uint, temp: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if temp.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let v = match kind {
            0 => 92, // SHUTDOWN
            1 => 89, // SLOWDOWN
            2 => 95, // MEM_MAX
            3 => 87, // GPU_MAX
            _ => return NVML_ERROR_NOT_SUPPORTED,
        };
        put(temp, v);
        NVML_SUCCESS
    })
}

/// Passively cooled board: no fan.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(h: NvmlDevice, _speed: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_ERROR_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(h: NvmlDevice, min: *mut c_uint, max: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if min.is_null() || max.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(min, 200_000);
        put(max, 700_000);
        NVML_SUCCESS
    })
}
