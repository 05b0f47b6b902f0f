//! CUDA graph memory: the physical memory behind graph memory nodes
//! (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured into a graph).
//!
//! The driver takes it when a graph is uploaded or launched, from a per-device graph pool
//! that keeps it until `cuDeviceGraphMemTrim`. No call names the amount beforehand, so fgpu
//! counts it after the fact: after every launch and upload, trim, graph-exec destruction and
//! synchronisation it settles the device's count to the pool's
//! `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`. What a launch takes therefore shows in every
//! "used" figure and holds later allocations to the cap at once; the launch itself is not
//! refused (one launch may pass the cap by its own graph memory, and says so on stderr).

use crate::abi::cuda::*;
use crate::state::{self, Active, Mode};
use fgpu_core::limit::format_bytes;
use fgpu_core::log::{self, Level, RateLimit};
use fgpu_core::log_at;
use fgpu_core::uuid::format_gpu_uuid;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

fn reserved_graph_memory(ordinal: CUdevice) -> Option<u64> {
    let mut value: u64 = 0;
    let rc = crate::call_real!(
        cuDeviceGetGraphMemAttribute: fn(CUdevice, u32, *mut c_void) -> CUresult,
        ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, (&mut value as *mut u64).cast()
    )?;
    (rc == CUDA_SUCCESS).then_some(value)
}

/// Brings the count of `ordinal`'s graph pool to what the driver reserves for it.
fn settle_device(active: &Active, ordinal: CUdevice, call: &str) {
    let Some(dev) = active.known_device(ordinal) else { return };
    let mut counted = active.graph_memory.lock();
    let Some(reserved) = reserved_graph_memory(ordinal) else { return };
    let before = counted.get(&ordinal).copied().unwrap_or(0);
    if reserved == before {
        return;
    }
    active.settle(dev, before, reserved);
    counted.insert(ordinal, reserved);
    active.any_graph_memory.store(true, Ordering::Release);
    let held = active.container_used(dev);
    if reserved > before && held > dev.limit {
        static LIMIT: RateLimit = RateLimit::new(1_000_000_000);
        if LIMIT.check(log::monotonic_ns()).is_some() {
            log_at!(
                Level::Warn,
                "{call} took {} of graph memory on {}: the container now holds {} of its {} cap; allocations are refused until graph memory is trimmed (cuDeviceGraphMemTrim) or freed",
                format_bytes(reserved - before),
                format_gpu_uuid(&dev.uuid),
                format_bytes(held),
                format_bytes(dev.limit)
            );
        }
    }
}

/// Re-reads the graph pool of every device this process has counted graph memory on.
pub fn refresh_graph_memory(active: &Active) {
    if !active.any_graph_memory.load(Ordering::Acquire) {
        return;
    }
    let ordinals: Vec<CUdevice> = active.graph_memory.lock().keys().copied().collect();
    for ordinal in ordinals {
        settle_device(active, ordinal, "synchronisation");
    }
}

/// A launch or upload: the current device's graph pool may have grown.
fn after_launch(call: &str, real: impl FnOnce() -> CUresult) -> CUresult {
    let rc = real();
    if let Mode::On(active) = state::mode() {
        if let Ok(dev) = active.current_device() {
            settle_device(active, dev.ordinal, call);
        }
    }
    rc
}

/// # Safety
/// `cuGraphLaunch` contract.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuGraphLaunch: fn(CUgraphExec, CUstream) -> CUresult, exec, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || after_launch("cuGraphLaunch", real))
}

/// # Safety
/// `cuGraphLaunch_ptsz` contract (per-thread default stream).
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuGraphLaunch_ptsz: fn(CUgraphExec, CUstream) -> CUresult, exec, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || after_launch("cuGraphLaunch", real))
}

/// # Safety
/// `cuGraphUpload` contract.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuGraphUpload: fn(CUgraphExec, CUstream) -> CUresult, exec, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || after_launch("cuGraphUpload", real))
}

/// # Safety
/// `cuGraphUpload_ptsz` contract (per-thread default stream).
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuGraphUpload_ptsz: fn(CUgraphExec, CUstream) -> CUresult, exec, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || after_launch("cuGraphUpload", real))
}

/// # Safety
/// `cuDeviceGraphMemTrim` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    let real = || crate::call_real!(cuDeviceGraphMemTrim: fn(CUdevice) -> CUresult, device).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || {
        let rc = real();
        if let Mode::On(active) = state::mode() {
            settle_device(active, device, "cuDeviceGraphMemTrim");
        }
        rc
    })
}

/// # Safety
/// `cuGraphExecDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    let real = || crate::call_real!(cuGraphExecDestroy: fn(CUgraphExec) -> CUresult, exec).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || {
        let rc = real();
        if let Mode::On(active) = state::mode() {
            refresh_graph_memory(active);
        }
        rc
    })
}
