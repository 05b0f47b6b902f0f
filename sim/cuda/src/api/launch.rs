//! Kernel launches: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel and their
//! per-thread-stream variants.
//!
//! A launch is asynchronous: it puts a kernel on its context's FIFO of the device timeline
//! (fgpu-sim-state) and returns; when the FIFO already holds QUEUE_DEPTH items it sleeps
//! until the oldest completes, as the real driver's launch blocks when its queue is full.
//! The kernel occupies the device for grid blocks x the kernel's duration per block (see
//! module.rs). Parameters are not read: nothing executes.

use super::module::CUfunction;
use super::stream::{note_stream_seq, stream_ctx, stream_key};
use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, NodeRec};
use crate::errors::*;
use fgpu_sim_state::Work;
use std::ffi::{c_uint, c_void};

/// `CUlaunchConfig` (cuda.h, 11.8+).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CUlaunchAttribute`: an id, padding, and a 64-byte value union.
#[repr(C)]
pub struct CUlaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

const _: () = {
    assert!(std::mem::size_of::<CUlaunchConfig>() == 56);
    assert!(std::mem::offset_of!(CUlaunchConfig, h_stream) == 32);
    assert!(std::mem::offset_of!(CUlaunchConfig, num_attrs) == 48);
    assert!(std::mem::size_of::<CUlaunchAttribute>() == 72);
};

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: c_uint = 2;
/// Most dynamic shared memory a block can opt into on the simulated (Hopper) board.
const MAX_SHARED_PER_BLOCK: c_uint = 227 << 10;
/// Blocks a multiprocessor can hold at once, and the threads it can hold.
const MAX_BLOCKS_PER_SM: u64 = 32;
const MAX_THREADS_PER_SM: u64 = 2048;

/// Checks a launch's shape like the real driver and returns the number of blocks. A
/// cooperative launch (`Some(multiprocessors)` of the device) must fit on the device's
/// multiprocessors at once.
pub(super) fn launch_blocks(grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint, cooperative: Option<u32>) -> Result<u64, CUresult> {
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if grid[0] > i32::MAX as c_uint || grid[1] > 65535 || grid[2] > 65535 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let threads = block[0] as u64 * block[1] as u64 * block[2] as u64;
    if block[0] > 1024 || block[1] > 1024 || block[2] > 64 || threads > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if shared > MAX_SHARED_PER_BLOCK {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let blocks = grid[0] as u64 * grid[1] as u64 * grid[2] as u64;
    if let Some(multiprocessors) = cooperative {
        // Every block must be resident at once.
        let per_sm = MAX_BLOCKS_PER_SM.min(MAX_THREADS_PER_SM / threads).max(1);
        if blocks > per_sm * multiprocessors as u64 {
            return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
    }
    Ok(blocks)
}

/// One launch, from any entry point. `ptds`: stream 0 is the per-thread default stream.
fn launch(f: CUfunction, grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint, s: CUstream, ptds: bool, cooperative: bool) -> CUresult {
    let d = tri!(driver());
    let blocks = tri!(launch_blocks(grid, block, shared, None));
    let (tl, key, ns) = {
        let mut g = d.lock();
        let (ctx, dev) = tri!(stream_ctx(&mut g, d, s));
        if cooperative {
            tri!(launch_blocks(grid, block, shared, Some(d.multiprocessors(dev))));
        }
        let ns = tri!(g.launch_ns_per_block(d, f, ctx, dev)).saturating_mul(blocks);
        if let Some(c) = g.captures.get(&s) {
            // Captured into the graph instead of run.
            let graph = c.graph;
            let node = g.new_handle();
            if let Some(rec) = g.graphs.get_mut(&graph) {
                rec.kernels.push(ns);
                rec.nodes.push(node);
            }
            g.graph_nodes.insert(node, NodeRec::Kernel);
            return CUDA_SUCCESS;
        }
        let tl = tri!(g.timeline(d, ctx, dev));
        let key = stream_key(ctx, s, ptds);
        // The usual case: room in the queue, one pass under the driver lock.
        if let Some(seq) = tri!(driver::try_submit(d, tl, Work::Kernel(ns))) {
            let v = g.stream_seq.entry(key).or_insert(0);
            *v = (*v).max(seq);
            return CUDA_SUCCESS;
        }
        (tl, key, ns)
    };
    // A full queue: wait for room without holding the driver lock.
    let seq = tri!(driver::submit(d, tl, Work::Kernel(ns)));
    note_stream_seq(d, key, seq);
    CUDA_SUCCESS
}

/// `cuLaunchKernel(CUfunction, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
/// blockDimZ, sharedMemBytes, CUstream, void **kernelParams, void **extra)`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if !params.is_null() && !extra.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        launch(f, [gx, gy, gz], [bx, by, bz], shared, s, false, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    variant(60);
    guard(|| {
        if !params.is_null() && !extra.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        launch(f, [gx, gy, gz], [bx, by, bz], shared, s, true, false)
    })
}

fn launch_ex(config: *const CUlaunchConfig, f: CUfunction, ptds: bool) -> CUresult {
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL, and the API contract makes it a CUlaunchConfig.
    let c = unsafe { &*config };
    if c.num_attrs > 0 && c.attrs.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut cooperative = false;
    for i in 0..c.num_attrs as usize {
        // SAFETY: the caller passes `num_attrs` attributes.
        let a = unsafe { &*c.attrs.add(i) };
        if a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE {
            cooperative = i32::from_ne_bytes([a.value[0], a.value[1], a.value[2], a.value[3]]) != 0;
        }
    }
    launch(f, [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z], [c.block_dim_x, c.block_dim_y, c.block_dim_z], c.shared_mem_bytes, c.h_stream, ptds, cooperative)
}

/// `cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void **kernelParams, void **extra)`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, _params: *mut *mut c_void, _extra: *mut *mut c_void) -> CUresult {
    guard(|| launch_ex(config, f, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, _params: *mut *mut c_void, _extra: *mut *mut c_void) -> CUresult {
    variant(61);
    guard(|| launch_ex(config, f, true))
}

/// `cuLaunchCooperativeKernel(CUfunction, gridDimX, gridDimY, gridDimZ, blockDimX,
/// blockDimY, blockDimZ, sharedMemBytes, CUstream, void **kernelParams)`: every block must
/// fit on the device at once (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` otherwise).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    _params: *mut *mut c_void,
) -> CUresult {
    variant(62);
    guard(|| launch(f, [gx, gy, gz], [bx, by, bz], shared, s, false, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    _params: *mut *mut c_void,
) -> CUresult {
    variant(63);
    guard(|| launch(f, [gx, gy, gz], [bx, by, bz], shared, s, true, true))
}
