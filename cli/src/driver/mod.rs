//! The driver as fgpu's tools see it, never through a preloaded shim: `fgpu doctor`'s probe
//! (`probe.rs`, the hidden `fgpu __driver-probe`, and the child that runs it), the NVML
//! process lists the observers ask before they drop a dead process (`lists.rs`), and the
//! driver's functions as safe calls (`calls.rs`, and NVML's MIG calls in `mig.rs`: the
//! modules of the crate that may use `unsafe`).

#[allow(unsafe_code)]
pub mod calls;
pub mod lists;
#[allow(unsafe_code)]
pub mod mig;
pub mod probe;
