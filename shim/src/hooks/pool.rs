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
//! parallel. The counting is the accounting's (`accounting/pool.rs`,
//! `accounting/records/pools.rs`).

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;

/// Shared body of the stream-ordered allocations. `pool` is `None` for the device's current pool.
fn pool_alloc(bytesize: usize, pool: Option<CUmemoryPool>, real: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::Off => real(),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active.pool_alloc(bytesize as u64, pool, real),
    }
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
        unsafe { raw::cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, Some(pool), answer.wrap(real)))
}

/// # Safety
/// `cuMemAllocFromPoolAsync_ptsz` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| pool_alloc(bytesize, Some(pool), answer.wrap(real)))
}

/// Runs a call after which pools may have shrunk, then re-reads them.
fn then_refresh(real: impl FnOnce() -> CUresult) -> CUresult {
    let rc = real();
    fgpu_core::crash_point!("sync.returned");
    if let Mode::On(active) = accounting::mode() {
        active.after_sync();
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
        let Mode::On(active) = accounting::mode() else { return answer.of(real()) };
        let rc = answer.of(real());
        if rc == CUDA_SUCCESS {
            active.pool_destroyed(pool);
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
