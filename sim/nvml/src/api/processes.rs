//! The compute, graphics and MPS process lists (v1, v2, v3), from the simulated driver's
//! per-process usage.

use crate::boundary::*;
use fgpu_sim_state::SimState;
use std::ffi::{c_uint, c_ulonglong};

/// Instance ids reported for processes of a GPU without MIG.
pub(crate) const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// Which process list.
#[derive(Clone, Copy, PartialEq)]
enum ListKind {
    Compute,
    Graphics,
    Mps,
}

/// One entry of a process list: PID, used bytes, GPU and compute instance IDs.
type Entry = (u32, u64, c_uint, c_uint);

/// The entries of one process list of a GPU or MIG device as NVML gives them to the calling
/// process, by the mode of `FGPU_SIM_NVML_PIDS` (see [`SimState::nvml_list_pid`]). Compute
/// lists every process with a context or memory on the device; graphics and MPS those that
/// registered as such (`FGPU_SIM_PROCESS_KINDS`). On a GPU in MIG mode each entry names the
/// instances the process runs in; a MIG device lists only its own processes.
fn device_processes(s: &SimState, t: &Target, kind: ListKind) -> Vec<Entry> {
    let (i, only) = match t {
        Target::Gpu(i) => (*i, None),
        Target::Mig(m) => (m.device, Some((m.gpu_instance.id, m.compute_instance.id))),
    };
    s.reclaim_dead();
    let all = s.processes();
    all.iter()
        .filter(|p| p.per_device_contexts.get(i).copied().unwrap_or(0) > 0 || p.per_device_used.get(i).copied().unwrap_or(0) > 0)
        .filter(|p| match kind {
            ListKind::Compute => true,
            ListKind::Graphics => p.kinds & fgpu_sim_state::KIND_GRAPHICS != 0,
            ListKind::Mps => p.kinds & fgpu_sim_state::KIND_MPS != 0,
        })
        .filter(|p| only.is_none() || p.mig.get(i).copied().flatten() == only)
        .filter_map(|p| {
            let pid = s.nvml_list_pid(p)?;
            let (gi, ci) = p.mig.get(i).copied().flatten().unwrap_or((NO_INSTANCE, NO_INSTANCE));
            Some((pid, s.nvml_list_memory(p, pid, i, &all), gi, ci))
        })
        .collect()
}

#[repr(C)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

#[repr(C)]
pub struct ProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessInfoV1>() == 16);
const _: () = assert!(std::mem::size_of::<ProcessInfoV2>() == 24);

/// The NVML list convention: a count too small gets NVML_ERROR_INSUFFICIENT_SIZE and
/// the needed count; otherwise the entries and their number.
fn fill<T>(procs: &[Entry], count: *mut c_uint, infos: *mut T, make: impl Fn(&Entry) -> T) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: count is non-NULL and points to an unsigned int (NVML API contract).
    let cap = unsafe { count.read_unaligned() } as usize;
    let n = procs.len();
    put(count, n as c_uint);
    if n == 0 {
        return NVML_SUCCESS;
    }
    if cap < n || infos.is_null() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (k, e) in procs.iter().enumerate() {
        // SAFETY: the caller's array holds `cap` >= n entries.
        put(unsafe { infos.add(k) }, make(e));
    }
    NVML_SUCCESS
}

fn list_v1(h: NvmlDevice, kind: ListKind, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NvmlReturn {
    let (s, t) = tri!(target(h));
    fill(&device_processes(&s, &t, kind), count, infos, |&(pid, used, _, _)| ProcessInfoV1 { pid, used_gpu_memory: used })
}

fn list_v2(h: NvmlDevice, kind: ListKind, count: *mut c_uint, infos: *mut ProcessInfoV2) -> NvmlReturn {
    let (s, t) = tri!(target(h));
    fill(&device_processes(&s, &t, kind), count, infos, |&(pid, used, gi, ci)| ProcessInfoV2 {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: gi,
        compute_instance_id: ci,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| list_v1(h, ListKind::Compute, c, p))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        list_v2(h, ListKind::Compute, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        list_v2(h, ListKind::Compute, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| list_v1(h, ListKind::Graphics, c, p))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(12u32);
        list_v2(h, ListKind::Graphics, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(13u32);
        list_v2(h, ListKind::Graphics, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(21u32);
        list_v1(h, ListKind::Mps, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(22u32);
        list_v2(h, ListKind::Mps, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(23u32);
        list_v2(h, ListKind::Mps, c, p)
    })
}
