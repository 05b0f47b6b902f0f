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

/// The device health service, v1alpha1 (`v1alpha1.DRAResourceHealth`: kubelet 1.34, 1.35).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// The device health service, v1 (`v1.DRAResourceHealth`: kubelet 1.36 and later).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health_v1 {
    tonic::include_proto!("v1");
}
