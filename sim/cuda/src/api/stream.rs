//! Exported CUDA driver entry points: streams and events.
//!
//! Work (kernels, event markers) goes on the device timeline of fgpu-sim-state, one FIFO
//! per context: a context's streams share it, so their work runs in submission order (the
//! simulator has no concurrency inside a context). Each stream remembers the sequence
//! number of its last item; synchronising waits for that item, querying compares with it.
//! A stream waiting for an event of its own context is already ordered after it; a wait on
//! another context's event is accepted and not modelled.

use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, Driver, EventRec, Inner, StreamKey};
use crate::errors::*;
use fgpu_sim_state::{TimelineContext, Work};
use std::ffi::{c_float, c_int, c_uint};

pub(crate) const CU_STREAM_LEGACY: usize = 0x1;
pub(crate) const CU_STREAM_PER_THREAD: usize = 0x2;
const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;

/// The context a stream belongs to (the current one for the special streams).
pub(super) fn stream_ctx(g: &mut Inner, d: &Driver, s: CUstream) -> Result<(usize, usize), CUresult> {
    if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
        return g.current(d);
    }
    let ctx = *g.streams.get(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let dev = g.ctx_ready(d, ctx, CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
    Ok((ctx, dev))
}

/// Which stream `s` is for the timeline bookkeeping. `ptds`: the call is a `_ptsz`/`_ptds`
/// variant, for which stream 0 is the calling thread's per-thread default stream.
pub(super) fn stream_key(ctx: usize, s: CUstream, ptds: bool) -> StreamKey {
    match s {
        0 if !ptds => (ctx, CU_STREAM_LEGACY),
        CU_STREAM_LEGACY => (ctx, CU_STREAM_LEGACY),
        0 | CU_STREAM_PER_THREAD => (ctx, CU_STREAM_PER_THREAD | (driver::thread_number() << 4)),
        s => (ctx, s),
    }
}

/// Where a stream's work ends: its context's timeline and the sequence number of its last
/// item (None when it never had work).
fn stream_end(g: &mut Inner, d: &Driver, s: CUstream, ptds: bool) -> Result<Option<(TimelineContext, u64)>, CUresult> {
    let (ctx, _) = stream_ctx(g, d, s)?;
    let key = stream_key(ctx, s, ptds);
    Ok(match (g.timelines.get(&ctx), g.stream_seq.get(&key)) {
        (Some(tl), Some(&seq)) => Some((*tl, seq)),
        _ => None,
    })
}

/// Records that stream `key` put item `seq` on the timeline.
pub(super) fn note_stream_seq(d: &Driver, key: StreamKey, seq: u64) {
    let mut g = d.lock();
    let v = g.stream_seq.entry(key).or_insert(0);
    *v = (*v).max(seq);
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

/// Like the real driver, destroying a stream with work pending returns at once; the work
/// still runs.
fn stream_destroy(s: CUstream) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    match g.streams.remove(&s) {
        Some(ctx) => {
            g.stream_seq.remove(&(ctx, s));
            g.captures.remove(&s);
            CUDA_SUCCESS
        }
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

fn stream_sync(s: CUstream, ptds: bool) -> CUresult {
    let d = tri!(driver());
    let end = {
        let mut g = d.lock();
        if g.captures.contains_key(&s) {
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        tri!(stream_end(&mut g, d, s, ptds))
    };
    if let Some((tl, seq)) = end {
        driver::wait(d, tl, seq);
    }
    d.lock().sync_pools(d);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    guard(|| stream_sync(s, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    variant(17);
    guard(|| stream_sync(s, true))
}

/// `CUDA_ERROR_NOT_READY` while the stream's work is pending.
fn stream_query(s: CUstream, ptds: bool) -> CUresult {
    let d = tri!(driver());
    let end = {
        let mut g = d.lock();
        if g.captures.contains_key(&s) {
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        tri!(stream_end(&mut g, d, s, ptds))
    };
    match end {
        Some((tl, seq)) if !driver::done(d, tl, seq) => CUDA_ERROR_NOT_READY,
        _ => CUDA_SUCCESS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    guard(|| stream_query(s, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(s: CUstream) -> CUresult {
    variant(18);
    guard(|| stream_query(s, true))
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

/// Waits for everything the current context submitted (`cuCtxSynchronize`).
pub(super) fn ctx_sync() -> CUresult {
    let d = tri!(driver());
    let tl = {
        let mut g = d.lock();
        let (ctx, _) = tri!(g.current(d));
        g.timelines.get(&ctx).copied()
    };
    if let Some(tl) = tl {
        driver::wait(d, tl, d.state.timeline_submitted(tl));
    }
    d.lock().sync_pools(d);
    CUDA_SUCCESS
}

/// Waits for the work of context `ctx` (before destroying it), with no lock held.
pub(super) fn ctx_drain(d: &Driver, ctx: usize) {
    let tl = d.lock().timelines.get(&ctx).copied();
    if let Some(tl) = tl {
        driver::wait(d, tl, d.state.timeline_submitted(tl));
    }
}

// ---- events ----

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
        g.events.insert(h, EventRec { ctx, flags, recorded: None });
        put(ph, h);
        CUDA_SUCCESS
    })
}

/// Replaces the marker an event refers to in the marker book.
fn event_set_marker(old: Option<(TimelineContext, u64)>, new: Option<(TimelineContext, u64)>) {
    let mut g = driver::markers();
    let book = g.get_or_insert_with(driver::MarkerBook::default);
    if let Some((tl, seq)) = old {
        book.live.remove(&(tl.incarnation, seq));
        book.ends.remove(&(tl.incarnation, seq));
    }
    if let Some((tl, seq)) = new {
        book.live.insert((tl.incarnation, seq));
    }
}

/// Puts a marker for event `ev` on stream `s` (an event recorded in a stream being
/// captured is accepted and not part of the graph).
fn event_record(ev: CUevent, s: CUstream, ptds: bool) -> CUresult {
    let d = tri!(driver());
    let (tl, key) = {
        let mut g = d.lock();
        let ev_ctx = match g.events.get(&ev) {
            Some(e) => e.ctx,
            None => return CUDA_ERROR_INVALID_HANDLE,
        };
        let (ctx, dev) = tri!(stream_ctx(&mut g, d, s));
        if ctx != ev_ctx {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if g.captures.contains_key(&s) {
            return CUDA_SUCCESS;
        }
        (tri!(g.timeline(d, ctx, dev)), stream_key(ctx, s, ptds))
    };
    let seq = tri!(driver::submit(d, tl, Work::Marker));
    // From now on its end is kept if its queue entry is reused before anyone reads it.
    event_set_marker(None, Some((tl, seq)));
    let old = {
        let mut g = d.lock();
        let v = g.stream_seq.entry(key).or_insert(0);
        *v = (*v).max(seq);
        match g.events.get_mut(&ev) {
            Some(e) => e.recorded.replace((tl, seq)),
            None => Some((tl, seq)),
        }
    };
    event_set_marker(old, None);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, s: CUstream) -> CUresult {
    guard(|| event_record(ev, s, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(ev: CUevent, s: CUstream) -> CUresult {
    variant(20);
    guard(|| event_record(ev, s, true))
}

/// `cuEventRecordWithFlags(CUevent, CUstream, unsigned flags)`: `CU_EVENT_RECORD_DEFAULT`
/// (0) or `CU_EVENT_RECORD_EXTERNAL` (1, meaningful in stream capture only).
fn event_record_with_flags(ev: CUevent, s: CUstream, flags: c_uint, ptds: bool) -> CUresult {
    if flags > 1 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    event_record(ev, s, ptds)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(ev: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    guard(|| event_record_with_flags(ev, s, flags, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(ev: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    variant(26);
    guard(|| event_record_with_flags(ev, s, flags, true))
}

/// Where event `ev` was last recorded (None: never).
fn event_marker(d: &Driver, ev: CUevent) -> Result<Option<(TimelineContext, u64)>, CUresult> {
    match d.lock().events.get(&ev) {
        Some(e) => Ok(e.recorded),
        None => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if let Some((tl, seq)) = tri!(event_marker(d, ev)) {
            driver::wait(d, tl, seq);
        }
        d.lock().sync_pools(d);
        CUDA_SUCCESS
    })
}

/// `CUDA_SUCCESS` once the work before the event's marker is done (or it was never
/// recorded), `CUDA_ERROR_NOT_READY` before.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        match tri!(event_marker(d, ev)) {
            Some((tl, seq)) if !driver::done(d, tl, seq) => CUDA_ERROR_NOT_READY,
            _ => CUDA_SUCCESS,
        }
    })
}

/// Milliseconds between the two events' completions on the device timeline.
fn elapsed(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    let d = tri!(driver());
    if ms.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (a, b) = {
        let g = d.lock();
        let (Some(a), Some(b)) = (g.events.get(&start), g.events.get(&end)) else { return CUDA_ERROR_INVALID_HANDLE };
        if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        let (Some(a), Some(b)) = (a.recorded, b.recorded) else { return CUDA_ERROR_INVALID_HANDLE };
        (a, b)
    };
    if !driver::done(d, a.0, a.1) || !driver::done(d, b.0, b.1) {
        return CUDA_ERROR_NOT_READY;
    }
    let (Some(ta), Some(tb)) = (driver::marker_end(d, a.0, a.1), driver::marker_end(d, b.0, b.1)) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    put(ms, ((tb as f64 - ta as f64) / 1e6) as c_float);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    guard(|| elapsed(ms, start, end))
}
/// The CUDA 12.8 form (same signature).
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    variant(27);
    guard(|| elapsed(ms, start, end))
}

fn event_destroy(ev: CUevent) -> CUresult {
    let d = tri!(driver());
    let removed = d.lock().events.remove(&ev);
    match removed {
        Some(e) => {
            event_set_marker(e.recorded, None);
            CUDA_SUCCESS
        }
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
