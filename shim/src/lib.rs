//! libfgpu_shim.so: loaded into every process of a job or container that calls CUDA or
//! NVML, it holds all of them together to one GPU memory cap per device. The preloaded
//! front, `libfgpu.so` (crate `fgpu-front`), loads it on the first such call and forwards
//! every hooked entry point to it; preloaded itself, it works alone too.
//!
//! * [`hooks`]: the exported functions that replace driver entry points, one module per
//!   family (`dlsym`, `cuGetProcAddress`, allocations, contexts, pools, graphs, VMM, arrays,
//!   memory info, NVML).
//! * [`driver`]: every driver function the shim calls, declared once; finding them
//!   without going through our own hooks; the seam the accounting and the limiter call.
//! * [`state`]: this process's configuration, ledger slot and devices.
//! * [`host_pid`]: this process's host PID, from the kernel or the host's `fgpu service`.
//! * [`compute`]: the compute share: launches admitted in chunks against the ledger's bucket,
//!   measured by NVML or by the process's own events.
//! * [`config`]: the configuration as the shim takes it (device keys checked against NVML).
//! * [`allocs`]: its live allocations, found again at free time without a lock.
//! * [`counted_pool`]: driver-side pools (stream-ordered, graph) counted as what they reserve.
//! * [`abi`]: the C types of CUDA and NVML.
//!
//! The policy (limits, configuration) and the ledger live in `fgpu-core`, which knows
//! nothing of the driver.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]
// Driver handles (NVML devices, CUDA contexts, pools) are opaque tokens passed back to the
// driver, never dereferenced by fgpu; functions taking them need not be `unsafe`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod abi;
pub mod allocs;
pub mod compute;
pub mod config;
pub mod counted_pool;
pub mod driver;
pub mod hooks;
pub mod host_pid;
pub mod state;
