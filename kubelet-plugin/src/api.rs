//! What the driver asks of the API server, as plain REST calls through kube's client (which
//! brings the kubeconfig, the in-cluster service account, TLS and token refresh): GET the
//! Node and a ResourceClaim, and keep the node's ResourceSlice as it should be with GET,
//! POST, PUT and DELETE. Nothing here watches: a watch may be cut, or answered with an
//! empty stream, and the driver never waits on one. Answers are read leniently (every field
//! optional), so an object with fields this driver does not know, or without ones it does
//! not need, is read all the same.

use crate::slices::{self, DRIVER};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::client::Body;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// How long one call may take.
const TIMEOUT: Duration = Duration::from_secs(20);

pub struct Api {
    client: kube::Client,
    server: String,
    /// The pool generation this driver last wrote or saw, so that a slice written anew
    /// never goes back in generation.
    generation: AtomicI64,
}

/// A ResourceClaim, as much of it as the driver reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Claim {
    pub metadata: ClaimMeta,
    pub status: ClaimStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ClaimMeta {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClaimStatus {
    pub allocation: Option<Allocation>,
    pub reserved_for: Vec<Consumer>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Allocation {
    pub devices: AllocatedDevices,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AllocatedDevices {
    pub results: Vec<AllocationResult>,
}

/// One allocated device: `consumedCapacity` is there when the cluster has
/// DRAConsumableCapacity on, `shareID` when the device is shared.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllocationResult {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    #[serde(rename = "shareID")]
    pub share_id: Option<String>,
    /// Quantities as the server wrote them (strings; numbers are taken too).
    pub consumed_capacity: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Consumer {
    pub resource: String,
    pub name: String,
    pub uid: String,
}

/// A Kubernetes object name or namespace as a path segment: DNS subdomain characters only,
/// so nothing a caller passes can change the path.
fn segment(what: &str, text: &str) -> Result<String, String> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && text.bytes().next().is_some_and(alnum)
        && text.bytes().last().is_some_and(alnum);
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!("{what} {text:?} is not a valid Kubernetes name"))
    }
}

impl Api {
    /// The API server of `kubeconfig`, or else of `KUBECONFIG` / `~/.kube/config`, or else
    /// of the pod's service account.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<Api, String> {
        let mut config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| format!("no API server: no kubeconfig (--kubeconfig, KUBECONFIG) and not in a pod with a service account ({e})"))?,
        };
        config.connect_timeout = Some(TIMEOUT);
        config.read_timeout = Some(TIMEOUT);
        config.write_timeout = Some(TIMEOUT);
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).map_err(|e| format!("cannot set up a client for {server}: {e}"))?;
        Ok(Api { client, server, generation: AtomicI64::new(0) })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// One call: the HTTP status and the body.
    async fn call(&self, method: http::Method, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<(u16, Vec<u8>), String> {
        let mut request = http::Request::builder().method(method.clone()).uri(path).header(http::header::ACCEPT, "application/json");
        let body = match body {
            Some((content_type, bytes)) => {
                request = request.header(http::header::CONTENT_TYPE, content_type);
                Body::from(bytes)
            }
            None => Body::empty(),
        };
        let request = request.body(body).map_err(|e| format!("{method} {path}: {e}"))?;
        let call = async {
            let response = self.client.send(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((status, bytes.to_vec()))
        };
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(format!("{method} {}{path}: {e}", self.server.trim_end_matches('/'))),
            Err(_) => Err(format!("{method} {}{path}: no answer in {} s", self.server.trim_end_matches('/'), TIMEOUT.as_secs())),
        }
    }

    /// The server's refusal in one line: its Status message, or the start of the body.
    fn refusal(method: &str, path: &str, status: u16, body: &[u8]) -> String {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string());
        format!("{method} {path}: HTTP {status}{}{message}", if message.is_empty() { "" } else { ": " })
    }

    /// GET: the object, or `None` when the server says 404.
    async fn get(&self, path: &str) -> Result<Option<Value>, String> {
        let (status, body) = self.call(http::Method::GET, path, None).await?;
        match status {
            200..=299 => serde_json::from_slice(&body).map(Some).map_err(|e| format!("GET {path}: the answer is not JSON: {e}")),
            404 => Ok(None),
            _ => Err(Self::refusal("GET", path, status, &body)),
        }
    }

    /// The UID of the Node, for the slice's owner.
    pub async fn node_uid(&self, node: &str) -> Result<Option<String>, String> {
        let path = format!("/api/v1/nodes/{}", segment("node", node)?);
        let node = self.get(&path).await?;
        Ok(node.and_then(|n| n.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string)).filter(|u| !u.is_empty()))
    }

    /// The ResourceClaim `namespace/name`, or `None` when it does not exist.
    pub async fn claim(&self, namespace: &str, name: &str) -> Result<Option<Claim>, String> {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}", segment("namespace", namespace)?, segment("claim", name)?);
        match self.get(&path).await? {
            Some(value) => serde_json::from_value(value).map(Some).map_err(|e| format!("GET {path}: not a ResourceClaim: {e}")),
            None => Ok(None),
        }
    }

    /// Makes the node's slice hold `devices`: created when missing, replaced when it differs
    /// (with the pool's generation counted up), left alone otherwise; then removes other
    /// slices of this driver for this node (from a release that named them otherwise). Says
    /// what it did, or `None` when nothing changed.
    pub async fn publish(&self, node: &str, devices: Vec<Device>) -> Result<Option<String>, String> {
        let owner = match self.node_uid(node).await {
            Ok(Some(uid)) => Some(uid),
            Ok(None) => {
                crate::log(&format!("node {node} not found: the ResourceSlice is published without an owner"));
                None
            }
            Err(e) => {
                crate::log(&format!("cannot read node {node} ({e}): the ResourceSlice is published without an owner"));
                None
            }
        };
        let name = slices::slice_name(node);
        let path = format!("{SLICES}/{name}");
        let count = devices.len();
        let existing = match self.get(&path).await {
            Ok(existing) => existing,
            Err(e) => {
                // Write it all the same: a server that cannot read it back may take it.
                crate::log(&format!("cannot read ResourceSlice {name} ({e}); writing it anyway"));
                None
            }
        };
        let said = match existing {
            None => {
                let generation = self.generation.load(Ordering::Relaxed).saturating_add(1);
                let desired = slices::slice(node, owner.as_deref(), devices, generation);
                let body = serde_json::to_vec(&desired).expect("a ResourceSlice serialises");
                let (status, answer) = self.call(http::Method::POST, SLICES, Some(("application/json", body))).await?;
                if status == 409 {
                    // It exists after all (made meanwhile, or not readable): replace it
                    // unconditionally, with a generation above any this driver wrote.
                    let mut desired = desired;
                    desired.spec.pool.generation = generation.saturating_add(1);
                    self.replace(&path, &desired).await?;
                    self.generation.store(desired.spec.pool.generation, Ordering::Relaxed);
                    Some(format!("replaced ResourceSlice {name}: {count} device{}", plural(count)))
                } else if (200..=299).contains(&status) {
                    self.generation.store(generation, Ordering::Relaxed);
                    Some(format!("created ResourceSlice {name} with {count} device{}", plural(count)))
                } else {
                    return Err(Self::refusal("POST", SLICES, status, &answer));
                }
            }
            Some(existing) => {
                let mut desired = slices::slice(node, owner.as_deref(), devices, 1);
                if desired.metadata.owner_references.is_none() {
                    // The node could not be read: keep the owner the slice has.
                    desired.metadata.owner_references = existing.pointer("/metadata/ownerReferences").and_then(|o| serde_json::from_value(o.clone()).ok());
                }
                let generation = existing.pointer("/spec/pool/generation").and_then(Value::as_i64).unwrap_or(0);
                self.generation.fetch_max(generation, Ordering::Relaxed);
                if !slices::needs_update(&existing, &desired) {
                    None
                } else {
                    desired.spec.pool.generation = generation.max(self.generation.load(Ordering::Relaxed)).saturating_add(1);
                    desired.metadata.resource_version = existing.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
                    self.replace(&path, &desired).await?;
                    self.generation.store(desired.spec.pool.generation, Ordering::Relaxed);
                    Some(format!("updated ResourceSlice {name}: {count} device{}, pool generation {}", plural(count), desired.spec.pool.generation))
                }
            }
        };
        self.remove_strays(node, &name).await;
        Ok(said)
    }

    async fn replace(&self, path: &str, slice: &ResourceSlice) -> Result<(), String> {
        let body = serde_json::to_vec(slice).expect("a ResourceSlice serialises");
        let (status, answer) = self.call(http::Method::PUT, path, Some(("application/json", body))).await?;
        if (200..=299).contains(&status) {
            Ok(())
        } else {
            Err(Self::refusal("PUT", path, status, &answer))
        }
    }

    /// Deletes this driver's slices for `node` other than `keep`. Best effort: a server
    /// that cannot list or select is not an error (the slice that matters is `keep`).
    async fn remove_strays(&self, node: &str, keep: &str) {
        let path = format!("{SLICES}?fieldSelector=spec.nodeName%3D{node}");
        let list = match self.get(&path).await {
            Ok(Some(list)) => list,
            Ok(None) => return,
            Err(e) => {
                crate::log(&format!("cannot list ResourceSlices to remove stale ones: {e}"));
                return;
            }
        };
        let items = list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
        // The server may ignore the selector: check each item.
        for item in items {
            let mine =
                item.pointer("/spec/driver").and_then(Value::as_str) == Some(DRIVER) && item.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
            let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            if !mine || name == keep {
                continue;
            }
            let Ok(name) = segment("ResourceSlice", name) else { continue };
            let path = format!("{SLICES}/{name}");
            match self.call(http::Method::DELETE, &path, None).await {
                Ok((200..=299 | 404, _)) => crate::log(&format!("deleted stale ResourceSlice {name}")),
                Ok((status, body)) => crate::log(&format!("cannot delete stale ResourceSlice: {}", Self::refusal("DELETE", &path, status, &body))),
                Err(e) => crate::log(&format!("cannot delete stale ResourceSlice: {e}")),
            }
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_from_resource_k8s_io_v1_json() {
        let json = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "train-gpu-x7", "namespace": "ml", "uid": "8e2b7f0a-54c1-4c1b-9d68-2f1d0f7c3a11", "resourceVersion": "42"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.fgpu.io",
                "capacity": {"requests": {"memory": "8Gi", "compute": "30"}}}}]}},
            "status": {
                "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.fgpu.io", "pool": "node-a",
                    "device": "gpu-0", "shareID": "2f1d0f7c-3a11-4c1b-9d68-8e2b7f0a54c1",
                    "consumedCapacity": {"memory": "8Gi", "compute": "30"}}]},
                    "nodeSelector": {"nodeSelectorTerms": []}},
                "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "p1"}]
            }
        });
        let claim: Claim = serde_json::from_value(json).unwrap();
        assert_eq!(claim.metadata.uid, "8e2b7f0a-54c1-4c1b-9d68-2f1d0f7c3a11");
        let r = &claim.status.allocation.unwrap().devices.results[0];
        assert_eq!((r.driver.as_str(), r.pool.as_str(), r.device.as_str(), r.request.as_str()), ("gpu.fgpu.io", "node-a", "gpu-0", "gpu"));
        assert_eq!(r.share_id.as_deref(), Some("2f1d0f7c-3a11-4c1b-9d68-8e2b7f0a54c1"));
        assert_eq!(r.consumed_capacity.as_ref().unwrap()["memory"], "8Gi");
        assert_eq!(claim.status.reserved_for[0].resource, "pods");
        // A bare claim (no status) reads as one not allocated.
        let claim: Claim = serde_json::from_value(serde_json::json!({"metadata": {"uid": "u"}})).unwrap();
        assert!(claim.status.allocation.is_none());
    }

    #[test]
    fn path_segments_are_names_only() {
        assert!(segment("claim", "train-gpu.x7").is_ok());
        for bad in ["", "a/b", "..%2f", "..", ".a", "a-", "A", "a?b", "a b"] {
            assert!(segment("claim", bad).is_err(), "{bad}");
        }
    }
}
