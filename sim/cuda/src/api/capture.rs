//! Stream capture: kernels launched into a stream between cuStreamBeginCapture and
//! cuStreamEndCapture become kernel nodes of a new graph instead of running. Only kernel
//! launches are captured; copies, memsets and stream-ordered allocations issued to a
//! capturing stream act at once, and events recorded in it are not part of the graph.
//! Synchronising or querying a capturing stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
//! as on the real driver.

use super::graph::{CUgraph, CUgraphNode};
use super::stream::{stream_ctx, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, CaptureRec, GraphRec};
use crate::errors::*;
use std::ffi::{c_int, c_uint, c_void};

/// `CUstreamCaptureStatus`.
const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CUstreamCaptureMode`: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2.
const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_uint = 1;

fn begin_capture(s: CUstream, mode: c_uint) -> CUresult {
    let d = tri!(driver());
    if mode > 2 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
        // The legacy and per-thread default streams cannot be captured (on this simulator;
        // the real driver allows the per-thread one).
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    let mut g = d.lock();
    tri!(stream_ctx(&mut g, d, s));
    if g.captures.contains_key(&s) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    let graph = g.new_handle();
    g.graphs.insert(graph, GraphRec::default());
    g.captures.insert(s, CaptureRec { graph, mode, thread: driver::thread_number() });
    CUDA_SUCCESS
}

/// `cuStreamBeginCapture(CUstream)` of CUDA 10.0: global mode.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(s: CUstream) -> CUresult {
    guard(|| begin_capture(s, 0))
}
/// `cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode)`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) -> CUresult {
    variant(70);
    guard(|| begin_capture(s, mode))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(s: CUstream) -> CUresult {
    variant(71);
    guard(|| begin_capture(s, 0))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_uint) -> CUresult {
    variant(72);
    guard(|| begin_capture(s, mode))
}

fn end_capture(s: CUstream, pgraph: *mut CUgraph) -> CUresult {
    let d = tri!(driver());
    if pgraph.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    match g.captures.get(&s) {
        None => return CUDA_ERROR_ILLEGAL_STATE,
        Some(c) if c.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c.thread != driver::thread_number() => {
            return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        }
        Some(_) => {}
    }
    let c = g.captures.remove(&s).expect("looked up above");
    put(pgraph, c.graph);
    CUDA_SUCCESS
}

/// `cuStreamEndCapture(CUstream, CUgraph*)`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, pgraph: *mut CUgraph) -> CUresult {
    guard(|| end_capture(s, pgraph))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(s: CUstream, pgraph: *mut CUgraph) -> CUresult {
    variant(73);
    guard(|| end_capture(s, pgraph))
}

/// The capture status of `s`, and its capture (graph, sequence id) when active.
fn capture_status(s: CUstream) -> Result<Option<(usize, u64)>, CUresult> {
    let d = driver()?;
    let mut g = d.lock();
    stream_ctx(&mut g, d, s)?;
    Ok(g.captures.get(&s).map(|c| (c.graph, c.graph as u64)))
}

fn is_capturing(s: CUstream, status: *mut c_int) -> CUresult {
    if status.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(rc) = driver::injected_failure("cuStreamIsCapturing") {
        return rc;
    }
    let c = tri!(capture_status(s));
    put(status, if c.is_some() { CU_STREAM_CAPTURE_STATUS_ACTIVE } else { CU_STREAM_CAPTURE_STATUS_NONE });
    CUDA_SUCCESS
}

/// `cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*)`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut c_int) -> CUresult {
    guard(|| is_capturing(s, status))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(s: CUstream, status: *mut c_int) -> CUresult {
    variant(74);
    guard(|| is_capturing(s, status))
}

/// `cuStreamGetCaptureInfo_v2(CUstream, CUstreamCaptureStatus*, cuuint64_t *id, CUgraph*,
/// const CUgraphNode **deps, size_t *numDeps)` (`_v3` adds `const CUgraphEdgeData **edges`
/// before `numDeps`). Every output may be NULL; the dependency set is reported empty.
fn capture_info(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    let c = tri!(capture_status(s));
    put(status, if c.is_some() { CU_STREAM_CAPTURE_STATUS_ACTIVE } else { CU_STREAM_CAPTURE_STATUS_NONE });
    if let Some((gr, cid)) = c {
        put(id, cid);
        put(graph, gr);
        put(deps, std::ptr::null());
        put(edges, std::ptr::null());
        put(num_deps, 0);
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    guard(|| capture_info(s, status, id, graph, deps, std::ptr::null_mut(), num_deps))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    variant(75);
    guard(|| capture_info(s, status, id, graph, deps, std::ptr::null_mut(), num_deps))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    variant(76);
    guard(|| capture_info(s, status, id, graph, deps, edges, num_deps))
}
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    variant(77);
    guard(|| capture_info(s, status, id, graph, deps, edges, num_deps))
}
