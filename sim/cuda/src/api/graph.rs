//! CUDA graphs: kernel nodes, graph memory nodes (cuGraphAddMemAllocNode /
//! cuGraphAddMemFreeNode), child graphs, instantiation, launch and upload, and the
//! per-device pool graph allocations come from (cuDeviceGetGraphMemAttribute,
//! cuDeviceGraphMemTrim).
//!
//! As in the real driver, a graph allocation gets its address when the node is added and
//! its physical memory when the graph is uploaded or launched, from a per-device graph
//! pool that keeps what it reserved until cuDeviceGraphMemTrim. A launch puts the graph's
//! kernels on the stream's context timeline, one item each in the order their nodes were
//! added (dependencies are not read: a context runs one kernel at a time anyway).

use super::launch::launch_blocks;
use super::module::{CUfunction, CUkernel};
use super::stream::{note_stream_seq, stream_ctx, stream_key};
use super::vmm::CU_MEM_LOCATION_TYPE_DEVICE;
use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, Driver, ExecRec, GraphRec, Inner, NodeRec};
use crate::errors::*;
use fgpu_sim_state::pool::round_up;
use fgpu_sim_state::Work;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1` (cuda.h): `CUmemPoolProps` (88 bytes), then the access
/// descriptors, `bytesize` and the `dptr` the driver fills in.
#[repr(C)]
pub struct CudaMemAllocNodeParams {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

const _: () = {
    assert!(std::mem::size_of::<CudaMemAllocNodeParams>() == 120);
    assert!(std::mem::offset_of!(CudaMemAllocNodeParams, access_descs) == 88);
    assert!(std::mem::offset_of!(CudaMemAllocNodeParams, bytesize) == 104);
    assert!(std::mem::offset_of!(CudaMemAllocNodeParams, dptr) == 112);
};

/// Graph pools reserve physical memory in 2 MiB granules, as stream-ordered pools do.
const GRAPH_GRANULE: u64 = 2 << 20;

pub type CUgraph = usize;
pub type CUgraphNode = usize;
pub type CUgraphExec = usize;

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(ph: *mut CUgraph, flags: c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if ph.is_null() || flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let h = g.new_handle();
        g.graphs.insert(h, GraphRec::default());
        put(ph, h);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        if g.graphs.remove(&graph).is_none() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_SUCCESS
    })
}

/// What a new node adds to its graph: memory it allocates (address, bytes) and frees, and
/// kernels (ns each).
struct NodeAdds {
    node: NodeRec,
    allocs: Vec<(u64, u64)>,
    frees: Vec<u64>,
    kernels: Vec<u64>,
}

/// Adds one node to `graph`; `describe` checks the request against the graph as it is and
/// says what the node adds.
fn add_node(ph: *mut CUgraphNode, graph: CUgraph, describe: impl FnOnce(&mut Inner, &GraphRec) -> Result<NodeAdds, CUresult>) -> CUresult {
    let d = tri!(driver());
    if ph.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    let Some(current) = g.graphs.get(&graph).cloned() else { return CUDA_ERROR_INVALID_VALUE };
    let adds = tri!(describe(&mut g, &current));
    let node = g.new_handle();
    let rec = g.graphs.get_mut(&graph).expect("looked up above");
    rec.allocs.extend(adds.allocs);
    rec.frees.extend(adds.frees);
    rec.kernels.extend(adds.kernels);
    rec.nodes.push(node);
    g.graph_nodes.insert(node, adds.node);
    put(ph, node);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    _deps: *const CUgraphNode,
    _num_deps: usize,
    params: *mut CudaMemAllocNodeParams,
) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if params.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-NULL, and the API contract makes it a CUDA_MEM_ALLOC_NODE_PARAMS.
        let p = unsafe { &mut *params };
        if p.bytesize == 0 || p.location_type as u32 != CU_MEM_LOCATION_TYPE_DEVICE {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = tri!(d.check_dev(p.location_id));
        let requested = p.bytesize as u64;
        let bytes = round_up(requested, GRAPH_GRANULE);
        let mut address = 0;
        let rc = add_node(ph, graph, |g, _| {
            address = g.va.alloc(bytes, GRAPH_GRANULE).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            Ok(NodeAdds { node: NodeRec::MemAlloc { dev, requested, address }, allocs: vec![(address, bytes)], frees: vec![], kernels: vec![] })
        });
        if rc == CUDA_SUCCESS {
            p.dptr = address;
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    _deps: *const CUgraphNode,
    _num_deps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        add_node(ph, graph, |_, rec| {
            if !rec.allocs.iter().any(|(a, _)| *a == dptr) || rec.frees.contains(&dptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok(NodeAdds { node: NodeRec::MemFree, allocs: vec![], frees: vec![dptr], kernels: vec![] })
        })
    })
}

fn instantiate(ph: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    let d = tri!(driver());
    if ph.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    let (_, dev) = tri!(g.current(d));
    let Some(rec) = g.graphs.get(&graph).cloned() else { return CUDA_ERROR_INVALID_VALUE };
    let h = g.new_handle();
    g.execs.insert(h, ExecRec { dev, graph: rec, live: 0 });
    put(ph, h);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    ph: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(ph, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    ph: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    variant(40);
    guard(|| instantiate(ph, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(ph: *mut CUgraphExec, graph: CUgraph, _flags: c_ulonglong) -> CUresult {
    variant(41);
    guard(|| instantiate(ph, graph))
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (cuda.h, 12.0+).
#[repr(C)]
pub struct CudaGraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub error_node_out: CUgraphNode,
    pub result_out: c_int,
}

pub(crate) const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;

/// Instantiates, and with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` uploads on the given stream
/// (which takes the graph's memory now).
fn instantiate_with_params(ph: *mut CUgraphExec, graph: CUgraph, params: *mut CudaGraphInstantiateParams) -> CUresult {
    if params.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL, and the API contract makes it a CUDA_GRAPH_INSTANTIATE_PARAMS.
    let p = unsafe { &mut *params };
    let rc = instantiate(ph, graph);
    if rc == CUDA_SUCCESS && p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
        // SAFETY: instantiate wrote the new exec through the non-NULL `ph`.
        let exec = unsafe { *ph };
        let rc = graph_launch(exec, p.upload_stream, true);
        if rc != CUDA_SUCCESS {
            if let Ok(d) = driver() {
                d.lock().execs.remove(&exec);
            }
            p.result_out = 1;
            return rc;
        }
    }
    p.result_out = if rc == CUDA_SUCCESS { 0 } else { 1 };
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(ph: *mut CUgraphExec, graph: CUgraph, params: *mut CudaGraphInstantiateParams) -> CUresult {
    guard(|| instantiate_with_params(ph, graph, params))
}
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(ph: *mut CUgraphExec, graph: CUgraph, params: *mut CudaGraphInstantiateParams) -> CUresult {
    variant(45);
    guard(|| instantiate_with_params(ph, graph, params))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        let Some(rec) = g.execs.remove(&exec) else { return CUDA_ERROR_INVALID_VALUE };
        // Allocations a launch left live go back to the graph pool (which keeps them
        // reserved until a trim).
        let pool = &mut g.graph_pools[rec.dev];
        pool.used = pool.used.saturating_sub(rec.live);
        CUDA_SUCCESS
    })
}

/// Grows the device's graph pool so that `more` bytes beyond what is in use fit.
fn graph_pool_cover(g: &mut Inner, d: &Driver, dev: usize, more: u64) -> Result<(), CUresult> {
    let pool = &mut g.graph_pools[dev];
    let need = pool.used + more;
    if need > pool.reserved {
        if !d.take(dev, need - pool.reserved) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        pool.reserved = need;
        pool.reserved_high = pool.reserved_high.max(need);
    }
    Ok(())
}

fn graph_launch(exec: CUgraphExec, s: CUstream, upload_only: bool) -> CUresult {
    graph_launch_on(exec, s, upload_only, false)
}

/// Launches (or only uploads) `exec` on stream `s`; `ptds`: stream 0 is the per-thread
/// default stream.
fn graph_launch_on(exec: CUgraphExec, s: CUstream, upload_only: bool, ptds: bool) -> CUresult {
    let d = tri!(driver());
    let (tl, key, kernels) = {
        let mut g = d.lock();
        let (ctx, dev) = tri!(stream_ctx(&mut g, d, s));
        tri!(graph_memory(&mut g, d, exec, upload_only));
        let kernels = match g.execs.get(&exec) {
            Some(rec) if !upload_only => rec.graph.kernels.clone(),
            _ => Vec::new(),
        };
        if kernels.is_empty() {
            return CUDA_SUCCESS;
        }
        (tri!(g.timeline(d, ctx, dev)), stream_key(ctx, s, ptds), kernels)
    };
    let mut last = 0;
    for ns in kernels {
        last = tri!(driver::submit(d, tl, Work::Kernel(ns)));
    }
    note_stream_seq(d, key, last);
    CUDA_SUCCESS
}

/// The memory side of a launch or upload of `exec`.
fn graph_memory(g: &mut Inner, d: &Driver, exec: CUgraphExec, upload_only: bool) -> Result<(), CUresult> {
    let Some(rec) = g.execs.get(&exec) else { return Err(CUDA_ERROR_INVALID_VALUE) };
    if rec.live > 0 && !upload_only {
        // Its allocations from the last launch were never freed.
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = rec.dev;
    let total: u64 = rec.graph.allocs.iter().map(|(_, b)| b).sum();
    let freed: u64 = rec.graph.allocs.iter().filter(|(a, _)| rec.graph.frees.contains(a)).map(|(_, b)| b).sum();
    graph_pool_cover(g, d, dev, total)?;
    if upload_only {
        return Ok(());
    }
    let pool = &mut g.graph_pools[dev];
    pool.used_high = pool.used_high.max(pool.used + total);
    pool.used += total - freed;
    g.execs.get_mut(&exec).expect("looked up above").live = total - freed;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, s: CUstream) -> CUresult {
    guard(|| graph_launch(exec, s, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) -> CUresult {
    variant(42);
    guard(|| graph_launch_on(exec, s, false, true))
}
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, s: CUstream) -> CUresult {
    variant(43);
    guard(|| graph_launch(exec, s, true))
}
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) -> CUresult {
    variant(44);
    guard(|| graph_launch(exec, s, true))
}

/// A child-graph node: the parent runs a copy of `child`, its memory nodes included.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    _deps: *const CUgraphNode,
    _num_deps: usize,
    child: CUgraph,
) -> CUresult {
    guard(|| {
        add_node(ph, graph, |g, _| {
            let copy = g.graphs.get(&child).cloned().ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok(NodeAdds { node: NodeRec::ChildGraph, allocs: copy.allocs, frees: copy.frees, kernels: copy.kernels })
        })
    })
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (cuda.h, 12.0); `_v1` is the same without `kern` and `ctx`.
#[repr(C)]
pub struct CudaKernelNodeParams {
    pub func: CUfunction,
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    /// Used when `func` is NULL.
    pub kern: CUkernel,
    /// The context to run in (NULL: the current one).
    pub ctx: CUcontext,
}

const _: () = {
    assert!(std::mem::offset_of!(CudaKernelNodeParams, kernel_params) == 40);
    assert!(std::mem::offset_of!(CudaKernelNodeParams, kern) == 56);
    assert!(std::mem::size_of::<CudaKernelNodeParams>() == 72);
};

/// Adds a kernel node; `v2` says the parameters carry `kern` and `ctx`.
fn add_kernel_node(ph: *mut CUgraphNode, graph: CUgraph, params: *const CudaKernelNodeParams, v2: bool) -> CUresult {
    let d = tri!(driver());
    if params.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL; the caller passes the v1 layout (56 bytes) or the v2 one (72), and
    // only the v1 fields are read unless `v2`.
    let p = unsafe { &*params };
    let (func, ctx) = if v2 { (if p.func != 0 { p.func } else { p.kern }, p.ctx) } else { (p.func, 0) };
    let blocks = tri!(launch_blocks([p.grid_dim_x, p.grid_dim_y, p.grid_dim_z], [p.block_dim_x, p.block_dim_y, p.block_dim_z], p.shared_mem_bytes, None));
    add_node(ph, graph, |g, _| {
        let (ctx, dev) = if ctx != 0 { (ctx, g.ctx_ready(d, ctx, CUDA_ERROR_INVALID_CONTEXT)?) } else { g.current(d)? };
        let ns = g.launch_ns_per_block(d, func, ctx, dev)?.saturating_mul(blocks);
        Ok(NodeAdds { node: NodeRec::Kernel, allocs: vec![], frees: vec![], kernels: vec![ns] })
    })
}

/// `cuGraphAddKernelNode(CUgraphNode*, CUgraph, const CUgraphNode *deps, size_t numDeps,
/// const CUDA_KERNEL_NODE_PARAMS_v1*)`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    _deps: *const CUgraphNode,
    _num_deps: usize,
    params: *const CudaKernelNodeParams,
) -> CUresult {
    guard(|| add_kernel_node(ph, graph, params, false))
}

/// The CUDA 12.0 form, with `CUDA_KERNEL_NODE_PARAMS_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    _deps: *const CUgraphNode,
    _num_deps: usize,
    params: *const CudaKernelNodeParams,
) -> CUresult {
    variant(48);
    guard(|| add_kernel_node(ph, graph, params, true))
}
