//! `fgpu-kubelet-plugin check`: what the DaemonSet's startup and liveness probes run
//! (kubelet cannot probe a Unix socket). It calls the plugin as kubelet does, over both
//! sockets and through the relay: GetInfo on the registration socket, then an empty
//! NodePrepareResources on the DRA socket it names. The calls are plain HTTP/2 requests
//! with no `:authority`, made with h2's client directly.

use crate::proto::dra::{NodePrepareResourcesRequest, NodePrepareResourcesResponse};
use crate::proto::registration::{InfoRequest, PluginInfo};
use crate::server::PLUGIN_TYPE;
use crate::slices::DRIVER;
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the whole check may take (the probes' timeout is longer).
const TIMEOUT: Duration = Duration::from_secs(8);

/// One unary gRPC call on the socket at `socket`; the answer's message.
async fn call<Req: prost::Message, Resp: prost::Message + Default>(socket: &Path, method: &str, request: &Req) -> Result<Resp, String> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    let (client, connection) = h2::client::handshake(stream).await.map_err(|e| format!("{}: HTTP/2: {e}", socket.display()))?;
    let driver = tokio::spawn(connection);
    let mut client = client.ready().await.map_err(|e| format!("{}: HTTP/2: {e}", socket.display()))?;
    let head = http::Request::builder()
        .method(http::Method::POST)
        .uri(method)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (answer, mut body) = client.send_request(head, false).map_err(|e| format!("{method}: {e}"))?;
    let message = request.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    body.send_data(Bytes::from(framed), true).map_err(|e| format!("{method}: {e}"))?;
    let answer = answer.await.map_err(|e| format!("{method}: {e}"))?;
    let (head, mut data) = answer.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("{method}: HTTP {}", head.status));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = data.data().await {
        let chunk = chunk.map_err(|e| format!("{method}: {e}"))?;
        let _ = data.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let trailers = data.trailers().await.map_err(|e| format!("{method}: {e}"))?.unwrap_or_default();
    let grpc_status = trailers.get("grpc-status").or_else(|| head.headers.get("grpc-status")).and_then(|v| v.to_str().ok()).unwrap_or("");
    if grpc_status != "0" {
        let why = trailers.get("grpc-message").or_else(|| head.headers.get("grpc-message")).and_then(|v| v.to_str().ok()).unwrap_or("");
        return Err(format!("{method}: gRPC status {grpc_status:?} {why}"));
    }
    driver.abort();
    if bytes.len() < 5 || bytes[0] != 0 {
        return Err(format!("{method}: not one uncompressed gRPC message"));
    }
    Resp::decode(&bytes[5..]).map_err(|e| format!("{method}: {e}"))
}

/// Checks the plugin at `registration` (its registration socket); what it found.
pub async fn run(registration: &Path) -> Result<String, String> {
    tokio::time::timeout(TIMEOUT, async {
        let info: PluginInfo = call(registration, "/pluginregistration.Registration/GetInfo", &InfoRequest {}).await?;
        if info.r#type != PLUGIN_TYPE || info.name != DRIVER {
            return Err(format!("GetInfo answered type {:?} name {:?}", info.r#type, info.name));
        }
        let endpoint = PathBuf::from(&info.endpoint);
        let answer: NodePrepareResourcesResponse =
            call(&endpoint, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", &NodePrepareResourcesRequest { claims: Vec::new() }).await?;
        if !answer.claims.is_empty() {
            return Err("an empty NodePrepareResources answered claims".into());
        }
        Ok(format!("{} and {} answer", registration.display(), endpoint.display()))
    })
    .await
    .map_err(|_| format!("no answer in {} s", TIMEOUT.as_secs()))?
}
