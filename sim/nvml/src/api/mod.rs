//! The exported NVML entry points, one module per family. They share the return codes,
//! the device handles and the C boundary (`boundary.rs`).

pub(crate) mod accounting;
pub(crate) mod clocks;
pub(crate) mod device;
pub(crate) mod events;
pub(crate) mod init;
pub(crate) mod memory;
pub(crate) mod mig;
pub(crate) mod mig_device;
pub(crate) mod modes;
pub(crate) mod pci;
pub(crate) mod processes;
pub(crate) mod samples;
pub(crate) mod sensors;
pub(crate) mod system;
pub(crate) mod unsupported;
