//! Stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`).
//!
//! What the device really holds is each pool's *reserved* memory: `cuMemFreeAsync` returns
//! memory to the pool, not to the device, and a pool gives memory back only at
//! synchronisation points and only down to its release threshold. So fgpu counts, per pool,
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`:
//!
//! * before an allocation, it reserves what the pool may have to grow by (the request minus
//!   the pool's free reserve, rounded up to 2 MiB), so a pool that would pass the cap is
//!   refused before the driver is asked;
//! * after it, and after every stream/event/context synchronisation, trim and pool
//!   destruction, it settles the count to the pool's reserved memory.

use crate::abi::cuda::*;
use crate::state::{self, Active, Mode};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

const POOL_GRANULE: u64 = 2 << 20;

fn pool_attribute(pool: CUmemoryPool, attribute: u32) -> Option<u64> {
    let mut value: u64 = 0;
    let rc = crate::call_real!(
        cuMemPoolGetAttribute: fn(CUmemoryPool, u32, *mut c_void) -> CUresult,
        pool, attribute, (&mut value as *mut u64).cast()
    )?;
    (rc == CUDA_SUCCESS).then_some(value)
}

fn current_pool(ordinal: CUdevice) -> Option<CUmemoryPool> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let rc = crate::call_real!(cuDeviceGetMemPool: fn(*mut CUmemoryPool, CUdevice) -> CUresult, &mut pool, ordinal)?;
    (rc == CUDA_SUCCESS && !pool.is_null()).then_some(pool)
}

/// Brings the count for one pool to its reserved memory. Caller holds `active.pools`.
fn settle_pool(active: &Active, pools: &mut std::collections::HashMap<usize, (CUdevice, u64)>, pool: CUmemoryPool, extra_reserved: u64) {
    let Some(&(ordinal, counted)) = pools.get(&(pool as usize)) else {
        return;
    };
    let Some(dev) = active.known_device(ordinal) else { return };
    let counted = counted + extra_reserved;
    match pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) {
        Some(reserved) => {
            active.settle(dev, counted, reserved);
            pools.insert(pool as usize, (ordinal, reserved));
        }
        None => {
            pools.insert(pool as usize, (ordinal, counted));
        }
    }
}

/// Re-reads every known pool (after synchronisation points, where pools shrink).
pub fn refresh_pools(active: &Active) {
    if !active.any_pool.load(Ordering::Acquire) {
        return;
    }
    let mut pools = active.pools.lock();
    let keys: Vec<usize> = pools.keys().copied().collect();
    for pool in keys {
        settle_pool(active, &mut pools, pool as CUmemoryPool, 0);
    }
}

/// Shared body of the stream-ordered allocations. `pool` is `None` for the device's current pool.
fn pool_alloc(bytesize: usize, pool: Option<CUmemoryPool>, real: impl FnOnce() -> CUresult) -> CUresult {
    let active = match state::mode() {
        Mode::Off => return real(),
        Mode::Closed(_) => return CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active,
    };
    let dev = match active.current_device() {
        Ok(dev) => dev,
        Err(rc) => return rc,
    };
    let Some(pool) = pool.or_else(|| current_pool(dev.ordinal)) else {
        return real();
    };
    super::untracked::settling(active, || grow_pool(active, dev, pool, bytesize, real))
}

/// Reserves what `pool` may grow by for `bytesize`, runs `real`, settles the pool.
fn grow_pool(active: &Active, dev: &crate::state::Dev, pool: CUmemoryPool, bytesize: usize, real: impl FnOnce() -> CUresult) -> CUresult {
    let mut pools = active.pools.lock();
    pools.entry(pool as usize).or_insert((dev.ordinal, 0));
    active.any_pool.store(true, Ordering::Release);
    let reserved = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
    let used = pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(0);
    let growth = (bytesize as u64).saturating_sub(reserved.saturating_sub(used)).next_multiple_of(POOL_GRANULE);
    if growth > 0 {
        if let Err(rc) = active.reserve(dev, growth, "cuMemAllocAsync") {
            return rc;
        }
    }
    let rc = real();
    if rc == CUDA_SUCCESS {
        settle_pool(active, &mut pools, pool, growth);
    } else if growth > 0 {
        active.release(dev, growth);
    }
    rc
}

/// # Safety
/// `cuMemAllocAsync` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream) -> CUresult, dptr, bytesize, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_OUT_OF_MEMORY, || pool_alloc(bytesize, None, real))
}

/// # Safety
/// `cuMemAllocAsync_ptsz` contract (per-thread default stream).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, CUstream) -> CUresult, dptr, bytesize, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_OUT_OF_MEMORY, || pool_alloc(bytesize, None, real))
}

/// # Safety
/// `cuMemAllocFromPoolAsync` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let real = || {
        crate::call_real!(cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult, dptr, bytesize, pool, stream)
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard(CUDA_ERROR_OUT_OF_MEMORY, || pool_alloc(bytesize, Some(pool), real))
}

/// # Safety
/// `cuMemAllocFromPoolAsync_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let real = || {
        crate::call_real!(cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult, dptr, bytesize, pool, stream)
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard(CUDA_ERROR_OUT_OF_MEMORY, || pool_alloc(bytesize, Some(pool), real))
}

/// Runs a call after which pools may have shrunk, then re-reads them.
fn then_refresh(real: impl FnOnce() -> CUresult) -> CUresult {
    let rc = real();
    if let Mode::On(active) = state::mode() {
        refresh_pools(active);
        super::graph::refresh_graph_memory(active);
        super::untracked::count_untracked(active);
    }
    rc
}

/// Freed memory goes back to its pool, not the device: nothing changes until the pool shrinks.
///
/// # Safety
/// `cuMemFreeAsync` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call_real!(cuMemFreeAsync: fn(CUdeviceptr, CUstream) -> CUresult, dptr, stream).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `cuMemFreeAsync_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call_real!(cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream) -> CUresult, dptr, stream).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `cuMemPoolTrimTo` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    let real = || crate::call_real!(cuMemPoolTrimTo: fn(CUmemoryPool, usize) -> CUresult, pool, min_bytes_to_keep).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || then_refresh(real))
}

/// # Safety
/// `cuMemPoolDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let real = || crate::call_real!(cuMemPoolDestroy: fn(CUmemoryPool) -> CUresult, pool).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || {
        let Mode::On(active) = state::mode() else { return real() };
        let mut pools = active.pools.lock();
        let rc = real();
        if rc == CUDA_SUCCESS {
            if let Some((ordinal, counted)) = pools.remove(&(pool as usize)) {
                if let Some(dev) = active.known_device(ordinal) {
                    active.release(dev, counted);
                }
            }
        }
        rc
    })
}

/// # Safety
/// `cuStreamSynchronize` contract.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuStreamSynchronize: fn(CUstream) -> CUresult, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || then_refresh(real))
}

/// # Safety
/// `cuStreamSynchronize_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    let real = || crate::call_real!(cuStreamSynchronize_ptsz: fn(CUstream) -> CUresult, stream).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || then_refresh(real))
}

/// # Safety
/// `cuEventSynchronize` contract.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    let real = || crate::call_real!(cuEventSynchronize: fn(CUevent) -> CUresult, event).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || then_refresh(real))
}

/// # Safety
/// `cuCtxSynchronize` contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let real = || crate::call_real!(cuCtxSynchronize: fn() -> CUresult).unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard(CUDA_ERROR_INVALID_VALUE, || then_refresh(real))
}
