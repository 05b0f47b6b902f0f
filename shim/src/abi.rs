//! The C types of CUDA and NVML and the driver's prototypes, as the shim names them: the
//! `fgpu-abi` crate (`abi/`), shared with the tools and checked against NVIDIA's headers
//! (tests/integration/abi_layout.rs). The bottom layer of the shim.

pub use fgpu_abi::{cuda, nvml, prototypes, prototypes::proto};
