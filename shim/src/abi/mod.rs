//! C types of the CUDA driver API and NVML, written from `cuda.h` and `nvml.h`.
//!
//! Results stay plain integers at the ABI (`CUresult`, `nvmlReturn_t`): a newer driver may
//! return codes this file does not know, and a Rust enum would make that undefined
//! behaviour. Struct layouts are pinned with compile-time size and offset checks, and every
//! struct, field and constant here is checked against NVIDIA's own headers by
//! tests/integration/abi_layout.rs (which compiles these files a second time).

pub mod cuda;
pub mod nvml;
