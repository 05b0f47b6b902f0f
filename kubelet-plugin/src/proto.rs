//! The gRPC services kubelet speaks with a DRA driver, generated from `proto/` at build time.

/// kubelet's plugin registration (`pluginregistration.Registration`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The DRA service (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}
