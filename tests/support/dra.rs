//! Kubernetes without a cluster, for fgpu-kubelet-plugin's tests: a stub API server on
//! 127.0.0.1 that speaks `resource.k8s.io/v1` JSON, and a fake kubelet that calls the
//! plugin's registration and DRA services over their Unix sockets.
//!
//! The stub answers what a real API server answers to the calls a DRA driver may make:
//! discovery (`/api`, `/apis`, `/apis/resource.k8s.io/v1`), `/version`, Nodes, namespaced
//! ResourceClaims, and ResourceSlices written by POST, PUT, merge PATCH or server-side
//! apply and deleted one by one or as a collection (with `spec.nodeName` and `spec.driver`
//! field selectors). A watch gets an empty stream that closes at once. Every request is
//! logged, so a test can say what the plugin asked.

use crate::dra_proto::dra::dra_plugin_client::DraPluginClient;
use crate::dra_proto::dra::{Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse};
use crate::dra_proto::registration::registration_client::RegistrationClient;
use crate::dra_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One request the stub answered.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    /// The path and query.
    pub url: String,
    pub content_type: String,
    pub status: u16,
}

#[derive(Default)]
pub struct StubState {
    pub nodes: BTreeMap<String, Value>,
    /// By (namespace, name).
    pub claims: BTreeMap<(String, String), Value>,
    pub slices: BTreeMap<String, Value>,
    pub log: Vec<Logged>,
    /// Answer every Node request with this status instead (a server that refuses `get nodes`).
    pub nodes_status: Option<u16>,
    /// Answer a GET of one ResourceSlice with this status instead (a server that cannot
    /// read a slice back).
    pub slice_get_status: Option<u16>,
    resource_version: u64,
}

pub struct StubApi {
    pub url: String,
    pub state: Arc<Mutex<StubState>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (code, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}))
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn query(url: &str) -> (String, BTreeMap<String, String>) {
    let (path, q) = url.split_once('?').unwrap_or((url, ""));
    let decode = |s: &str| s.replace("%3D", "=").replace("%3d", "=").replace("%2C", ",").replace("%2c", ",").replace('+', " ");
    let params = q.split('&').filter(|p| !p.is_empty()).filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), decode(v))).collect();
    (path.to_string(), params)
}

/// Whether a slice passes a `fieldSelector` such as `spec.nodeName=n,spec.driver=d`.
fn selected(slice: &Value, selector: Option<&String>) -> Result<bool, String> {
    let Some(selector) = selector else { return Ok(true) };
    for term in selector.split(',').filter(|t| !t.is_empty()) {
        let (field, want) = term.split_once('=').ok_or_else(|| format!("bad field selector {term:?}"))?;
        let want = want.trim_start_matches('=');
        let have = match field {
            "spec.nodeName" => slice.pointer("/spec/nodeName"),
            "spec.driver" => slice.pointer("/spec/driver"),
            "spec.pool.name" => slice.pointer("/spec/pool/name"),
            "metadata.name" => slice.pointer("/metadata/name"),
            other => return Err(format!("field label not supported: {other}")),
        };
        if have.and_then(Value::as_str) != Some(want) {
            return Ok(false);
        }
    }
    Ok(true)
}

impl StubState {
    fn next_version(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// Checks what the API server itself would refuse in a ResourceSlice.
    fn validate_slice(slice: &Value) -> Result<(), String> {
        if slice["apiVersion"] != "resource.k8s.io/v1" || slice["kind"] != "ResourceSlice" {
            return Err(format!("not a resource.k8s.io/v1 ResourceSlice: apiVersion {} kind {}", slice["apiVersion"], slice["kind"]));
        }
        let spec = &slice["spec"];
        if !spec["driver"].is_string()
            || !spec["pool"]["name"].is_string()
            || !spec["pool"]["resourceSliceCount"].is_i64()
            || !spec["pool"]["generation"].is_i64()
        {
            return Err("spec.driver, spec.pool.name, spec.pool.generation and spec.pool.resourceSliceCount are required".into());
        }
        let placement = ["nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"].iter().filter(|k| !spec[**k].is_null()).count();
        if placement != 1 {
            return Err("exactly one of spec.nodeName, spec.nodeSelector, spec.allNodes, spec.perDeviceNodeSelection is required".into());
        }
        let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if devices.len() > 128 {
            return Err("at most 128 devices".into());
        }
        for d in devices {
            let name = d["name"].as_str().unwrap_or("");
            let label = !name.is_empty() && name.len() <= 63 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !label || name.starts_with('-') || name.ends_with('-') {
                return Err(format!("device name {name:?} is not a DNS label"));
            }
            for (key, attr) in d["attributes"].as_object().into_iter().flatten() {
                let set = ["int", "bool", "string", "version"].iter().filter(|t| !attr[**t].is_null()).count();
                if set != 1 || key.len() > 32 + 64 {
                    return Err(format!("device {name}: attribute {key} must have exactly one value"));
                }
                if attr["string"].as_str().is_some_and(|s| s.len() > 64) {
                    return Err(format!("device {name}: attribute {key} is longer than 64 characters"));
                }
            }
            for (key, cap) in d["capacity"].as_object().into_iter().flatten() {
                if !cap["value"].is_string() {
                    return Err(format!("device {name}: capacity {key} has no value"));
                }
                if let Some(range) = cap.pointer("/requestPolicy/validRange") {
                    if !range["min"].is_string() {
                        return Err(format!("device {name}: capacity {key}: validRange.min is required"));
                    }
                }
            }
        }
        Ok(())
    }

    fn handle(&mut self, method: &str, url: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
        let (path, params) = query(url);
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let body_json = || serde_json::from_slice::<Value>(body).map_err(|e| status(400, "BadRequest", &format!("body is not JSON: {e}")));
        match (method, parts.as_slice()) {
            ("GET", ["version"]) => (200, json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"})),
            ("GET", ["api"]) => (200, json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})),
            ("GET", ["apis"]) => (
                200,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "resource.k8s.io",
                    "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"}}]}),
            ),
            ("GET", ["apis", "resource.k8s.io", "v1"]) => {
                let verbs = json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]);
                (
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1", "resources": [
                        {"name": "deviceclasses", "singularName": "deviceclass", "namespaced": false, "kind": "DeviceClass", "verbs": verbs},
                        {"name": "resourceclaims", "singularName": "resourceclaim", "namespaced": true, "kind": "ResourceClaim", "verbs": verbs},
                        {"name": "resourceclaimtemplates", "singularName": "resourceclaimtemplate", "namespaced": true, "kind": "ResourceClaimTemplate", "verbs": verbs},
                        {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false, "kind": "ResourceSlice", "verbs": verbs}]}),
                )
            }
            ("GET", ["api", "v1", "nodes", name]) => match (self.nodes_status, self.nodes.get(*name)) {
                (Some(code), _) => status(code, "InternalError", "nodes are not served"),
                (None, Some(node)) => (200, node.clone()),
                (None, None) => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            },
            ("GET", ["api", "v1", "nodes"]) => {
                (200, json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": self.nodes.values().collect::<Vec<_>>()}))
            }
            ("GET", ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name]) => {
                match self.claims.get(&(ns.to_string(), name.to_string())) {
                    Some(claim) => (200, claim.clone()),
                    None => status(404, "NotFound", &format!("resourceclaims.resource.k8s.io \"{name}\" not found")),
                }
            }
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"]) if params.get("watch").is_some_and(|w| w == "true" || w == "1") => (200, Value::Null),
            ("GET", ["apis", "resource.k8s.io", "v1", "watch", "resourceslices"]) => (200, Value::Null),
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                let mut items = Vec::new();
                for s in self.slices.values() {
                    match selected(s, params.get("fieldSelector")) {
                        Ok(true) => items.push(s.clone()),
                        Ok(false) => {}
                        Err(e) => return status(400, "BadRequest", &e),
                    }
                }
                let rv = self.resource_version.to_string();
                (200, json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": rv}, "items": items}))
            }
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", _]) if self.slice_get_status.is_some() => {
                status(self.slice_get_status.unwrap_or(500), "InternalError", "slices cannot be read")
            }
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => match self.slices.get(*name) {
                Some(s) => (200, s.clone()),
                None => status(404, "NotFound", &format!("resourceslices.resource.k8s.io \"{name}\" not found")),
            },
            ("POST", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                let mut slice = match body_json() {
                    Ok(v) => v,
                    Err(e) => return e,
                };
                if slice.pointer("/metadata/name").and_then(Value::as_str).is_none() {
                    match slice.pointer("/metadata/generateName").and_then(Value::as_str) {
                        Some(prefix) => {
                            let name = format!("{prefix}{:05}", self.resource_version + 1);
                            slice["metadata"]["name"] = name.into();
                        }
                        None => return status(422, "Invalid", "metadata.name or metadata.generateName is required"),
                    }
                }
                self.create(slice)
            }
            ("PUT", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                let slice = match body_json() {
                    Ok(v) => v,
                    Err(e) => return e,
                };
                let Some(existing) = self.slices.get(*name).cloned() else {
                    return status(404, "NotFound", &format!("resourceslices.resource.k8s.io \"{name}\" not found"));
                };
                if slice.pointer("/metadata/name").and_then(Value::as_str) != Some(*name) {
                    return status(400, "BadRequest", "the name in the body does not match the URL");
                }
                if let Some(rv) = slice.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                    if Some(rv) != existing.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                        return status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again");
                    }
                }
                self.update(name, slice, &existing)
            }
            ("PATCH", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                let patch = match body_json() {
                    Ok(v) => v,
                    Err(e) => return e,
                };
                let existing = self.slices.get(*name).cloned();
                match content_type {
                    "application/merge-patch+json" => {
                        let Some(existing) = existing else {
                            return status(404, "NotFound", &format!("resourceslices.resource.k8s.io \"{name}\" not found"));
                        };
                        let mut merged = existing.clone();
                        merge_patch(&mut merged, &patch);
                        self.update(name, merged, &existing)
                    }
                    "application/apply-patch+yaml" | "application/apply-patch+json" => {
                        if !params.contains_key("fieldManager") {
                            return status(400, "BadRequest", "fieldManager is required for apply patch");
                        }
                        match existing {
                            None => {
                                let mut slice = patch;
                                slice["metadata"]["name"] = (*name).into();
                                self.create(slice)
                            }
                            Some(existing) => {
                                let mut merged = existing.clone();
                                merge_patch(&mut merged, &patch);
                                self.update(name, merged, &existing)
                            }
                        }
                    }
                    other => status(415, "UnsupportedMediaType", &format!("the stub does not take {other:?} patches")),
                }
            }
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => match self.slices.remove(*name) {
                Some(s) => (200, s),
                None => status(404, "NotFound", &format!("resourceslices.resource.k8s.io \"{name}\" not found")),
            },
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                let mut gone = Vec::new();
                for (name, s) in &self.slices {
                    match selected(s, params.get("fieldSelector")) {
                        Ok(true) => gone.push(name.clone()),
                        Ok(false) => {}
                        Err(e) => return status(400, "BadRequest", &e),
                    }
                }
                let items: Vec<Value> = gone.iter().filter_map(|n| self.slices.remove(n)).collect();
                (200, json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {}, "items": items}))
            }
            _ => status(404, "NotFound", &format!("the server could not find the requested resource ({method} {path})")),
        }
    }

    fn create(&mut self, mut slice: Value) -> (u16, Value) {
        if let Err(e) = Self::validate_slice(&slice) {
            return status(422, "Invalid", &e);
        }
        let name = slice["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if self.slices.contains_key(&name) {
            return status(409, "AlreadyExists", &format!("resourceslices.resource.k8s.io \"{name}\" already exists"));
        }
        let rv = self.next_version();
        slice["metadata"]["resourceVersion"] = rv.into();
        slice["metadata"]["uid"] = format!("slice-uid-{}", self.resource_version).into();
        slice["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z".into();
        self.slices.insert(name, slice.clone());
        (201, slice)
    }

    fn update(&mut self, name: &str, mut slice: Value, existing: &Value) -> (u16, Value) {
        if let Err(e) = Self::validate_slice(&slice) {
            return status(422, "Invalid", &e);
        }
        for immutable in ["/spec/driver", "/spec/nodeName", "/spec/pool/name"] {
            if slice.pointer(immutable) != existing.pointer(immutable) {
                return status(422, "Invalid", &format!("{immutable}: field is immutable"));
            }
        }
        let rv = self.next_version();
        slice["metadata"]["resourceVersion"] = rv.into();
        slice["metadata"]["uid"] = existing["metadata"]["uid"].clone();
        slice["metadata"]["creationTimestamp"] = existing["metadata"]["creationTimestamp"].clone();
        self.slices.insert(name.to_string(), slice.clone());
        (200, slice)
    }
}

impl StubApi {
    pub fn start() -> StubApi {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("the stub API server listens on 127.0.0.1"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let state = Arc::new(Mutex::new(StubState::default()));
        let (s, st) = (server.clone(), state.clone());
        let thread = std::thread::spawn(move || {
            for mut request in s.incoming_requests() {
                let method = request.method().as_str().to_uppercase();
                let url = request.url().to_string();
                let content_type = request
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Content-Type"))
                    .map(|h| h.value.as_str().split(';').next().unwrap_or("").trim().to_string())
                    .unwrap_or_default();
                let mut body = Vec::new();
                let _ = request.as_reader().read_to_end(&mut body);
                let (code, answer) = {
                    let mut state = st.lock().unwrap();
                    let (code, answer) = state.handle(&method, &url, &content_type, &body);
                    state.log.push(Logged { method, url, content_type, status: code });
                    (code, answer)
                };
                let response = if answer.is_null() {
                    // A watch: an empty stream that closes at once.
                    tiny_http::Response::from_data(Vec::new()).with_status_code(code)
                } else {
                    tiny_http::Response::from_data(serde_json::to_vec(&answer).unwrap())
                        .with_status_code(code)
                        .with_header(tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap())
                };
                let _ = request.respond(response);
            }
        });
        StubApi { url: format!("http://127.0.0.1:{port}"), state, server, thread: Some(thread) }
    }

    pub fn add_node(&self, name: &str, uid: &str) {
        let node = json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "uid": uid, "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name}}, "spec": {}, "status": {}});
        self.state.lock().unwrap().nodes.insert(name.into(), node);
    }

    pub fn add_claim(&self, claim: Value) {
        let key = (claim["metadata"]["namespace"].as_str().unwrap().to_string(), claim["metadata"]["name"].as_str().unwrap().to_string());
        self.state.lock().unwrap().claims.insert(key, claim);
    }

    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().slices.clone()
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    /// How many `method` requests reached a path starting with `path`.
    pub fn count(&self, method: &str, path: &str) -> usize {
        self.log().iter().filter(|l| l.method == method && l.url.starts_with(path)).count()
    }

    /// A kubeconfig naming this server, written to `path`.
    pub fn kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: {}\ncontexts:\n- name: stub\n  context:\n    cluster: stub\n    user: stub\ncurrent-context: stub\nusers:\n- name: stub\n  user:\n    token: stub-token\n",
            self.url
        );
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for StubApi {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One allocated device of a claim.
pub struct Alloc<'a> {
    pub request: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    /// `consumedCapacity.memory` (none: a cluster without DRAConsumableCapacity).
    pub memory: Option<&'a str>,
    pub compute: Option<&'a str>,
}

/// A ResourceClaim as the API server serves it once the scheduler allocated it, with
/// `consumedCapacity` and `shareID` where the allocation consumed capacity; `pods` are the
/// pods it is reserved for. No allocation when `allocs` is `None`.
pub fn claim_json(namespace: &str, name: &str, uid: &str, allocs: Option<&[Alloc]>, pods: &[&str]) -> Value {
    let requests: Vec<Value> = allocs
        .unwrap_or(&[])
        .iter()
        .map(|a| {
            let mut requests = serde_json::Map::new();
            if let Some(m) = a.memory {
                requests.insert("memory".into(), m.into());
            }
            if let Some(c) = a.compute {
                requests.insert("compute".into(), c.into());
            }
            json!({"name": a.request, "exactly": {"deviceClassName": "gpu.fgpu.io", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": requests}}})
        })
        .collect();
    let mut claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"devices": {"requests": requests}},
        "status": {}
    });
    if let Some(allocs) = allocs {
        let results: Vec<Value> = allocs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut r = json!({"request": a.request, "driver": "gpu.fgpu.io", "pool": a.pool, "device": a.device});
                let mut consumed = serde_json::Map::new();
                if let Some(m) = a.memory {
                    consumed.insert("memory".into(), m.into());
                }
                if let Some(c) = a.compute {
                    consumed.insert("compute".into(), c.into());
                }
                if !consumed.is_empty() {
                    r["consumedCapacity"] = Value::Object(consumed);
                    r["shareID"] = format!("5d1c6b1e-0000-4000-8000-{i:012}").into();
                }
                r
            })
            .collect();
        claim["status"]["allocation"] = json!({"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [allocs.first().map(|a| a.pool).unwrap_or("")]}]}]}});
        let reserved: Vec<Value> = pods.iter().enumerate().map(|(i, p)| json!({"resource": "pods", "name": p, "uid": format!("pod-uid-{i}")})).collect();
        claim["status"]["reservedFor"] = Value::Array(reserved);
    }
    claim
}

/// A claim as kubelet names it to the plugin.
#[derive(Debug, Clone)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimRef {
    pub fn new(namespace: &str, name: &str, uid: &str) -> ClaimRef {
        ClaimRef { namespace: namespace.into(), name: name.into(), uid: uid.into() }
    }

    fn proto(&self) -> Claim {
        Claim { namespace: self.namespace.clone(), name: self.name.clone(), uid: self.uid.clone() }
    }
}

/// kubelet, as far as a DRA driver sees it: gRPC calls over the plugin's Unix sockets.
pub struct Kubelet {
    runtime: tokio::runtime::Runtime,
}

impl Default for Kubelet {
    fn default() -> Self {
        Self::new()
    }
}

impl Kubelet {
    pub fn new() -> Kubelet {
        Kubelet { runtime: tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap() }
    }

    async fn channel(socket: PathBuf) -> Result<tonic::transport::Channel, String> {
        tonic::transport::Endpoint::try_from("http://[::1]:50051")
            .map_err(|e| e.to_string())?
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
            }))
            .await
            .map_err(|e| format!("cannot connect: {e}"))
    }

    /// GetInfo on the registration socket.
    pub fn get_info(&self, socket: &Path) -> Result<PluginInfo, String> {
        self.runtime.block_on(async {
            let mut client = RegistrationClient::new(Self::channel(socket.to_path_buf()).await?);
            client.get_info(InfoRequest {}).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
        })
    }

    /// NotifyRegistrationStatus on the registration socket.
    pub fn notify(&self, socket: &Path, registered: bool, error: &str) -> Result<(), String> {
        self.runtime.block_on(async {
            let mut client = RegistrationClient::new(Self::channel(socket.to_path_buf()).await?);
            client
                .notify_registration_status(RegistrationStatus { plugin_registered: registered, error: error.into() })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    pub fn prepare(&self, socket: &Path, claims: &[ClaimRef]) -> Result<NodePrepareResourcesResponse, String> {
        self.runtime.block_on(async {
            let mut client = DraPluginClient::new(Self::channel(socket.to_path_buf()).await?);
            let request = NodePrepareResourcesRequest { claims: claims.iter().map(ClaimRef::proto).collect() };
            client.node_prepare_resources(request).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
        })
    }

    pub fn unprepare(&self, socket: &Path, claims: &[ClaimRef]) -> Result<NodeUnprepareResourcesResponse, String> {
        self.runtime.block_on(async {
            let mut client = DraPluginClient::new(Self::channel(socket.to_path_buf()).await?);
            let request = NodeUnprepareResourcesRequest { claims: claims.iter().map(ClaimRef::proto).collect() };
            client.node_unprepare_resources(request).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
        })
    }
}
