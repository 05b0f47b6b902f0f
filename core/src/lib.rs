//! fgpu-core: the policy and the ledger of fgpu, with no driver in sight.
//!
//! * [`limit`]: what `FGPU_LIMIT` and the config file's `limit` mean.
//! * [`compute`]: the compute share (`FGPU_COMPUTE`): its bucket, chunks and NVML samples.
//! * [`config`]: where a process's cap, ledger and log level come from.
//! * [`ledger`]: the shared-memory record of who holds what, per GPU.
//! * [`pidns`]: PID namespaces and host PIDs.
//! * [`nvmlpids`]: which PIDs NVML gives a caller outside the host's namespace, found out.
//! * [`hostpid`]: host PIDs for processes in containers, from the host's `fgpu service`.
//! * [`log`]: one-line diagnostics.
//! * [`resolve`]: opening a path another process named, inside that process's root.
//! * [`view`]: what a process sees of a device: the cap it is held to, total and free.
//! * [`sys`]: every system call the crate makes, as safe functions. Unsafe code is allowed
//!   only there, in the ledger's mapping of its shared memory (`ledger/store.rs`) and in
//!   its byte-range locks (`ledger/lock.rs`).

#![deny(unsafe_code)]

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
pub mod hostpid;
pub mod ledger;
pub mod limit;
pub mod log;
pub mod nvmlpids;
pub mod pidns;
pub mod resolve;
#[allow(unsafe_code)]
pub mod sys;
pub mod uuid;
pub mod view;
