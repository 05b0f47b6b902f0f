//! kubelet's device health service (`DRAResourceHealth`, `NodeWatchResources`), served on
//! the DRA socket beside the DRA service, in the two versions kubelets call:
//!
//! - `v1alpha1.DRAResourceHealth` (k8s.io/kubelet/pkg/apis/dra-health/v1alpha1): kubelet 1.34
//!   and 1.35 with the `ResourceHealthStatus` gate on, which open the stream on every plugin
//!   they register (and again 5 s after it ends), whatever it lists.
//! - `v1.DRAResourceHealth` (…/dra-health/v1): kubelet 1.36 and later, which pick from the
//!   plugin's supported versions, v1 first, then v1alpha1: this plugin lists both.
//!
//! A stream sends every GPU of the node (device `gpu-<index>` of the node's pool) with its
//! health ([`crate::health`]) at once, again whenever a GPU's health changes, and every
//! [`HEARTBEAT`] besides: kubelet counts a device it has heard nothing of for 30 s (its
//! default, and the timeout v1's reports carry) as Unknown. Streams end when the plugin
//! stops, so that its graceful stop is not held up by them.

use crate::health::{unix_now, GpuHealth, Health, HealthMonitor};
use crate::plugin::Plugin;
use crate::proto::{health_v1, health_v1alpha1};
use crate::slices::device_name;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The two services' names, as plugins list them in their supported versions.
pub const V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
pub const V1: &str = "v1.DRAResourceHealth";
/// How often a stream repeats the devices' health when nothing changed.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long kubelet may trust a report (v1's `health_check_timeout_seconds`).
pub const REPORT_TIMEOUT_SECONDS: i64 = 30;

pub struct HealthService {
    monitor: Arc<HealthMonitor>,
    plugin: Arc<Plugin>,
    stop: watch::Receiver<bool>,
}

impl HealthService {
    /// `stop` turns true when the plugin stops: every stream then ends.
    pub fn new(monitor: Arc<HealthMonitor>, plugin: Arc<Plugin>, stop: watch::Receiver<bool>) -> Arc<HealthService> {
        Arc::new(HealthService { monitor, plugin, stop })
    }

    /// The health of every GPU of the node.
    fn report(&self) -> Vec<GpuHealth> {
        let indices: Vec<u32> = self.plugin.inventory().gpus.iter().map(|g| g.index).collect();
        self.monitor.report(&indices)
    }

    /// A stream of `convert(report)`, as described above.
    fn stream<T: Send + 'static>(self: &Arc<Self>, version: &'static str, convert: fn(&[GpuHealth], &str, i64) -> T) -> ReceiverStream<Result<T, Status>> {
        let (tx, rx) = mpsc::channel(4);
        let service = self.clone();
        let mut changed = self.monitor.subscribe();
        let mut stop = self.stop.clone();
        crate::log(&format!("kubelet watches the devices' health ({version})"));
        tokio::spawn(async move {
            let pool = service.plugin.settings.node.clone();
            loop {
                let message = convert(&service.report(), &pool, unix_now() as i64);
                if tx.send(Ok(message)).await.is_err() {
                    break;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { break },
                    _ = tokio::time::sleep(HEARTBEAT) => {}
                    _ = tx.closed() => break,
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
            crate::log(&format!("the device health stream ({version}) ended"));
        });
        ReceiverStream::new(rx)
    }
}

fn v1alpha1_health(h: Health) -> health_v1alpha1::HealthStatus {
    match h {
        Health::Healthy => health_v1alpha1::HealthStatus::Healthy,
        Health::Unhealthy => health_v1alpha1::HealthStatus::Unhealthy,
        Health::Unknown => health_v1alpha1::HealthStatus::Unknown,
    }
}

fn v1_health(h: Health) -> health_v1::HealthStatus {
    match h {
        Health::Healthy => health_v1::HealthStatus::Healthy,
        Health::Unhealthy => health_v1::HealthStatus::Unhealthy,
        Health::Unknown => health_v1::HealthStatus::Unknown,
    }
}

fn v1alpha1_response(report: &[GpuHealth], pool: &str, now: i64) -> health_v1alpha1::NodeWatchResourcesResponse {
    let devices = report
        .iter()
        .map(|g| health_v1alpha1::DeviceHealth {
            device: Some(health_v1alpha1::DeviceIdentifier { pool_name: pool.into(), device_name: device_name(g.index) }),
            health: v1alpha1_health(g.health) as i32,
            last_updated_time: now,
        })
        .collect();
    health_v1alpha1::NodeWatchResourcesResponse { devices }
}

/// kubelet keeps at most 1024 characters of a message.
fn message(text: &str) -> String {
    if text.chars().count() <= 1024 {
        return text.to_string();
    }
    text.chars().take(1021).collect::<String>() + "..."
}

fn v1_response(report: &[GpuHealth], pool: &str, now: i64) -> health_v1::NodeWatchResourcesResponse {
    let devices = report
        .iter()
        .map(|g| health_v1::DeviceHealth {
            device: Some(health_v1::DeviceIdentifier { pool_name: pool.into(), device_name: device_name(g.index) }),
            health: v1_health(g.health) as i32,
            last_updated_time: now,
            health_check_timeout_seconds: REPORT_TIMEOUT_SECONDS,
            message: message(&g.message),
        })
        .collect();
    health_v1::NodeWatchResourcesResponse { devices }
}

/// The v1alpha1 service.
pub struct V1Alpha1(pub Arc<HealthService>);
/// The v1 service.
pub struct V1Service(pub Arc<HealthService>);

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for V1Alpha1 {
    type NodeWatchResourcesStream = ReceiverStream<Result<health_v1alpha1::NodeWatchResourcesResponse, Status>>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.0.stream(V1ALPHA1, v1alpha1_response)))
    }
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for V1Service {
    type NodeWatchResourcesStream = ReceiverStream<Result<health_v1::NodeWatchResourcesResponse, Status>>;

    async fn node_watch_resources(&self, _request: Request<health_v1::NodeWatchResourcesRequest>) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.0.stream(V1, v1_response)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_name_the_pool_and_devices() {
        let report = [
            GpuHealth { index: 0, health: Health::Healthy, message: String::new() },
            GpuHealth { index: 3, health: Health::Unhealthy, message: "x".repeat(2000) },
        ];
        let r = v1_response(&report, "node-a", 7);
        assert_eq!(r.devices[1].device.as_ref().map(|d| (d.pool_name.as_str(), d.device_name.as_str())), Some(("node-a", "gpu-3")));
        assert_eq!((r.devices[1].health, r.devices[1].last_updated_time), (2, 7));
        assert_eq!(r.devices[1].message.chars().count(), 1024);
        assert!(r.devices[1].message.ends_with("..."));
        let r = v1alpha1_response(&report, "node-a", 7);
        assert_eq!((r.devices[0].health, r.devices[1].health), (1, 2));
    }
}
