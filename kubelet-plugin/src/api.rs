//! What the driver asks of the API server, as plain REST calls through kube's client (which
//! brings the kubeconfig, the in-cluster service account, TLS and token refresh), and
//! nothing else (the ClusterRole in deploy/kubernetes grants exactly these):
//!
//! | call | verb |
//! |---|---|
//! | GET the Node (the slices' owner) | `get nodes` |
//! | GET a ResourceClaim | `get resourceclaims` |
//! | list this node's slices of this driver, and watch them | `list`, `watch resourceslices` |
//! | GET a slice by name (where the server cannot list them) | `get resourceslices` |
//! | POST a slice (and a dry run of one, to learn which fields the server keeps) | `create resourceslices` |
//! | PUT a slice | `update resourceslices` |
//! | DELETE a slice | `delete resourceslices` |
//!
//! Answers are read leniently (every field optional), so an object with fields this driver
//! does not know, or without ones it does not need, is read all the same.

use crate::slices::DRIVER;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::client::Body;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// Why a call to the API server gave no usable answer; each says the call and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{what} {text:?} is not a valid Kubernetes name")]
    BadName { what: &'static str, text: String },
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig { path: std::path::PathBuf, source: kube::config::KubeconfigError },
    #[error("no API server: no kubeconfig (--kubeconfig, KUBECONFIG) and not in a pod with a service account ({0})")]
    NoServer(#[source] kube::config::InferConfigError),
    #[error("cannot set up a client for {server}: {source}")]
    Client { server: String, source: kube::Error },
    /// The call could not be made, or broke, or had no answer in time.
    #[error("{method} {path}: {reason}")]
    Call { method: http::Method, path: String, reason: String },
    /// The server answered with an error status: its Status message, or the start of the body.
    #[error("{method} {path}: HTTP {status}{}{message}", if message.is_empty() { "" } else { ": " })]
    Refused { method: String, path: String, status: u16, message: String },
    #[error("{method} {path}: the answer is not JSON: {source}")]
    NotJson { method: String, path: String, source: serde_json::Error },
    #[error("GET {path}: not a ResourceClaim: {source}")]
    NotAClaim { path: String, source: serde_json::Error },
    #[error("the watch gave nothing for {0} s")]
    WatchIdle(u64),
    #[error("the watch broke: {0}")]
    WatchBroke(String),
    #[error("the watch sent something that is not JSON: {0}")]
    WatchNotJson(#[source] serde_json::Error),
    #[error("the watch ended with an error (code {code}): {message}")]
    WatchEnded { code: Value, message: String },
}

/// How long one call may take.
const TIMEOUT: Duration = Duration::from_secs(20);

/// How long one watch runs before the server ends it (it is started again at once); a
/// watch that gives nothing for twice that is taken as cut.
const WATCH_SECONDS: u64 = 240;

pub struct Api {
    client: kube::Client,
    /// A client without the read timeout, for watches (which wait for events).
    watcher: kube::Client,
    server: String,
}

/// What a write of a slice came to.
#[derive(Debug)]
pub enum Written {
    /// The object as the server stored it (or would have, for a dry run).
    Stored(Value),
    /// The server said 409: it exists already (POST) or changed meanwhile (PUT).
    Conflict,
}

/// One event of a watch.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    /// ADDED, MODIFIED, DELETED, BOOKMARK or ERROR.
    pub kind: String,
    pub object: Value,
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
/// DRAConsumableCapacity on, `shareID` when the device is shared, `adminAccess` when the
/// claim asked for it (in a namespace the cluster's admins allow it in). `request` names
/// `<request>/<subrequest>` when the request is a prioritized list (`firstAvailable`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllocationResult {
    pub request: String,
    pub admin_access: Option<bool>,
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
fn segment(what: &'static str, text: &str) -> Result<String, ApiError> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && text.bytes().next().is_some_and(alnum)
        && text.bytes().last().is_some_and(alnum);
    if ok {
        Ok(text.to_string())
    } else {
        Err(ApiError::BadName { what, text: text.into() })
    }
}

impl Api {
    /// The API server of `kubeconfig`, or else of `KUBECONFIG` / `~/.kube/config`, or else
    /// of the pod's service account.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<Api, ApiError> {
        let mut config = match kubeconfig {
            Some(path) => {
                let bad = |source| ApiError::Kubeconfig { path: path.to_path_buf(), source };
                let file = kube::config::Kubeconfig::read_from(path).map_err(bad)?;
                kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default()).await.map_err(bad)?
            }
            None => kube::Config::infer().await.map_err(ApiError::NoServer)?,
        };
        config.connect_timeout = Some(TIMEOUT);
        config.write_timeout = Some(TIMEOUT);
        let server = config.cluster_url.to_string();
        let mut watch_config = config.clone();
        watch_config.read_timeout = None;
        config.read_timeout = Some(TIMEOUT);
        let client = kube::Client::try_from(config).map_err(|source| ApiError::Client { server: server.clone(), source })?;
        let watcher = kube::Client::try_from(watch_config).map_err(|source| ApiError::Client { server: server.clone(), source })?;
        Ok(Api { client, watcher, server })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// One call: the HTTP status and the body.
    async fn call(&self, method: http::Method, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<(u16, Vec<u8>), ApiError> {
        let mut request = http::Request::builder().method(method.clone()).uri(path).header(http::header::ACCEPT, "application/json");
        let body = match body {
            Some((content_type, bytes)) => {
                request = request.header(http::header::CONTENT_TYPE, content_type);
                Body::from(bytes)
            }
            None => Body::empty(),
        };
        let request = request.body(body).map_err(|e| ApiError::Call { method: method.clone(), path: path.into(), reason: e.to_string() })?;
        let call = async {
            let response = self.client.send(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((status, bytes.to_vec()))
        };
        let url = format!("{}{path}", self.server.trim_end_matches('/'));
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => Err(ApiError::Call { method, path: url, reason }),
            Err(_) => Err(ApiError::Call { method, path: url, reason: format!("no answer in {} s", TIMEOUT.as_secs()) }),
        }
    }

    /// The server's refusal in one line: its Status message, or the start of the body.
    fn refusal(method: &str, path: &str, status: u16, body: &[u8]) -> ApiError {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string());
        ApiError::Refused { method: method.into(), path: path.into(), status, message }
    }

    /// GET: the object, or `None` when the server says 404.
    async fn get(&self, path: &str) -> Result<Option<Value>, ApiError> {
        let (status, body) = self.call(http::Method::GET, path, None).await?;
        match status {
            200..=299 => serde_json::from_slice(&body).map(Some).map_err(|source| ApiError::NotJson { method: "GET".into(), path: path.into(), source }),
            404 => Ok(None),
            _ => Err(Self::refusal("GET", path, status, &body)),
        }
    }

    /// The UID of the Node, for the slice's owner.
    pub async fn node_uid(&self, node: &str) -> Result<Option<String>, ApiError> {
        let path = format!("/api/v1/nodes/{}", segment("node", node)?);
        let node = self.get(&path).await?;
        Ok(node.and_then(|n| n.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string)).filter(|u| !u.is_empty()))
    }

    /// The ResourceClaim `namespace/name`, or `None` when it does not exist.
    pub async fn claim(&self, namespace: &str, name: &str) -> Result<Option<Claim>, ApiError> {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}", segment("namespace", namespace)?, segment("claim", name)?);
        match self.get(&path).await? {
            Some(value) => serde_json::from_value(value).map(Some).map_err(|source| ApiError::NotAClaim { path, source }),
            None => Ok(None),
        }
    }

    /// This node's slices of this driver (the server's list, checked item by item, in case
    /// it ignored the selector), and the list's resourceVersion.
    pub async fn list_slices(&self, node: &str) -> Result<(Vec<Value>, String), ApiError> {
        let path = format!("{SLICES}?fieldSelector={}", selector(node)?);
        let list = self.get(&path).await?.ok_or_else(|| ApiError::Refused { method: "GET".into(), path: path.clone(), status: 404, message: String::new() })?;
        let version = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
        let items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        let mine = items
            .into_iter()
            .filter(|s| s.pointer("/spec/driver").and_then(Value::as_str) == Some(DRIVER) && s.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
            .collect();
        Ok((mine, version))
    }

    /// One slice by name, or `None` when the server says 404 (where it cannot list them).
    pub async fn get_slice(&self, name: &str) -> Result<Option<Value>, ApiError> {
        self.get(&format!("{SLICES}/{}", segment("ResourceSlice", name)?)).await
    }

    /// POSTs a slice; with `dry_run`, the server only says what it would store.
    pub async fn create_slice(&self, slice: &Value, dry_run: bool) -> Result<Written, ApiError> {
        let path = if dry_run { format!("{SLICES}?dryRun=All") } else { SLICES.to_string() };
        let body = serde_json::to_vec(slice).expect("a slice serialises");
        let (status, answer) = self.call(http::Method::POST, &path, Some(("application/json", body))).await?;
        Self::written("POST", &path, status, &answer)
    }

    /// PUTs a slice over the one of its name (conditionally when it names a resourceVersion).
    pub async fn replace_slice(&self, slice: &ResourceSlice) -> Result<Written, ApiError> {
        let name = segment("ResourceSlice", slice.metadata.name.as_deref().unwrap_or_default())?;
        let path = format!("{SLICES}/{name}");
        let body = serde_json::to_vec(slice).expect("a slice serialises");
        let (status, answer) = self.call(http::Method::PUT, &path, Some(("application/json", body))).await?;
        Self::written("PUT", &path, status, &answer)
    }

    fn written(method: &str, path: &str, status: u16, answer: &[u8]) -> Result<Written, ApiError> {
        match status {
            200..=299 => {
                serde_json::from_slice(answer).map(Written::Stored).map_err(|source| ApiError::NotJson { method: method.into(), path: path.into(), source })
            }
            409 => Ok(Written::Conflict),
            _ => Err(Self::refusal(method, path, status, answer)),
        }
    }

    /// DELETEs a slice; one already gone is not an error.
    pub async fn delete_slice(&self, name: &str) -> Result<(), ApiError> {
        let path = format!("{SLICES}/{}", segment("ResourceSlice", name)?);
        match self.call(http::Method::DELETE, &path, None).await? {
            (200..=299 | 404, _) => Ok(()),
            (status, body) => Err(Self::refusal("DELETE", &path, status, &body)),
        }
    }

    /// Watches this node's slices of this driver from `resource_version`, handing each event
    /// to `on_event`, until the server ends the watch (Ok) or it breaks (the reason). An
    /// ERROR event (such as 410: the version is too old) ends it with its message.
    pub async fn watch_slices(&self, node: &str, resource_version: &str, mut on_event: impl FnMut(WatchEvent)) -> Result<(), ApiError> {
        let path = format!(
            "{SLICES}?watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&fieldSelector={}&resourceVersion={}",
            selector(node)?,
            if resource_version.bytes().all(|b| b.is_ascii_alphanumeric()) { resource_version } else { "" }
        );
        let request = http::Request::builder().method(http::Method::GET).uri(&path).header(http::header::ACCEPT, "application/json");
        let failed = |reason: String| ApiError::Call { method: http::Method::GET, path: path.clone(), reason };
        let request = request.body(Body::empty()).map_err(|e| failed(e.to_string()))?;
        let response = tokio::time::timeout(TIMEOUT, self.watcher.send(request))
            .await
            .map_err(|_| failed(format!("no answer in {} s", TIMEOUT.as_secs())))?
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        if !(200..=299).contains(&status) {
            let bytes = http_body_util::BodyExt::collect(body).await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
            return Err(Self::refusal("GET", &path, status, &bytes));
        }
        let mut pending: Vec<u8> = Vec::new();
        let idle = Duration::from_secs(2 * WATCH_SECONDS);
        loop {
            let frame = match tokio::time::timeout(idle, http_body_util::BodyExt::frame(&mut body)).await {
                Err(_) => return Err(ApiError::WatchIdle(idle.as_secs())),
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(ApiError::WatchBroke(e.to_string())),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: Value = serde_json::from_slice(&line).map_err(ApiError::WatchNotJson)?;
                let kind = event["type"].as_str().unwrap_or_default().to_string();
                let object = event["object"].clone();
                if kind == "ERROR" {
                    let message = object["message"].as_str().unwrap_or("no message").to_string();
                    return Err(ApiError::WatchEnded { code: object["code"].clone(), message });
                }
                on_event(WatchEvent { kind, object });
            }
        }
    }
}

/// The field selector of this node's slices of this driver, as a query value.
fn selector(node: &str) -> Result<String, ApiError> {
    Ok(format!("spec.nodeName%3D{}%2Cspec.driver%3D{DRIVER}", segment("node", node)?))
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
        assert_eq!(segment("claim", "a/b").unwrap_err().to_string(), r#"claim "a/b" is not a valid Kubernetes name"#);
        for bad in ["", "a/b", "..%2f", "..", ".a", "a-", "A", "a?b", "a b"] {
            assert!(segment("claim", bad).is_err(), "{bad}");
        }
    }
}
