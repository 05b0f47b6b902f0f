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

/// Why the check failed: the call that failed, and how.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect { socket: PathBuf, source: std::io::Error },
    /// The HTTP/2 connection could not be set up.
    #[error("{}: HTTP/2: {source}", socket.display())]
    Http2 { socket: PathBuf, source: h2::Error },
    #[error("{0}")]
    Request(#[from] http::Error),
    /// The call broke on the way.
    #[error("{method}: {source}")]
    Call { method: String, source: h2::Error },
    #[error("{method}: HTTP {status}")]
    Status { method: String, status: http::StatusCode },
    #[error("{method}: gRPC status {status:?} {message}")]
    Grpc { method: String, status: String, message: String },
    #[error("{method}: not one uncompressed gRPC message")]
    NotOneMessage { method: String },
    #[error("{method}: {source}")]
    Decode { method: String, source: prost::DecodeError },
    #[error("GetInfo answered type {kind:?} name {name:?}")]
    NotThisPlugin { kind: String, name: String },
    #[error("an empty NodePrepareResources answered claims")]
    ClaimsAnswered,
    #[error("no answer in {} s", .0.as_secs())]
    Timeout(Duration),
}

/// One unary gRPC call on the socket at `socket`; the answer's message.
async fn call<Req: prost::Message, Resp: prost::Message + Default>(socket: &Path, method: &str, request: &Req) -> Result<Resp, CheckError> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|source| CheckError::Connect { socket: socket.to_path_buf(), source })?;
    let http2 = |source| CheckError::Http2 { socket: socket.to_path_buf(), source };
    let (client, connection) = h2::client::handshake(stream).await.map_err(http2)?;
    let driver = tokio::spawn(connection);
    let mut client = client.ready().await.map_err(http2)?;
    let call = |source| CheckError::Call { method: method.to_string(), source };
    let head = http::Request::builder().method(http::Method::POST).uri(method).header("content-type", "application/grpc").header("te", "trailers").body(())?;
    let (answer, mut body) = client.send_request(head, false).map_err(call)?;
    let message = request.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    body.send_data(Bytes::from(framed), true).map_err(call)?;
    let answer = answer.await.map_err(call)?;
    let (head, mut data) = answer.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(CheckError::Status { method: method.to_string(), status: head.status });
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = data.data().await {
        let chunk = chunk.map_err(call)?;
        let _ = data.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let trailers = data.trailers().await.map_err(call)?.unwrap_or_default();
    let grpc_status = trailers.get("grpc-status").or_else(|| head.headers.get("grpc-status")).and_then(|v| v.to_str().ok()).unwrap_or("");
    if grpc_status != "0" {
        let why = trailers.get("grpc-message").or_else(|| head.headers.get("grpc-message")).and_then(|v| v.to_str().ok()).unwrap_or("");
        return Err(CheckError::Grpc { method: method.to_string(), status: grpc_status.to_string(), message: why.to_string() });
    }
    driver.abort();
    if bytes.len() < 5 || bytes[0] != 0 {
        return Err(CheckError::NotOneMessage { method: method.to_string() });
    }
    Resp::decode(&bytes[5..]).map_err(|source| CheckError::Decode { method: method.to_string(), source })
}

/// Checks the plugin at `registration` (its registration socket); what it found.
pub async fn run(registration: &Path) -> Result<String, CheckError> {
    tokio::time::timeout(TIMEOUT, async {
        let info: PluginInfo = call(registration, "/pluginregistration.Registration/GetInfo", &InfoRequest {}).await?;
        if info.r#type != PLUGIN_TYPE || info.name != DRIVER {
            return Err(CheckError::NotThisPlugin { kind: info.r#type, name: info.name });
        }
        let endpoint = PathBuf::from(&info.endpoint);
        let answer: NodePrepareResourcesResponse =
            call(&endpoint, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", &NodePrepareResourcesRequest { claims: Vec::new() }).await?;
        if !answer.claims.is_empty() {
            return Err(CheckError::ClaimsAnswered);
        }
        Ok(format!("{} and {} answer", registration.display(), endpoint.display()))
    })
    .await
    .map_err(|_| CheckError::Timeout(TIMEOUT))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_plugin_at_the_socket_says_which_socket() {
        let socket = std::env::temp_dir().join(format!("fgpu-check-none-{}.sock", std::process::id()));
        let said = run(&socket).await.unwrap_err();
        assert!(matches!(said, CheckError::Connect { .. }));
        assert!(said.to_string().starts_with(&format!("cannot connect to {}: ", socket.display())), "{said}");
    }
}
