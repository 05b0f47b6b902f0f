//! The driver as fgpu's tools see it, never through a preloaded shim: `fgpu doctor`'s probe
//! (`probe.rs`, the hidden `fgpu __driver-probe`) and the NVML process lists the observers
//! ask before they drop a dead process (`lists.rs`).

pub mod lists;
pub mod probe;
