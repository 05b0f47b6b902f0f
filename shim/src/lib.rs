//! libfgpu_shim.so: loaded into every process of a job or container that calls CUDA or
//! NVML, it holds all of them together, per GPU, to one memory cap and one share of the
//! GPU's time, and shows them the GPU as the cap makes it. The processes of a job share a
//! ledger in shared memory (`fgpu-core`): each allocation is counted there before the
//! driver is asked, and refused past the cap; each process's kernels are admitted in
//! chunks against the ledger's time bucket (`FGPU_COMPUTE`); `cuMemGetInfo`, NVML's
//! memory figures and its process lists (so `nvidia-smi`, pynvml and every framework) show
//! the cap and the ledger's processes. The preloaded front, `libfgpu.so` (crate
//! `fgpu-front`), loads it on the first such call and forwards every hooked entry point to
//! it; preloaded itself, it works alone too.
//!
//! The layers, each using only those below it (hooks -> {accounting, compute} -> process ->
//! driver -> abi):
//!
//! * [`hooks`]: the exported functions that replace driver entry points, one module per
//!   family (`dlsym`, `cuGetProcAddress`, allocations, contexts, pools, graphs, VMM, arrays,
//!   memory info, launches, NVML), and the table from exported names to them: the thin
//!   ABI edge.
//! * [`accounting`]: the memory cap: one record per kind of memory this process has counted,
//!   with the flows that count ahead, call and settle, and what NVML shows of the ledger.
//! * [`compute`]: the compute share: launches admitted in chunks against the ledger's bucket,
//!   measured by NVML or by the process's own events.
//! * [`process`]: this process under fgpu: its mode, built once and started over in a forked
//!   child, its configuration, its account in the ledger (slot, devices) and the PIDs NVML
//!   knows it by.
//! * [`driver`]: every driver function the shim calls, found without going through our own
//!   hooks; the seam the layers above call (the real driver, or a fake in unit tests).
//! * [`abi`]: the C types of CUDA and NVML and the driver's prototypes (the `fgpu-abi`
//!   crate, checked against NVIDIA's headers).
//!
//! The policy (limits, shares, configuration) and the ledger live in `fgpu-core`, which
//! knows nothing of the driver.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]
// Driver handles (NVML devices, CUDA contexts, pools) are opaque tokens passed back to the
// driver, never dereferenced by fgpu; functions taking them need not be `unsafe`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod abi;
pub mod accounting;
pub mod compute;
pub mod driver;
pub mod hooks;
pub mod process;
#[cfg(test)]
mod testing;
