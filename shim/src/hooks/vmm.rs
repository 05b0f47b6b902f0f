//! Virtual memory management (`cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`),
//! used by PyTorch's expandable segments, JAX/XLA and vLLM.
//!
//! `cuMemCreate` with a device location takes physical memory: reserved before the call.
//! The memory goes away only when the handle is released *and* no mapping of it remains,
//! so that is when fgpu gives it back. Host-located handles are not device memory.
//!
//! The driver is called without holding this process's handle table: what it did is
//! recorded once it has answered, so threads map and unmap in parallel.

use crate::driver::raw;
use crate::abi::cuda::*;
use crate::state::{self, Mode};
use std::collections::{BTreeMap, HashMap};

/// Physical allocations this process holds, and which virtual ranges map them.
#[derive(Default)]
pub struct Handles {
    handles: HashMap<CUmemGenericAllocationHandle, Handle>,
    /// Start of a mapped range -> (its size, the handle mapped there).
    mappings: BTreeMap<CUdeviceptr, (usize, CUmemGenericAllocationHandle)>,
}

struct Handle {
    ordinal: CUdevice,
    bytes: u64,
    mappings: u32,
    released: bool,
}

/// # Safety
/// `cuMemCreate` contract: `handle` writable, `prop` readable.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemCreate(handle, size, prop, flags) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    if handle.is_null() || prop.is_null() || size == 0 {
        return real();
    }
    // SAFETY: non-null, caller-provided property struct of the documented layout.
    let location = unsafe { (*prop).location };
    if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return real();
    }
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| match state::mode() {
        Mode::Off => answer.of(real()),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => {
            let dev = match active.device(location.id) {
                Ok(dev) => dev,
                Err(rc) => return rc,
            };
            if let Err(rc) = active.reserve(dev, size as u64, "cuMemCreate") {
                return rc;
            }
            fgpu_core::crash_point!("vmm.reserved");
            let rc = answer.of(real());
            fgpu_core::crash_point!("vmm.created");
            if rc == CUDA_SUCCESS {
                // SAFETY: on success the driver wrote the new handle.
                let created = unsafe { *handle };
                active.vmm.lock().handles.insert(created, Handle { ordinal: location.id, bytes: size as u64, mappings: 0, released: false });
            } else {
                active.release(dev, size as u64);
            }
            rc
        }
    })
}

/// Gives a handle's memory back once it is released and unmapped. Caller holds the lock.
fn drop_if_gone(active: &state::Active, handles: &mut Handles, id: CUmemGenericAllocationHandle) {
    let gone = handles.handles.get(&id).is_some_and(|h| h.released && h.mappings == 0);
    if gone {
        let h = handles.handles.remove(&id).expect("checked above");
        if let Some(dev) = active.known_device(h.ordinal) {
            active.release(dev, h.bytes);
        }
    }
}

/// # Safety
/// `cuMemRelease` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemRelease(handle) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let Mode::On(active) = state::mode() else { return answer.of(real()) };
        let rc = answer.of(real());
        fgpu_core::crash_point!("vmm.released");
        if rc == CUDA_SUCCESS {
            let mut handles = active.vmm.lock();
            if let Some(h) = handles.handles.get_mut(&handle) {
                h.released = true;
            }
            drop_if_gone(active, &mut handles, handle);
        }
        rc
    })
}

/// # Safety
/// `cuMemMap` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemMap(ptr, size, offset, handle, flags) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let Mode::On(active) = state::mode() else { return answer.of(real()) };
        let rc = answer.of(real());
        fgpu_core::crash_point!("vmm.mapped");
        if rc == CUDA_SUCCESS {
            let mut handles = active.vmm.lock();
            if let Some(h) = handles.handles.get_mut(&handle) {
                h.mappings += 1;
                handles.mappings.insert(ptr, (size, handle));
            }
        }
        rc
    })
}

/// # Safety
/// `cuMemUnmap` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemUnmap(ptr, size) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let Mode::On(active) = state::mode() else { return answer.of(real()) };
        let rc = answer.of(real());
        fgpu_core::crash_point!("vmm.unmapped");
        if rc == CUDA_SUCCESS {
            let mut handles = active.vmm.lock();
            // One unmap may cover several mapped ranges.
            let end = ptr.saturating_add(size as u64);
            let covered: Vec<CUdeviceptr> = handles.mappings.range(ptr..end).map(|(start, _)| *start).collect();
            for start in covered {
                if let Some((_, id)) = handles.mappings.remove(&start) {
                    if let Some(h) = handles.handles.get_mut(&id) {
                        h.mappings = h.mappings.saturating_sub(1);
                    }
                    drop_if_gone(active, &mut handles, id);
                }
            }
        }
        rc
    })
}
