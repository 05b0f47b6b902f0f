//! libfgpu_shim.so: loaded into every process of a job or container that calls CUDA or
//! NVML, it holds all of them together to one GPU memory cap per device. The preloaded
//! front, `libfgpu.so` (crate `fgpu-front`), loads it on the first such call and forwards
//! every hooked entry point to it; preloaded itself, it works alone too.
//!
//! The modules, each using only those below it:
//!
//! * [`hooks`]: the exported functions that replace driver entry points, one module per
//!   family (`dlsym`, `cuGetProcAddress`, allocations, contexts, pools, graphs, VMM, arrays,
//!   memory info, launches, NVML), and the table from exported names to them: the thin
//!   ABI edge.
//! * [`compute`]: the compute share: launches admitted in chunks against the ledger's bucket,
//!   measured by NVML or by the process's own events.
//! * [`accounting`]: this process's mode, its account in the ledger, its devices, and one
//!   record per kind of memory it has counted, with the flows that reserve, call and settle.
//! * [`config`]: the configuration as the shim takes it (device keys checked against NVML).
//! * [`host_pid`]: this process's host PID, from the kernel or the host's `fgpu service`.
//! * [`fork`]: the one fork handler: a child starts over.
//! * [`driver`]: every driver function the shim calls, declared once and checked against
//!   NVIDIA's headers; finding them without going through our own hooks; the seam the
//!   accounting and the limiter call (the real driver, or a fake in unit tests).
//! * [`abi`]: the C types of CUDA and NVML and the driver's prototypes: the `fgpu-abi`
//!   crate, named `abi` here.
//!
//! The policy (limits, configuration) and the ledger live in `fgpu-core`, which knows
//! nothing of the driver.

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
