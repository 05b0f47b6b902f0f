//! The compute limiter: holds the kernels of a process, together with the other processes
//! of its ledger, to the ledger's share of each GPU's time (`FGPU_COMPUTE`). The policy
//! (bucket, chunk sizes, NVML samples) is `fgpu_core::compute`; the shared state is the
//! ledger's (`fgpu_core::ledger::compute`); the hooks that call in are
//! `hooks/launch.rs` (kernel launches), `hooks/graph.rs` (graph launches), `hooks/pool.rs`
//! (synchronisation) and `hooks/context.rs` (contexts going away). See `docs/compute.md`.
//!
//! Launches are admitted in chunks of about 5 ms of estimated GPU time, one open chunk per
//! thread and stream. A launch inside a chunk costs a few loads and stores on the thread's
//! own data; a chunk's first launch waits until the ledger's bucket holds a chunk's worth
//! and the process's admitted work in flight is small, charges the chunk's estimate, and
//! records an event (a marker) on the launch's stream, which also ends the chunk before it.
//!
//! * [`share`]: a device's share as this process is held to it, and its buckets;
//! * [`book`]: per device, the cost estimates and how NVML measures the process;
//! * [`chunks`]: the chunks in flight, their markers, and their settlement;
//! * [`local`]: a thread's side of its chunks (the fast path and the admission);
//! * [`limiter`]: the process's limiter, its devices' shares and its chunks together;
//! * [`sampler`]: a thread per process that sees markers complete, polls NVML's
//!   per-process samples, charges what was measured and refunds the estimates.
//!
//! The arrows run one way: `local` → `sampler` → `limiter` → {`chunks` → `book`, `share`}.
//!
//! A process whose configuration names no compute share pays one relaxed load per launch.

pub mod book;
pub mod chunks;
pub mod limiter;
pub mod local;
pub mod sampler;
pub mod share;
#[cfg(test)]
mod tests;

use crate::abi::cuda::{CUcontext, CUdevice, CUresult, CUstream, CUDA_SUCCESS};
use limiter::{existing, limiter};

pub use book::Unit;

/// Gates one launch: returns `CUDA_SUCCESS` once it may go to the driver, or the error
/// the launch is refused with: [`REFUSED`] where this process's GPU time on the device
/// cannot be measured (`chunks.rs`).
#[inline(always)]
pub fn admit(stream: CUstream, ptsz: bool, unit: Unit) -> CUresult {
    let Some(limiter) = limiter() else { return CUDA_SUCCESS };
    if local::admit_fast(stream, ptsz, unit) {
        return CUDA_SUCCESS;
    }
    local::admit_slow(limiter, stream, ptsz, unit)
}

/// `CUDA_ERROR_NOT_PERMITTED` (cuda.h, 800): a launch on a device whose share cannot be
/// measured.
pub const REFUSED: CUresult = 800;

/// Before a synchronisation of `stream` (`None`: the whole context, or an event's stream,
/// which fgpu cannot tell): the calling thread's chunks on it end here, so that what they
/// measure is the work and not the wait that follows.
pub fn before_sync(stream: Option<(CUstream, bool)>) {
    if let Some(limiter) = existing() {
        local::close_for_sync(limiter, stream);
    }
}

/// Before a context is destroyed (`cuCtxDestroy`): fgpu's markers in it are never touched
/// again (the driver destroys them with it).
pub fn before_context_destroyed(ctx: CUcontext) {
    if let Some(limiter) = existing() {
        limiter.registry.lock().context_gone(|c| c.handle == ctx as usize);
    }
}

/// Before a primary context is released or reset: as [`before_context_destroyed`] for the
/// primary context of `ordinal` (a release that is not the last leaves it alive; fgpu then
/// makes new markers, which is harmless). `created` gives the contexts the process made
/// with `cuCtxCreate*` (the accounting's record), which are not primary.
pub fn before_primary_released(ordinal: CUdevice, created: impl FnOnce() -> Vec<usize>) {
    if let Some(limiter) = existing() {
        let created = created();
        limiter.registry.lock().context_gone(|c| c.ordinal == ordinal && !created.contains(&c.handle));
    }
}
