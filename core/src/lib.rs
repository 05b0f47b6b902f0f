//! fgpu-core: the policy and the ledger of fgpu, with no driver in sight.
//!
//! * [`limit`]: what `FGPU_LIMIT` and the config file's `limit` mean.
//! * [`compute`]: the compute share (`FGPU_COMPUTE`): its bucket, chunks and NVML samples.
//! * [`config`]: where a process's cap, ledger and log level come from.
//! * [`ledger`]: the shared-memory record of who holds what, per GPU.
//! * [`pidns`]: PID namespaces and host PIDs.
//! * [`log`]: one-line diagnostics.

pub mod compute;
pub mod config;
#[cfg(feature = "crash-points")]
pub mod crash;

/// A named crash point (`crash.rs`); compiled to nothing without the `crash-points` feature.
#[cfg(not(feature = "crash-points"))]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {};
}
pub mod ledger;
pub mod limit;
pub mod log;
pub mod pidns;
pub mod uuid;
