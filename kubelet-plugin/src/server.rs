//! kubelet's two sockets: the registration service on `<registrar dir>/gpu.fgpu.io-reg.sock`,
//! which kubelet finds by watching that directory, and the DRA service on
//! `<plugins dir>/gpu.fgpu.io/dra.sock`, which the registration names, with the device
//! health service beside it ([`crate::health_service`]). Every connection goes through the
//! relay of [`crate::authority`], so that what kubelet's grpc-go sends as `:authority` is
//! served.

use crate::authority::{self, Notice};
use crate::health_service::{HealthService, V1Alpha1, V1Service};
use crate::metrics::Metrics;
use crate::plugin::Plugin;
use crate::proto::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::proto::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourceResponse,
    NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::proto::health_v1::dra_resource_health_server::DraResourceHealthServer as HealthV1Server;
use crate::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthV1Alpha1Server;
use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::slices::DRIVER;
use crate::status::Status as PluginStatus;
use futures_util::Stream;
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::DuplexStream;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

/// The plugin type kubelet's DRA handler registers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service this driver serves (k8s.io/kubelet/pkg/apis/dra/v1; kubelet 1.34 and
/// later). kubelets that only speak v1beta1 (1.33 and older) are not served.
pub const DRA_SERVICE: &str = "v1.DRAPlugin";

/// What the registration lists as the plugin's supported versions: the DRA service, and the
/// device health services when they are served (kubelet reads the list as the gRPC services
/// the plugin provides, `<package>.<service>`, and picks the newest it knows of each).
pub fn supported_versions(health: bool) -> Vec<String> {
    let mut versions = vec![DRA_SERVICE.to_string()];
    if health {
        versions.extend([crate::health_service::V1.to_string(), crate::health_service::V1ALPHA1.to_string()]);
    }
    versions
}
/// Both sockets: kubelet runs as root, and nobody else has anything to ask.
pub const SOCKET_MODE: u32 = 0o600;
/// The driver's directory under kubelet's plugins directory (the DRA socket, the checkpoint,
/// the status): root's alone.
pub const PLUGIN_DIR_MODE: u32 = 0o700;

/// The registration socket in kubelet's registrar directory.
pub fn registration_socket(registrar_dir: &Path) -> PathBuf {
    registrar_dir.join(format!("{DRIVER}-reg.sock"))
}

/// The driver's own directory under kubelet's plugins directory.
pub fn plugin_dir(plugins_dir: &Path) -> PathBuf {
    plugins_dir.join(DRIVER)
}

/// The DRA socket.
pub fn dra_socket(plugins_dir: &Path) -> PathBuf {
    plugin_dir(plugins_dir).join("dra.sock")
}

pub struct RegistrationService {
    endpoint: PathBuf,
    versions: Vec<String>,
    status: Arc<PluginStatus>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: self.versions.clone(),
        }))
    }

    async fn notify_registration_status(&self, request: Request<RegistrationStatus>) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            crate::log("kubelet registered the plugin");
        } else {
            crate::log(&format!("kubelet did not register the plugin: {}", status.error));
        }
        self.status.update(|s| {
            s.registered = Some(status.plugin_registered);
            s.registration_error = (!status.error.is_empty()).then(|| status.error.clone());
        });
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

pub struct DraService {
    plugin: Arc<Plugin>,
    metrics: Arc<Metrics>,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(&self, request: Request<NodePrepareResourcesRequest>) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        // The claims of one request (one pod's) are prepared side by side, as kubelet
        // prepares different pods' side by side.
        let answers = futures_util::future::join_all(request.into_inner().claims.into_iter().map(|claim| async move {
            let started = Instant::now();
            let prepared = self.plugin.prepare(&claim.namespace, &claim.name, &claim.uid).await;
            self.metrics.prepared(started.elapsed(), prepared.is_ok());
            let answer = match prepared {
                Ok(devices) => NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| Device {
                            request_names: d.requests,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => {
                    crate::log(&format!("not prepared: ResourceClaim {}/{} ({}): {error}", claim.namespace, claim.name, claim.uid));
                    NodePrepareResourceResponse { devices: Vec::new(), error: error.to_string() }
                }
            };
            (claim.uid, answer)
        }))
        .await;
        Ok(Response::new(NodePrepareResourcesResponse { claims: answers.into_iter().collect() }))
    }

    async fn node_unprepare_resources(&self, request: Request<NodeUnprepareResourcesRequest>) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let started = Instant::now();
            let unprepared = self.plugin.unprepare(&claim.namespace, &claim.name, &claim.uid).await;
            self.metrics.unprepared(started.elapsed(), unprepared.is_ok());
            let error = match unprepared {
                Ok(()) => String::new(),
                Err(error) => {
                    crate::log(&format!("not unprepared: ResourceClaim {}/{} ({}): {error}", claim.namespace, claim.name, claim.uid));
                    error.to_string()
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// Why the plugin's directory or a socket could not be set up; each names its path.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{} has no directory", .0.display())]
    NoDirectory(PathBuf),
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("cannot chmod {}: {source}", path.display())]
    Chmod { path: PathBuf, source: std::io::Error },
    #[error("cannot remove the old socket {}: {source}", path.display())]
    RemoveOld { path: PathBuf, source: std::io::Error },
    #[error("{} exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    #[error("cannot listen on {}: {source}", path.display())]
    Bind { path: PathBuf, source: std::io::Error },
    #[error("cannot move {} to {}: {source}", from.display(), to.display())]
    Place { from: PathBuf, to: PathBuf, source: std::io::Error },
}

/// A gRPC server that stopped with an error.
#[derive(Debug, thiserror::Error)]
#[error("the {service} service stopped: {source}")]
pub struct ServeError {
    /// "DRA" or "registration".
    pub service: &'static str,
    source: tonic::transport::Error,
}

/// Creates `dir` with `mode`, or sets an existing one's mode to it.
pub fn private_dir(dir: &Path, mode: u32) -> Result<(), SocketError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(|source| SocketError::Create { path: dir.to_path_buf(), source })?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|source| SocketError::Chmod { path: dir.to_path_buf(), source })
}

/// A listening socket at `path`, mode [`SOCKET_MODE`] from the moment it appears there: it
/// is bound under a hidden name (kubelet's plugin watcher passes over names that start with
/// a dot), given its mode, then renamed into place. A socket left there by an earlier run is
/// replaced; anything else at the path is an error.
pub fn listen(path: &Path) -> Result<UnixListener, SocketError> {
    let dir = path.parent().ok_or_else(|| SocketError::NoDirectory(path.to_path_buf()))?;
    std::fs::create_dir_all(dir).map_err(|source| SocketError::Create { path: dir.to_path_buf(), source })?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(|source| SocketError::RemoveOld { path: path.to_path_buf(), source })?,
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hidden = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&hidden);
    let listener = UnixListener::bind(&hidden).map_err(|source| SocketError::Bind { path: hidden.clone(), source })?;
    let placed = std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| SocketError::Chmod { path: hidden.clone(), source })
        .and_then(|()| std::fs::rename(&hidden, path).map_err(|source| SocketError::Place { from: hidden.clone(), to: path.to_path_buf(), source }));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&hidden);
        return Err(e);
    }
    Ok(listener)
}

/// The connections of `listener`, each through the authority relay.
fn incoming(listener: UnixListener, notice: Arc<Notice>) -> impl Stream<Item = Result<DuplexStream, std::io::Error>> {
    futures_util::stream::unfold((listener, notice), |(listener, notice)| async move {
        let next = listener.accept().await.map(|(stream, _)| authority::connect(stream, notice.clone()));
        Some((next, (listener, notice)))
    })
}

/// Serves the DRA service (and the device health service, with `health`) on `listener`
/// until `shutdown` resolves, then lets the calls in flight finish.
pub async fn serve_dra(
    plugin: Arc<Plugin>,
    metrics: Arc<Metrics>,
    health: Option<Arc<HealthService>>,
    listener: UnixListener,
    notice: Arc<Notice>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(DraService { plugin, metrics }))
        .add_optional_service(health.clone().map(|h| HealthV1Alpha1Server::new(V1Alpha1(h))))
        .add_optional_service(health.map(|h| HealthV1Server::new(V1Service(h))))
        .serve_with_incoming_shutdown(incoming(listener, notice), shutdown)
        .await
        .map_err(|source| ServeError { service: "DRA", source })
}

/// Serves the registration service, naming `endpoint` (the DRA socket) and `versions`
/// ([`supported_versions`]), until `shutdown`.
pub async fn serve_registration(
    endpoint: PathBuf,
    versions: Vec<String>,
    status: Arc<PluginStatus>,
    listener: UnixListener,
    notice: Arc<Notice>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(RegistrationService { endpoint, versions, status }))
        .serve_with_incoming_shutdown(incoming(listener, notice), shutdown)
        .await
        .map_err(|source| ServeError { service: "registration", source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_path_taken_by_a_file_is_refused_and_an_old_socket_replaced() {
        let dir = std::env::temp_dir().join(format!("fgpu-server-listen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        private_dir(&dir, PLUGIN_DIR_MODE).unwrap();
        let file = dir.join("taken.sock");
        std::fs::write(&file, b"").unwrap();
        let refused = listen(&file).unwrap_err();
        assert!(matches!(refused, SocketError::NotASocket(_)));
        assert_eq!(refused.to_string(), format!("{} exists and is not a socket", file.display()));
        let socket = dir.join("dra.sock");
        drop(listen(&socket).unwrap());
        let again = listen(&socket).unwrap();
        assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, SOCKET_MODE);
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
