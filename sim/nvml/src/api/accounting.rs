//! Per-process accounting (nvmlDeviceGetAccountingPids and Stats).

use crate::boundary::*;
use fgpu_sim_state::SimState;
use std::ffi::{c_uint, c_ulonglong};

/// `nvmlAccountingStats_t`.
#[repr(C)]
pub struct NvmlAccountingStats {
    pub gpu_utilization: c_uint,
    pub memory_utilization: c_uint,
    pub max_memory_usage: c_ulonglong,
    pub time: c_ulonglong,
    pub start_time: c_ulonglong,
    pub is_running: c_uint,
    pub reserved: [c_uint; 5],
}

/// The processes accounting knows on device `i`: every live one with a context there, by
/// its raw host PID (the driver records `pClient->ProcID` when the device is allocated and
/// looks stats up by it, whatever the caller's namespace: `gpuacctGetAcctPids`,
/// `gpuacctGetProcAcctInfo`). The simulator keeps no record of processes that have exited.
fn accounted(s: &SimState, i: usize) -> Result<Vec<(u32, u64)>, NvmlReturn> {
    // "On MIG-enabled GPUs, accounting mode would be set to DISABLED": the lists answer as
    // with accounting off.
    if s.mig_on(i) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    s.reclaim_dead();
    Ok(s.processes()
        .into_iter()
        .filter(|p| p.host_pid != 0 && (p.per_device_contexts.get(i).copied().unwrap_or(0) > 0 || p.per_device_used.get(i).copied().unwrap_or(0) > 0))
        .map(|p| (p.host_pid, p.per_device_used.get(i).copied().unwrap_or(0)))
        .collect())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(h: NvmlDevice, count: *mut c_uint, pids: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let found = tri!(accounted(&s, i));
        // SAFETY: count is non-NULL (checked above) and points to an unsigned int.
        let cap = unsafe { count.read_unaligned() } as usize;
        put(count, found.len() as c_uint);
        if found.is_empty() {
            return NVML_SUCCESS;
        }
        if pids.is_null() || cap < found.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (k, (pid, _)) in found.iter().enumerate() {
            // SAFETY: the caller's array holds `cap` >= found.len() entries.
            put(unsafe { pids.add(k) }, *pid);
        }
        NVML_SUCCESS
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(h: NvmlDevice, pid: c_uint, stats: *mut NvmlAccountingStats) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if stats.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match tri!(accounted(&s, i)).into_iter().find(|(p, _)| *p == pid) {
            Some((_, used)) => {
                put(
                    stats,
                    NvmlAccountingStats {
                        gpu_utilization: 0,
                        memory_utilization: 0,
                        max_memory_usage: used,
                        time: 0,
                        start_time: 0,
                        is_running: 1,
                        reserved: [0; 5],
                    },
                );
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceClearAccountingPids(h: NvmlDevice) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_SUCCESS
    })
}
