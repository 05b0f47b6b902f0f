//! fgpu-kubelet-plugin: the Kubernetes DRA driver `gpu.fgpu.io`. It publishes each GPU of
//! its node as a shareable device with consumable `memory` and `compute` capacity
//! ([`slices`]), so that the stock scheduler packs claims onto GPUs by what they ask for,
//! and turns each allocation into a CDI device of fgpu's that caps the claim's containers
//! at what it was allocated ([`plugin`]), beside NVIDIA's device for the GPU ([`nvidia`]).
//! kubelet talks to it over two Unix sockets ([`server`]); the API server is called with
//! plain REST requests ([`api`]), never watched. docs/kubernetes.md is the user's guide.

pub mod api;
pub mod checkpoint;
pub mod nvidia;
pub mod plugin;
pub mod proto;
pub mod quantity;
pub mod server;
pub mod slices;

/// One line to standard error, where kubelet's container logs take it.
pub fn log(message: &str) {
    eprintln!("fgpu-kubelet-plugin: {message}");
}
