//! The driver as the shim calls it: the one place that reaches `libcuda.so.1` and
//! `libnvidia-ml.so.1`.
//!
//! * [`table`]: the C prototype of every driver function the shim calls, declared once and
//!   checked against NVIDIA's headers (tests/integration/abi_layout.rs).
//! * [`symbols`]: finding each one's real address without going through the hooked `dlsym`.
//! * [`raw`]: one forwarder per prototype, for the hooks to pass a caller's arguments on.
//! * [`seam`]: the calls the shim makes on its own behalf (device registration, pools,
//!   graphs, the compute limiter's events, NVML), as two traits; [`cuda`] and [`nvml`]
//!   implement them on the real driver, [`fake`] (unit tests only) on a programmable one.
//! * [`instance`]: which of the two this build calls, with no dynamic dispatch.

pub mod cuda;
#[cfg(test)]
pub mod fake;
pub mod instance;
pub mod nvml;
pub mod raw;
pub mod seam;
pub mod symbols;
