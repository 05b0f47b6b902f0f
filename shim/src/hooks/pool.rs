//! Stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`).
//!
//! What the device really holds is each pool's *reserved* memory: `cuMemFreeAsync` returns
//! memory to the pool, not to the device, and a pool gives memory back only at
//! synchronisation points and only down to its release threshold. So fgpu counts, per pool,
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`:
//!
//! * before an allocation, it reserves what the pool may have to grow by (the request minus
//!   the free reserve the pool is sure to keep, rounded up to 2 MiB: a pool gives back what
//!   lies above its release threshold at any synchronisation, perhaps another thread's
//!   just before this allocation), so a pool that would pass the cap is refused before the
//!   driver is asked;
//! * after it, and after every stream/event/context synchronisation, trim and pool
//!   destruction, it settles the count to the pool's reserved memory.
//!
//! No lock is held across the allocation itself: streams of one process allocate in
//! parallel (see `counted_pool.rs` for how overlapping calls are counted).

use crate::driver::raw;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::counted_pool::{CountedPool, InFlight};
use crate::state::{self, Active, Mode};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

const POOL_GRANULE: u64 = 2 << 20;

fn pool_attribute(pool: CUmemoryPool, attribute: u32) -> Option<u64> {
    driver().mem_pool_attribute(pool, attribute)
}

fn current_pool(ordinal: CUdevice) -> Option<CUmemoryPool> {
    driver().device_mem_pool(ordinal)
}

/// Brings the count for one pool to its reserved memory, once `done` has run.
fn settle_pool(active: &Active, pools: &mut HashMap<usize, CountedPool>, pool: CUmemoryPool, done: InFlight) {
    let Some(counted) = pools.get_mut(&(pool as usize)) else { return };
    let Some(dev) = active.known_device(counted.ordinal) else { return };
    let (before, after) = counted.finish(done, pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    active.settle(dev, before, after);
}

/// Re-reads every known pool (after synchronisation points, where pools shrink).
pub fn refresh_pools(active: &Active) {
    if !active.any_pool.load(Ordering::Acquire) {
        return;
    }
    let mut pools = active.pools.lock();
    let keys: Vec<usize> = pools.keys().copied().collect();
    for pool in keys {
        settle_pool(active, &mut pools, pool as CUmemoryPool, InFlight::default());
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
    let in_flight = {
        let mut pools = active.pools.lock();
        let counted = pools.entry(pool as usize).or_insert_with(|| CountedPool::new(dev.ordinal));
        active.any_pool.store(true, Ordering::Release);
        let reserved = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
        let used = pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(0);
        // What a synchronisation leaves the pool (its release threshold, in granules).
        let kept = pool_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).map_or(0, |t| t.saturating_add(POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE);
        let growth = counted.growth_for(bytesize as u64, reserved, used, kept, POOL_GRANULE);
        if growth > 0 {
            if let Err(rc) = active.reserve(dev, growth, "cuMemAllocAsync") {
                return rc;
            }
        }
        counted.begin(growth, bytesize as u64)
    };
    fgpu_core::crash_point!("pool.reserved");
    let rc = real();
    fgpu_core::crash_point!("pool.allocated");
    settle_pool(active, &mut active.pools.lock(), pool, in_flight);
    rc
}

/// # Safety
/// `cuMemAllocAsync` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemAllocAsync(dptr, bytesize, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, None, answer.wrap(real)))
}

/// # Safety
/// `cuMemAllocAsync_ptsz` contract (per-thread default stream).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemAllocAsync_ptsz(dptr, bytesize, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, None, answer.wrap(real)))
}

/// # Safety
/// `cuMemAllocFromPoolAsync` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, Some(pool), answer.wrap(real)))
}

/// # Safety
/// `cuMemAllocFromPoolAsync_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream) }
            .unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, Some(pool), answer.wrap(real)))
}

/// Runs a call after which pools may have shrunk, then re-reads them.
fn then_refresh(real: impl FnOnce() -> CUresult) -> CUresult {
    let rc = real();
    fgpu_core::crash_point!("sync.returned");
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
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    unsafe { raw::cuMemFreeAsync(dptr, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `cuMemFreeAsync_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    unsafe { raw::cuMemFreeAsync_ptsz(dptr, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `cuMemPoolTrimTo` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemPoolTrimTo(pool, min_bytes_to_keep) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| then_refresh(answer.wrap(real)))
}

/// # Safety
/// `cuMemPoolDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMemPoolDestroy(pool) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let Mode::On(active) = state::mode() else { return answer.of(real()) };
        let rc = answer.of(real());
        if rc == CUDA_SUCCESS {
            let removed = active.pools.lock().remove(&(pool as usize));
            if let Some(counted) = removed {
                if let Some(dev) = active.known_device(counted.ordinal) {
                    active.release(dev, counted.counted());
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
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuStreamSynchronize(stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        crate::compute::before_sync(Some((stream, false)));
        then_refresh(answer.wrap(real))
    })
}

/// # Safety
/// `cuStreamSynchronize_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuStreamSynchronize_ptsz(stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        crate::compute::before_sync(Some((stream, true)));
        then_refresh(answer.wrap(real))
    })
}

/// # Safety
/// `cuEventSynchronize` contract.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuEventSynchronize(event) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        crate::compute::before_sync(None);
        then_refresh(answer.wrap(real))
    })
}

/// # Safety
/// `cuCtxSynchronize` contract.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuCtxSynchronize() }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        crate::compute::before_sync(None);
        then_refresh(answer.wrap(real))
    })
}
