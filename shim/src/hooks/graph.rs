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
//! No lock is held across a launch or upload: graphs launch in parallel on many streams
//! (`counted_pool.rs` says how overlapping calls are counted).
//!
//! A graph launch is also gated by the compute share first (`hooks/launch.rs`), as one
//! launch whose cost is the graph's.
//!
//! A graph fgpu did not see instantiated (or whose nodes it cannot read) is counted after
//! the fact: its launch is not refused, its memory is counted once the call returns, and a
//! warning says so if that passes the cap.

use crate::driver::raw;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::counted_pool::{CountedPool, InFlight};
use crate::state::{self, Active, Mode};
use fgpu_core::limit::format_bytes;
use fgpu_core::log::{self, Level, RateLimit};
use fgpu_core::log_at;
use fgpu_core::uuid::format_gpu_uuid;
use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::atomic::Ordering;

const GRAPH_GRANULE: u64 = 2 << 20;

/// What fgpu knows of graph memory in this process.
#[derive(Default)]
pub struct GraphBook {
    /// Device -> what is counted for its graph pool.
    counted: HashMap<CUdevice, CountedPool>,
    /// Instantiated graph -> what its allocation nodes need, per device.
    execs: HashMap<usize, Vec<(CUdevice, u64)>>,
}

fn graph_attribute(ordinal: CUdevice, attribute: u32) -> Option<u64> {
    driver().graph_mem_attribute(ordinal, attribute)
}

/// The memory a graph's allocation nodes take, per device, in pool granules. `None` when
/// the driver cannot tell, or when the graph holds child graphs or conditional bodies
/// (whose nodes are not read): the graph is then counted after the fact.
fn graph_needs(graph: CUgraph) -> Option<Vec<(CUdevice, u64)>> {
    let nodes = driver().graph_nodes(graph)?;
    let mut needs: Vec<(CUdevice, u64)> = Vec::new();
    for node in nodes {
        let kind = driver().graph_node_type(node)?;
        if kind == CU_GRAPH_NODE_TYPE_GRAPH || kind == CU_GRAPH_NODE_TYPE_CONDITIONAL {
            return None;
        }
        if kind != CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        let Ok(params) = driver().mem_alloc_node_params(node)? else { continue };
        if params.pool_props.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            continue;
        }
        let bytes = (params.bytesize as u64).next_multiple_of(GRAPH_GRANULE);
        match needs.iter_mut().find(|(d, _)| *d == params.pool_props.location_id) {
            Some((_, total)) => *total += bytes,
            None => needs.push((params.pool_props.location_id, bytes)),
        }
    }
    Some(needs)
}

/// Brings the count of `ordinal`'s graph pool to what the driver reserves for it, once
/// `done` (the part of a call that just ran, or nothing) has finished.
fn settle(active: &Active, book: &mut GraphBook, ordinal: CUdevice, done: InFlight, call: &str) {
    let Some(dev) = active.known_device(ordinal) else { return };
    let counted = book.counted.entry(ordinal).or_insert_with(|| CountedPool::new(ordinal));
    let (before, after) = counted.finish(done, graph_attribute(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
    active.settle(dev, before, after);
    if after > 0 {
        active.any_graph_memory.store(true, Ordering::Release);
    }
    let held = active.container_used(dev);
    if after > before && held > dev.limit {
        static LIMIT: RateLimit = RateLimit::new(1_000_000_000);
        if LIMIT.check(log::monotonic_ns()).is_some() {
            log_at!(
                Level::Warn,
                "{call} took {} of graph memory on {} that fgpu could not reserve beforehand: the container now holds {} of its {} cap; allocations are refused until graph memory is trimmed (cuDeviceGraphMemTrim)",
                format_bytes(after - before),
                format_gpu_uuid(&dev.uuid),
                format_bytes(held),
                format_bytes(dev.limit)
            );
        }
    }
}

/// Re-reads the graph pool of every device this process has counted graph memory on.
pub fn refresh_graph_memory(active: &Active) {
    if !active.any_graph_memory.load(Ordering::Acquire) {
        return;
    }
    let mut book = active.graphs.lock();
    let ordinals: Vec<CUdevice> = book.counted.keys().copied().collect();
    for ordinal in ordinals {
        settle(active, &mut book, ordinal, InFlight::default(), "synchronisation");
    }
}

/// Runs a call that makes the driver take graph memory for `needs` (an upload or launch):
/// reserves the growth of each device's graph pool first, refuses if it does not fit, and
/// settles every pool to what the driver reserved afterwards. With `needs` unknown the
/// current device is settled after the call.
fn taking_graph_memory(active: &Active, call: &str, needs: Option<&[(CUdevice, u64)]>, real: impl FnOnce() -> CUresult) -> CUresult {
    super::untracked::settling(active, || reserve_and_launch(active, call, needs, real))
}

fn reserve_and_launch(active: &Active, call: &str, needs: Option<&[(CUdevice, u64)]>, real: impl FnOnce() -> CUresult) -> CUresult {
    let Some(needs) = needs else {
        let rc = real();
        if let Ok(dev) = active.current_device() {
            settle(active, &mut active.graphs.lock(), dev.ordinal, InFlight::default(), call);
        }
        return rc;
    };
    let mut taken: Vec<(CUdevice, InFlight)> = Vec::with_capacity(needs.len());
    {
        let mut book = active.graphs.lock();
        for &(ordinal, bytes) in needs {
            let Ok(dev) = active.device(ordinal) else { continue };
            let reserved = graph_attribute(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
            let used = graph_attribute(ordinal, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT).unwrap_or(0);
            let counted = book.counted.entry(ordinal).or_insert_with(|| CountedPool::new(ordinal));
            // A graph pool keeps its memory until trimmed.
            let growth = counted.growth_for(bytes, reserved, used, u64::MAX, GRAPH_GRANULE);
            if growth > 0 {
                if let Err(rc) = active.reserve(dev, growth, call) {
                    for (ordinal, in_flight) in taken {
                        settle(active, &mut book, ordinal, in_flight, call);
                    }
                    return rc;
                }
            }
            let in_flight = book.counted.get_mut(&ordinal).expect("inserted above").begin(growth, bytes);
            taken.push((ordinal, in_flight));
        }
    }
    fgpu_core::crash_point!("graph.reserved");
    let rc = real();
    fgpu_core::crash_point!("graph.launched");
    let mut book = active.graphs.lock();
    for (ordinal, in_flight) in taken {
        settle(active, &mut book, ordinal, in_flight, call);
    }
    rc
}

/// A launch or upload of `exec`.
fn launch(call: &str, exec: CUgraphExec, real: impl FnOnce() -> CUresult) -> CUresult {
    let Mode::On(active) = state::mode() else { return real() };
    let needs = active.graphs.lock().execs.get(&(exec as usize)).cloned();
    if matches!(&needs, Some(needs) if needs.is_empty()) {
        return real(); // no memory nodes
    }
    taking_graph_memory(active, call, needs.as_deref(), real)
}

/// An instantiation: remembers what the new exec needs; with `upload` (the
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` of `cuGraphInstantiateWithParams`) it also takes
/// the memory now, as a launch does.
fn instantiate(call: &str, exec_out: *mut CUgraphExec, graph: CUgraph, upload: bool, real: impl FnOnce() -> CUresult) -> CUresult {
    let Mode::On(active) = state::mode() else { return real() };
    let needs = graph_needs(graph);
    let rc = if upload && needs.as_ref().is_some_and(|n| !n.is_empty()) {
        taking_graph_memory(active, call, needs.as_deref(), real)
    } else {
        real()
    };
    if rc == CUDA_SUCCESS && !exec_out.is_null() {
        // SAFETY: on success the driver wrote the new exec through the caller's pointer.
        let exec = unsafe { *exec_out } as usize;
        let mut book = active.graphs.lock();
        match needs {
            Some(needs) => book.execs.insert(exec, needs),
            None => book.execs.remove(&exec),
        };
    }
    rc
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
        if let Mode::On(active) = state::mode() {
            settle(active, &mut active.graphs.lock(), device, InFlight::default(), "cuDeviceGraphMemTrim");
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
        if let Mode::On(active) = state::mode() {
            if rc == CUDA_SUCCESS {
                active.graphs.lock().execs.remove(&(exec as usize));
            }
            refresh_graph_memory(active);
        }
        rc
    })
}
