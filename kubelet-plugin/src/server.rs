//! kubelet's two sockets: the registration service on `<registrar dir>/gpu.fgpu.io-reg.sock`,
//! which kubelet finds by watching that directory, and the DRA service on
//! `<plugins dir>/gpu.fgpu.io/dra.sock`, which the registration names. Every connection
//! goes through the relay of [`crate::authority`], so that what kubelet's grpc-go sends as
//! `:authority` is served.

use crate::authority::{self, Notice};
use crate::plugin::Plugin;
use crate::proto::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::proto::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourceResponse,
    NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::slices::DRIVER;
use crate::status::Status as PluginStatus;
use futures_util::Stream;
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::DuplexStream;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

/// The plugin type kubelet's DRA handler registers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service this driver serves (k8s.io/kubelet/pkg/apis/dra/v1; kubelet 1.34 and
/// later). kubelets that only speak v1beta1 (1.33 and older) are not served.
pub const DRA_SERVICE: &str = "v1.DRAPlugin";
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
    status: Arc<PluginStatus>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![DRA_SERVICE.into()],
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
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(&self, request: Request<NodePrepareResourcesRequest>) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        // The claims of one request (one pod's) are prepared side by side, as kubelet
        // prepares different pods' side by side.
        let answers = futures_util::future::join_all(request.into_inner().claims.into_iter().map(|claim| async move {
            let answer = match self.plugin.prepare(&claim.namespace, &claim.name, &claim.uid).await {
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
                    NodePrepareResourceResponse { devices: Vec::new(), error }
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
            let error = match self.plugin.unprepare(&claim.namespace, &claim.name, &claim.uid).await {
                Ok(()) => String::new(),
                Err(error) => {
                    crate::log(&format!("not unprepared: ResourceClaim {}/{} ({}): {error}", claim.namespace, claim.name, claim.uid));
                    error
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// Creates `dir` with `mode`, or sets an existing one's mode to it.
pub fn private_dir(dir: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|e| format!("cannot chmod {}: {e}", dir.display()))
}

/// A listening socket at `path`, mode [`SOCKET_MODE`] from the moment it appears there: it
/// is bound under a hidden name (kubelet's plugin watcher passes over names that start with
/// a dot), given its mode, then renamed into place. A socket left there by an earlier run is
/// replaced; anything else at the path is an error.
pub fn listen(path: &Path) -> Result<UnixListener, String> {
    let dir = path.parent().ok_or_else(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| format!("cannot remove the old socket {}: {e}", path.display()))?,
        Ok(_) => return Err(format!("{} exists and is not a socket", path.display())),
        Err(_) => {}
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hidden = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&hidden);
    let listener = UnixListener::bind(&hidden).map_err(|e| format!("cannot listen on {}: {e}", hidden.display()))?;
    let placed = std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| format!("cannot chmod {}: {e}", hidden.display()))
        .and_then(|()| std::fs::rename(&hidden, path).map_err(|e| format!("cannot move {} to {}: {e}", hidden.display(), path.display())));
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

/// Serves the DRA service on `listener` until `shutdown` resolves, then lets the calls in
/// flight finish.
pub async fn serve_dra(
    plugin: Arc<Plugin>,
    listener: UnixListener,
    notice: Arc<Notice>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(DraService { plugin }))
        .serve_with_incoming_shutdown(incoming(listener, notice), shutdown)
        .await
        .map_err(|e| format!("the DRA service stopped: {e}"))
}

/// Serves the registration service, naming `endpoint` (the DRA socket), until `shutdown`.
pub async fn serve_registration(
    endpoint: PathBuf,
    status: Arc<PluginStatus>,
    listener: UnixListener,
    notice: Arc<Notice>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(RegistrationService { endpoint, status }))
        .serve_with_incoming_shutdown(incoming(listener, notice), shutdown)
        .await
        .map_err(|e| format!("the registration service stopped: {e}"))
}
