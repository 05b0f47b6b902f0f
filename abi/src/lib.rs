//! fgpu-abi: the C types of the CUDA driver API and NVML, written from `cuda.h` and
//! `nvml.h`, and the C prototype of every driver function fgpu calls ([`prototypes!`]).
//! The shim is built on it; so are the layout tests, which check every struct, field,
//! constant and prototype here against NVIDIA's own headers with a C compiler
//! (tests/integration/abi_layout.rs). Types only: no code, no dependencies, nothing that
//! could weigh on the preloaded libraries. (The simulated driver keeps its own copy, on
//! purpose: a test double is written from the headers, not from the code it tests.)
//!
//! Results stay plain integers at the ABI (`CUresult`, `nvmlReturn_t`): a newer driver may
//! return codes this crate does not know, and a Rust enum would make that undefined
//! behaviour. Struct layouts are pinned with compile-time size and offset checks.
//!
//! * [`cuda`]: the types and constants of `cuda.h` (CUDA 11.x to 13.x).
//! * [`nvml`]: the types and constants of `nvml.h`.
//! * [`prototypes`]: the driver functions, as lists that macros hand to another macro,
//!   and as function pointer types ([`prototypes::proto`]).

pub mod cuda;
pub mod nvml;
pub mod prototypes;
