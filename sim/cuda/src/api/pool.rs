//! Exported CUDA driver entry points: stream-ordered memory pools.

use super::stream::stream_ctx;
use crate::boundary::*;
use crate::driver::{driver, PoolRec};
use crate::errors::*;
use fgpu_sim_state::pool::PoolModel;
use std::ffi::{c_int, c_uint, c_void};

// ---- memory pools ----

pub(crate) const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
pub(crate) const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
pub(crate) const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pool.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = d.lock().default_pool(dev);
        put(pool, h);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pool.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = d.lock().current_pool(dev);
        put(pool, h);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        let mut g = d.lock();
        match g.pools.get(&pool) {
            Some(p) if p.dev == dev && !p.destroyed => {
                g.current_pool[dev] = pool;
                CUDA_SUCCESS
            }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// Leading fields of `CUmemPoolProps` (88 bytes in all).
#[repr(C)]
pub struct CUmemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if pool.is_null() || props.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a valid CUmemPoolProps (CUDA API contract).
        let pr = unsafe { &*props };
        if pr.alloc_type != 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if pr.location_type != 1 {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        let dev = tri!(d.check_dev(pr.location_id));
        let mut g = d.lock();
        let h = g.new_handle();
        g.pools.insert(h, PoolRec { dev, model: PoolModel::new(), reuse: [1, 1, 1], max_size: pr.max_size as u64, destroyed: false, outstanding: 0 });
        put(pool, h);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        if g.default_pool.contains(&pool) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(p) = g.pools.get_mut(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        if p.destroyed {
            return CUDA_ERROR_INVALID_VALUE;
        }
        p.destroyed = true;
        let dev = p.dev;
        if p.outstanding == 0 {
            let r = p.model.destroy();
            d.give(dev, r);
            g.pools.remove(&pool);
        } else {
            // Memory in use stays until freed; the rest goes now.
            let r = p.model.trim_to(0);
            d.give(dev, r);
        }
        if g.current_pool.get(dev) == Some(&pool) {
            g.current_pool[dev] = 0;
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let Some(p) = g.pools.get_mut(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attr - 1) as usize] = get::<c_int>(value);
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.model.release_threshold = get::<u64>(value),
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => {
                if get::<u64>(value) != 0 {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                p.model.reserved_high = p.model.reserved;
            }
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                if get::<u64>(value) != 0 {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                p.model.used_high = p.model.used;
            }
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        let Some(p) = g.pools.get(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                put(value as *mut c_int, p.reuse[(attr - 1) as usize])
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => put(value as *mut u64, p.model.release_threshold),
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => put(value as *mut u64, p.model.reserved),
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => put(value as *mut u64, p.model.reserved_high),
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => put(value as *mut u64, p.model.used),
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => put(value as *mut u64, p.model.used_high),
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        let Some(p) = g.pools.get_mut(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        let r = p.model.trim_to(min_bytes_to_keep as u64);
        let dev = p.dev;
        d.give(dev, r);
        CUDA_SUCCESS
    })
}

fn alloc_async(dptr: *mut CUdeviceptr, size: usize, pool: Option<CUmemoryPool>, s: CUstream) -> CUresult {
    let d = tri!(driver());
    if dptr.is_null() || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    let (ctx, dev) = tri!(stream_ctx(&mut g, d, s));
    let ph = match pool {
        Some(p) => p,
        None => g.current_pool(dev),
    };
    let p = tri!(g.pool_alloc(d, ph, ctx, size as u64));
    put(dptr, p);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, s: CUstream) -> CUresult {
    guard(|| alloc_async(dptr, size, None, s))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, s: CUstream) -> CUresult {
    variant(22);
    guard(|| alloc_async(dptr, size, None, s))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) -> CUresult {
    guard(|| alloc_async(dptr, size, Some(pool), s))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) -> CUresult {
    variant(23);
    guard(|| alloc_async(dptr, size, Some(pool), s))
}

fn free_async(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    tri!(stream_ctx(&mut g, d, s));
    if g.free_alloc(d, ptr).is_some() {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    guard(|| free_async(dptr, s))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    variant(24);
    guard(|| free_async(dptr, s))
}
