// Exported CUDA driver entry points (part 2: copies, streams, events, pools).
// Included by lib.rs.

/// Validates a device range; `Some(true)` when it is host-backed (managed memory).
fn dev_range(dptr: u64, n: u64) -> Result<bool, CUresult> {
    let d = driver()?;
    let g = d.lock();
    match g.find_range(dptr, n) {
        Some((_, _, host)) => Ok(host),
        None => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn htod(dst: u64, src: *const c_void, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if src.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if tri!(dev_range(dst, n as u64)) {
        // SAFETY: dst..dst+n lies in a live managed mapping; src is the caller's n bytes.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

fn dtoh(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if dst.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if tri!(dev_range(src, n as u64)) {
        // SAFETY: src..src+n lies in a live managed mapping; dst is the caller's n bytes.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

fn dtod(dst: u64, src: u64, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    let a = tri!(dev_range(dst, n as u64));
    let b = tri!(dev_range(src, n as u64));
    if a && b {
        // SAFETY: both ranges lie in live managed mappings.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

fn memset(dst: u64, value: u32, elem: usize, n: usize) -> CUresult {
    let bytes = match n.checked_mul(elem) {
        Some(b) => b,
        None => return CUDA_ERROR_INVALID_VALUE,
    };
    if bytes == 0 {
        return CUDA_SUCCESS;
    }
    if !dst.is_multiple_of(elem as u64) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if tri!(dev_range(dst, bytes as u64)) {
        for i in 0..n {
            // SAFETY: the element lies inside a live managed mapping and is aligned.
            unsafe {
                match elem {
                    1 => *((dst as *mut u8).add(i)) = value as u8,
                    _ => *((dst as *mut u32).add(i)) = value,
                }
            }
        }
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    variant(8);
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD(dst: c_uint, src: *const c_void, n: c_uint) -> CUresult {
    guard(|| htod(dst as u64, src, n as usize))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| dtoh(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    variant(9);
    guard(|| dtoh(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH(dst: *mut c_void, src: c_uint, n: c_uint) -> CUresult {
    guard(|| dtoh(dst, src as u64, n as usize))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| dtod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    variant(10);
    guard(|| dtod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, _s: CUstream) -> CUresult {
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, _s: CUstream) -> CUresult {
    variant(11);
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, _s: CUstream) -> CUresult {
    guard(|| dtoh(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, _s: CUstream) -> CUresult {
    variant(12);
    guard(|| dtoh(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, uc: c_uchar, n: usize) -> CUresult {
    guard(|| memset(dst, uc as u32, 1, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, uc: c_uchar, n: usize) -> CUresult {
    variant(13);
    guard(|| memset(dst, uc as u32, 1, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8(dst: c_uint, uc: c_uchar, n: c_uint) -> CUresult {
    guard(|| memset(dst as u64, uc as u32, 1, n as usize))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, ui: c_uint, n: usize) -> CUresult {
    guard(|| memset(dst, ui, 4, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, ui: c_uint, n: usize) -> CUresult {
    variant(14);
    guard(|| memset(dst, ui, 4, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, uc: c_uchar, n: usize, _s: CUstream) -> CUresult {
    guard(|| memset(dst, uc as u32, 1, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, uc: c_uchar, n: usize, _s: CUstream) -> CUresult {
    variant(15);
    guard(|| memset(dst, uc as u32, 1, n))
}

// ---- streams and events ----

const CU_STREAM_LEGACY: usize = 0x1;
const CU_STREAM_PER_THREAD: usize = 0x2;

/// The context a stream belongs to (the current one for the special streams).
fn stream_ctx(g: &mut Inner, d: &Driver, s: CUstream) -> Result<(usize, usize), CUresult> {
    if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
        return g.current(d);
    }
    let ctx = *g.streams.get(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let dev = g.ctx_ready(d, ctx, CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
    Ok((ctx, dev))
}

fn stream_create(ph: *mut CUstream, flags: c_uint) -> CUresult {
    let d = tri!(driver());
    if ph.is_null() || flags & !1 != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    let (ctx, _) = tri!(g.current(d));
    let h = g.new_handle();
    g.streams.insert(h, ctx);
    put(ph, h);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    guard(|| stream_create(ph, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, _priority: c_int) -> CUresult {
    guard(|| stream_create(ph, flags))
}

fn stream_destroy(s: CUstream) -> CUresult {
    let d = tri!(driver());
    match d.lock().streams.remove(&s) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(s: CUstream) -> CUresult {
    guard(|| stream_destroy(s))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    variant(16);
    guard(|| stream_destroy(s))
}

fn stream_sync(s: CUstream) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    tri!(stream_ctx(&mut g, d, s));
    g.sync_pools(d);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    guard(|| stream_sync(s))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    variant(17);
    guard(|| stream_sync(s))
}

fn stream_query(s: CUstream) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    tri!(stream_ctx(&mut g, d, s));
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    guard(|| stream_query(s))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(s: CUstream) -> CUresult {
    variant(18);
    guard(|| stream_query(s))
}

fn stream_wait_event(s: CUstream, ev: CUevent) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    tri!(stream_ctx(&mut g, d, s));
    if !g.events.contains_key(&ev) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, ev: CUevent, _flags: c_uint) -> CUresult {
    guard(|| stream_wait_event(s, ev))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(s: CUstream, ev: CUevent, _flags: c_uint) -> CUresult {
    variant(19);
    guard(|| stream_wait_event(s, ev))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if ph.is_null() || flags & !0xf != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (ctx, _) = tri!(g.current(d));
        let h = g.new_handle();
        g.events.insert(h, ctx);
        put(ph, h);
        CUDA_SUCCESS
    })
}

fn event_record(ev: CUevent, s: CUstream) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    if !g.events.contains_key(&ev) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    tri!(stream_ctx(&mut g, d, s));
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, s: CUstream) -> CUresult {
    guard(|| event_record(ev, s))
}
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(ev: CUevent, s: CUstream) -> CUresult {
    variant(20);
    guard(|| event_record(ev, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        if !g.events.contains_key(&ev) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        g.sync_pools(d);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if d.lock().events.contains_key(&ev) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_HANDLE
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if ms.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        if !g.events.contains_key(&start) || !g.events.contains_key(&end) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        put(ms, 0.0);
        CUDA_SUCCESS
    })
}

fn event_destroy(ev: CUevent) -> CUresult {
    let d = tri!(driver());
    match d.lock().events.remove(&ev) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy(ev: CUevent) -> CUresult {
    guard(|| event_destroy(ev))
}
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    variant(21);
    guard(|| event_destroy(ev))
}

// ---- memory pools ----

const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;

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
        g.pools.insert(
            h,
            PoolRec {
                dev,
                model: PoolModel::new(),
                reuse: [1, 1, 1],
                max_size: pr.max_size as u64,
                destroyed: false,
                outstanding: 0,
            },
        );
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
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
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
