//! fgpu-kubelet-plugin: the Kubernetes DRA driver `gpu.fgpu.io`. It publishes each GPU of
//! its node as a shareable device with consumable `memory` and `compute` capacity
//! ([`slices`], kept on the API server by [`publish`] and [`watch`]), so that the stock
//! scheduler packs claims onto GPUs by what they ask for, and turns each allocation
//! ([`plan`], checked against the node's own account, [`capacity`]) into a CDI device of
//! fgpu's that caps the claim's containers at what it was allocated ([`plugin`],
//! [`claimfiles`]), beside NVIDIA's device for the GPU ([`nvidia`]). kubelet talks to it over
//! two Unix sockets ([`server`], through [`authority`]); the API server is called with plain
//! REST requests ([`api`]). Each GPU's health ([`health`], from NVML's events watched by a
//! child process, [`health_watch`]; which XIDs count, [`xid`]) goes to kubelet's device
//! health stream ([`health_service`]); the metrics ([`metrics`]) to Prometheus
//! ([`metrics_http`]). MIG partitions ([`partitions`]) are created at prepare and destroyed
//! at unprepare ([`mig`]). docs/kubernetes.md is the user's guide.

pub mod api;
pub mod authority;
pub mod capacity;
pub mod check;
pub mod checkpoint;
pub mod claimfiles;
pub mod health;
pub mod health_service;
pub mod health_watch;
pub mod inventory;
pub mod metrics;
pub mod metrics_http;
pub mod mig;
pub mod nvidia;
pub mod partitions;
pub mod plan;
pub mod plugin;
pub mod proto;
pub mod publish;
pub mod quantity;
pub mod server;
pub mod slices;
pub mod startup;
pub mod status;
pub mod watch;
pub mod xid;

/// One line to standard error, where kubelet's container logs take it.
pub fn log(message: &str) {
    eprintln!("fgpu-kubelet-plugin: {message}");
}
