//! Generates the gRPC code of kubelet's plugin registration, DRA and device health services from the
//! definitions in proto/, with protox (a protobuf compiler in Rust), so a fresh clone
//! builds without `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/pluginregistration.proto", "proto/dra.proto", "proto/dra_health_v1alpha1.proto", "proto/dra_health_v1.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
