//! kubelet's two sockets: the registration service on `<registrar dir>/gpu.fgpu.io-reg.sock`,
//! which kubelet finds by watching that directory, and the DRA service on
//! `<plugins dir>/gpu.fgpu.io/dra.sock`, which the registration names.

use crate::plugin::Plugin;
use crate::proto::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::proto::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourceResponse,
    NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::slices::DRIVER;
use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// The plugin type kubelet's DRA handler registers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service version this driver serves (k8s.io/kubelet/pkg/apis/dra/v1).
pub const DRA_SERVICE: &str = "v1.DRAPlugin";

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
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

pub struct DraService {
    plugin: Arc<Plugin>,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(&self, request: Request<NodePrepareResourcesRequest>) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let answer = match self.plugin.prepare(&claim.namespace, &claim.name, &claim.uid).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| Device { request_names: d.requests, pool_name: d.pool, device_name: d.device, cdi_device_ids: d.cdi_ids })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => {
                    crate::log(&format!("not prepared ({}): {error}", claim.uid));
                    NodePrepareResourceResponse { devices: Vec::new(), error }
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(&self, request: Request<NodeUnprepareResourcesRequest>) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let error = match self.plugin.unprepare(&claim.namespace, &claim.name, &claim.uid).await {
                Ok(()) => String::new(),
                Err(error) => {
                    crate::log(&format!("not unprepared ({}): {error}", claim.uid));
                    error
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// A listening socket at `path`: its directory is created, and a socket left there by an
/// earlier run is replaced (anything else at the path is an error).
pub fn listen(path: &Path) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| format!("cannot remove the old socket {}: {e}", path.display()))?,
        Ok(_) => return Err(format!("{} exists and is not a socket", path.display())),
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

/// Serves the DRA service on `listener` until `shutdown` resolves.
pub async fn serve_dra(plugin: Arc<Plugin>, listener: UnixListener, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(DraService { plugin }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| format!("the DRA service stopped: {e}"))
}

/// Serves the registration service, naming `endpoint` (the DRA socket), until `shutdown`.
pub async fn serve_registration(endpoint: PathBuf, listener: UnixListener, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(RegistrationService { endpoint }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| format!("the registration service stopped: {e}"))
}
