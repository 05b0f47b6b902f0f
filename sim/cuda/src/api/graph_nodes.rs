//! What a graph's nodes tell: cuGraphGetNodes, cuGraphNodeGetType and
//! cuGraphMemAllocNodeGetParams.

use super::graph::{CUgraph, CUgraphNode, CudaMemAllocNodeParams};
use super::vmm::CU_MEM_LOCATION_TYPE_DEVICE;
use crate::boundary::*;
use crate::driver::{driver, NodeRec};
use crate::errors::*;
use std::ffi::c_int;

const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub(crate) const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub(crate) const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub(crate) const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;

/// With `nodes` NULL, the number of nodes; else up to `*count` of them, and `*count` set to
/// how many were written.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if count.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        let Some(rec) = g.graphs.get(&graph) else { return CUDA_ERROR_INVALID_VALUE };
        if nodes.is_null() {
            put(count, rec.nodes.len());
            return CUDA_SUCCESS;
        }
        // SAFETY: non-NULL, checked above; the caller says how many it holds.
        let room = unsafe { *count };
        let n = room.min(rec.nodes.len());
        for (i, node) in rec.nodes.iter().take(n).enumerate() {
            // SAFETY: i < n <= the caller's room.
            put(unsafe { nodes.add(i) }, *node);
        }
        put(count, n);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let g = d.lock();
        let Some(rec) = g.graph_nodes.get(&node) else { return CUDA_ERROR_INVALID_VALUE };
        put(
            kind,
            match rec {
                NodeRec::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                NodeRec::MemFree => CU_GRAPH_NODE_TYPE_MEM_FREE,
                NodeRec::ChildGraph => CU_GRAPH_NODE_TYPE_GRAPH,
                NodeRec::Kernel => CU_GRAPH_NODE_TYPE_KERNEL,
            },
        );
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut CudaMemAllocNodeParams) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if params.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        let Some(NodeRec::MemAlloc { dev, requested, address, .. }) = g.graph_nodes.get(&node).copied() else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: non-NULL, and the API contract makes it a CUDA_MEM_ALLOC_NODE_PARAMS.
        let p = unsafe { &mut *params };
        p.alloc_type = 1;
        p.handle_types = 0;
        p.location_type = CU_MEM_LOCATION_TYPE_DEVICE as c_int;
        p.location_id = dev as c_int;
        p.access_descs = std::ptr::null();
        p.access_desc_count = 0;
        p.bytesize = requested as usize;
        p.dptr = address;
        CUDA_SUCCESS
    })
}
