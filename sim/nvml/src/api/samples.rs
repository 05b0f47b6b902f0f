//! Utilisation samples per process, from the device timeline of fgpu-sim-state
//! (nvmlDeviceGetProcessUtilization, nvmlDeviceGetProcessesUtilizationInfo).

use crate::boundary::*;
use fgpu_sim_state::{ProcessUtilisation, SimState};
use std::ffi::{c_uint, c_ulonglong};

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
pub struct ProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `nvmlProcessUtilizationInfo_v1_t` (r550).
#[repr(C)]
pub struct ProcessUtilizationInfoV1 {
    pub time_stamp: c_ulonglong,
    pub pid: c_uint,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
    pub jpg_util: c_uint,
    pub ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1_t` (r550).
#[repr(C)]
pub struct ProcessesUtilizationInfo {
    pub version: c_uint,
    pub process_samples_count: c_uint,
    pub last_seen_time_stamp: c_ulonglong,
    pub proc_util_array: *mut ProcessUtilizationInfoV1,
}

/// `nvmlProcessesUtilizationInfo_v1` = sizeof | 1 << 24.
const NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint = std::mem::size_of::<ProcessesUtilizationInfo>() as c_uint | (1 << 24);
const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// First CUDA version whose driver (r550) has `nvmlDeviceGetProcessesUtilizationInfo`.
const PROCESSES_UTILIZATION_INFO_SINCE: u32 = 12040;

const _: () = {
    assert!(std::mem::size_of::<ProcessUtilizationSample>() == 32);
    assert!(std::mem::size_of::<ProcessUtilizationInfoV1>() == 40);
    assert!(std::mem::size_of::<ProcessesUtilizationInfo>() == 24);
    assert!(NVML_PROCESSES_UTILIZATION_INFO_V1 == 0x0100_0018);
};

/// The samples newer than `last_seen` (CPU microseconds) of GPU `i`: (timestamp, pid,
/// SM percent), one per process running there, and the number of processes running
/// ([`SimState::process_utilisation`]). On a MIG-enabled GPU per-process utilisation is
/// not supported ("On MIG-enabled GPUs, querying process utilization is not currently
/// supported").
fn process_samples(s: &SimState, i: usize, last_seen: u64) -> Result<ProcessUtilisation, NvmlReturn> {
    if s.mig_on(i) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(s.process_utilisation(i, last_seen))
}

/// NVML's sample-list rules: no sample is `NVML_ERROR_NOT_FOUND`; a NULL array or a count
/// smaller than the samples is `NVML_ERROR_INSUFFICIENT_SIZE`, with the count a size query
/// is answered: "the number of processes running" (nvml.h), which bounds the samples (one
/// per process), so the two-call pattern holds while samples arrive between the calls.
fn give_samples<T>(u: &ProcessUtilisation, count: *mut c_uint, out: *mut T, make: impl Fn(u64, u32, u32) -> T) -> NvmlReturn {
    let (samples, running) = (&u.samples, u.running);
    // SAFETY: count is non-NULL (checked by the callers) and points to an unsigned int.
    let cap = unsafe { count.read_unaligned() } as usize;
    if samples.is_empty() {
        put(count, 0);
        return NVML_ERROR_NOT_FOUND;
    }
    if out.is_null() || cap < samples.len() {
        put(count, running.max(samples.len()) as c_uint);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    put(count, samples.len() as c_uint);
    for (k, x) in samples.iter().enumerate() {
        // SAFETY: the caller's array holds `cap` >= samples.len() entries.
        put(unsafe { out.add(k) }, make(x.timestamp_us, x.pid, x.sm_util));
    }
    NVML_SUCCESS
}

/// `nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t*,
/// unsigned *processSamplesCount, unsigned long long lastSeenTimeStamp)`: one sample per
/// running process that ran kernels in the completed sample periods newer than
/// `lastSeenTimeStamp`, with PIDs by `FGPU_SIM_NVML_PIDS` (the caller's PID for a process it
/// can see and the raw host PID otherwise, in the caller modes; host PIDs in the others)
/// and CPU timestamps in microseconds.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    h: NvmlDevice,
    samples: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let u = tri!(process_samples(&s, i, last_seen));
        give_samples(&u, count, samples, |time_stamp, pid, sm_util| ProcessUtilizationSample {
            pid,
            time_stamp,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        })
    })
}

/// `nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t, nvmlProcessesUtilizationInfo_t*)`
/// (r550): the same samples in the v1 layout. Drivers before r550 do not have it.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(h: NvmlDevice, info: *mut ProcessesUtilizationInfo) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if s.driver_version() < PROCESSES_UTILIZATION_INFO_SINCE {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL, the caller's nvmlProcessesUtilizationInfo_t.
        let (version, last_seen, out) = unsafe { ((*info).version, (*info).last_seen_time_stamp, (*info).proc_util_array) };
        if version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        // SAFETY: the count field of the caller's struct.
        let count = unsafe { std::ptr::addr_of_mut!((*info).process_samples_count) };
        let u = tri!(process_samples(&s, i, last_seen));
        give_samples(&u, count, out, |time_stamp, pid, sm_util| ProcessUtilizationInfoV1 {
            time_stamp,
            pid,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
            jpg_util: 0,
            ofa_util: 0,
        })
    })
}
