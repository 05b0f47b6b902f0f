//! CUDA graph memory: the physical memory behind graph memory nodes
//! (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured into a graph).
//!
//! The driver takes it when a graph is uploaded or launched, from a per-device graph pool
//! that keeps it until `cuDeviceGraphMemTrim`. fgpu counts that pool:
//!
//! * at instantiation it reads the graph's allocation nodes (`cuGraphGetNodes`,
//!   `cuGraphMemAllocNodeGetParams`) and remembers what the graph needs per device;
//! * before a launch or upload it reserves what the pool may have to grow by (the graph's
//!   needs minus the pool's unused reserve, in 2 MiB granules), so a graph that would pass
//!   the cap is refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is asked;
//! * after it, and after trims, graph-exec destruction and synchronisation, it settles the
//!   device's count to the pool's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
//!
//! No lock is held across a launch or upload: graphs launch in parallel on many streams.
//! The counting is the accounting's (`accounting/graph.rs`, `accounting/records/graph_book.rs`).
//!
//! A graph launch is also gated by the compute share first (`hooks/launch.rs`), as one
//! launch whose cost is the graph's.
//!
//! A graph fgpu did not see instantiated (or whose nodes it cannot read) is counted after
//! the fact: its launch is not refused, its memory is counted once the call returns, and a
//! warning says so if that passes the cap.

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::c_char;

/// A launch or upload of `exec`.
fn launch(call: &str, exec: CUgraphExec, real: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::On(active) => active.graph_launch(call, exec, real),
        _ => real(),
    }
}

/// An instantiation: the accounting remembers what the new exec needs (and, with `upload`,
/// takes its memory now).
fn instantiate(call: &str, exec_out: *mut CUgraphExec, graph: CUgraph, upload: bool, real: impl FnOnce() -> CUresult) -> CUresult {
    let Mode::On(active) = accounting::mode() else { return real() };
    active.graph_instantiate(call, graph, upload, real, || {
        // SAFETY: called on success only, when the driver wrote the new exec through the
        // caller's pointer (if it gave one).
        (!exec_out.is_null()).then(|| unsafe { *exec_out } as usize)
    })
}

/// One exported hook per variant (`_v2`, `_ptsz`) of a call with the same C prototype.
macro_rules! graph_hooks {
    ($( $name:ident ($($arg:ident: $ty:ty),*) => |$real:ident| $body:expr; )*) => { $(
        #[doc = concat!("# Safety\n`", stringify!($name), "` contract.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let $real = || unsafe { raw::$name($($arg),*) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
            super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
                let $real = answer.wrap($real);
                $body
            })
        }
    )* };
}

graph_hooks! {
    cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize)
        => |real| instantiate("cuGraphInstantiate", exec, graph, false, real);
    cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize)
        => |real| instantiate("cuGraphInstantiate", exec, graph, false, real);
    cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64)
        => |real| instantiate("cuGraphInstantiate", exec, graph, false, real);
    cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CudaGraphInstantiateParams)
        => |real| instantiate("cuGraphInstantiateWithParams", exec, graph, wants_upload(params), real);
    cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CudaGraphInstantiateParams)
        => |real| instantiate("cuGraphInstantiateWithParams", exec, graph, wants_upload(params), real);
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream)
        => |real| super::launch::gated(stream, false, crate::compute::Unit::Graph, || launch("cuGraphLaunch", exec, real));
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream)
        => |real| super::launch::gated(stream, true, crate::compute::Unit::Graph, || launch("cuGraphLaunch", exec, real));
    cuGraphUpload(exec: CUgraphExec, stream: CUstream) => |real| launch("cuGraphUpload", exec, real);
    cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) => |real| launch("cuGraphUpload", exec, real);
}

fn wants_upload(params: *const CudaGraphInstantiateParams) -> bool {
    // SAFETY: when non-NULL, the API contract makes it a CUDA_GRAPH_INSTANTIATE_PARAMS.
    !params.is_null() && unsafe { (*params).flags } & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0
}

/// # Safety
/// `cuDeviceGraphMemTrim` contract.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuDeviceGraphMemTrim(device) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let rc = answer.of(real());
        if let Mode::On(active) = accounting::mode() {
            active.graph_trimmed(device);
        }
        rc
    })
}

/// # Safety
/// `cuGraphExecDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuGraphExecDestroy(exec) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| {
        let rc = answer.of(real());
        if let Mode::On(active) = accounting::mode() {
            active.graph_exec_destroyed(exec, rc);
        }
        rc
    })
}
