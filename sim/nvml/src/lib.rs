//! Simulated NVML (`libnvidia-ml.so.1`): devices, memory and utilisation from the shared
//! state of `fgpu-sim-state` (utilisation from its device timeline), enough for the real
//! `nvidia-smi`, pynvml, gpustat and nvitop.
//! Real exported names, signatures and struct layouts (nvml.h); see `docs/simulator.md`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

#[cfg(test)]
mod abi_layout;
mod api;
mod boundary;
