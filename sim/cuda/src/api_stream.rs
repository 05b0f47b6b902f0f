// Exported CUDA driver entry points: streams and events.
// Included by lib.rs.

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
