//! Simulated CUDA driver (`libcuda.so.1`) for testing fgpu without a GPU.
//!
//! Real exported names and signatures (`CUresult` is a `u32` at the ABI); device memory
//! and the device timeline (when kernels run) live in the shared state of
//! `fgpu-sim-state`, so every process and the tests see the same GPU. See
//! `docs/simulator.md`.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

#[cfg(test)]
mod abi_layout;
mod api;
mod attributes;
mod boundary;
mod driver;
mod errors;
mod va;
