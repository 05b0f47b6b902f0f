//! The driver as fgpu's tools see it, never through a preloaded shim: `fgpu doctor`'s probe
//! (`probe.rs`, the hidden `fgpu __driver-probe`, and the child that runs it), the NVML
//! process lists the observers ask before they drop a dead process (`lists.rs`), and the
//! driver's functions as safe calls (`calls.rs`, the one module of the crate that may use
//! `unsafe`).

#[allow(unsafe_code)]
pub mod calls;
pub mod lists;
pub mod probe;
