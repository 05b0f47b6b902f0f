//! A stub Kubernetes API server on 127.0.0.1 for fgpu-kubelet-plugin's tests, written from
//! the real API server's behaviour (not from the driver's code):
//!
//! - Nodes and namespaced ResourceClaims (`resource.k8s.io/v1` JSON), read with GET;
//! - ResourceSlices: list (with the `spec.nodeName` and `spec.driver` field selectors),
//!   get, create (POST, also as a dry run, `dryRun=All`, and with `generateName`), update
//!   (PUT, conditional on `resourceVersion` when the body names one), delete, and delete as
//!   a collection (what kubelet does to a node's slices). On every write the fields of
//!   disabled feature gates are dropped and the slice validated, as the real server does
//!   (validation.rs); `metadata.generation` counts spec changes;
//! - watches of ResourceSlices (`watch=true`): the events after `resourceVersion`, then each
//!   change as it happens, streamed as JSON lines, until `timeoutSeconds` or until the test
//!   cuts them; a `resourceVersion` older than the stub remembers gets a 410 ERROR event.
//!
//! Every request is logged (method, path and query, status), so a test can say what the
//! plugin asked, and with which verbs. Requests are served concurrently, as a real server
//! does; ResourceClaim GETs can be slowed down and counted while in flight.

use super::http::{full, not_found, query, selected, status, Body};
use super::validation::{self, Gates};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// One request the stub answered.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    /// The path and query.
    pub url: String,
    pub status: u16,
}

struct Watcher {
    id: u64,
    selector: Option<String>,
    tx: mpsc::UnboundedSender<Bytes>,
}

pub struct StubState {
    pub gates: Gates,
    /// What `/version` says.
    pub minor: u32,
    pub nodes: BTreeMap<String, Value>,
    /// By (namespace, name).
    pub claims: BTreeMap<(String, String), Value>,
    pub slices: BTreeMap<String, Value>,
    pub log: Vec<Logged>,
    /// Answer every Node request with this status instead (a server that refuses `get nodes`).
    pub nodes_status: Option<u16>,
    /// Answer lists of ResourceSlices (not watches) with this status instead.
    pub slice_list_status: Option<u16>,
    /// Store a dry run's slice all the same (a server that ignores `dryRun`).
    pub ignore_dry_run: bool,
    /// Answer GETs of these ResourceClaims with this status instead (an API server in
    /// trouble), by (namespace, name).
    pub claim_refusals: BTreeMap<(String, String), u16>,
    /// Each ResourceClaim GET takes this long.
    pub claim_delay: Duration,
    /// ResourceClaim GETs in flight now, and the most at once.
    pub claims_in_flight: usize,
    pub claims_in_flight_max: usize,
    resource_version: u64,
    /// Every slice event, by resourceVersion, for watches that start in the past.
    events: Vec<(u64, Bytes, Value)>,
    watchers: Vec<Watcher>,
    next_watcher: u64,
}

impl StubState {
    fn new(gates: Gates) -> StubState {
        StubState {
            gates,
            minor: 34,
            nodes: BTreeMap::new(),
            claims: BTreeMap::new(),
            slices: BTreeMap::new(),
            log: Vec::new(),
            nodes_status: None,
            slice_list_status: None,
            ignore_dry_run: false,
            claim_refusals: BTreeMap::new(),
            claim_delay: Duration::ZERO,
            claims_in_flight: 0,
            claims_in_flight_max: 0,
            resource_version: 100,
            events: Vec::new(),
            watchers: Vec::new(),
            next_watcher: 0,
        }
    }

    fn next_version(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// Records a slice event and hands it to the watches it passes.
    fn emit(&mut self, kind: &str, object: &Value, version: u64) {
        let line = Bytes::from(serde_json::to_string(&json!({"type": kind, "object": object})).unwrap() + "\n");
        self.events.push((version, line.clone(), object.clone()));
        self.watchers.retain(|w| !selected(object, w.selector.as_ref()).unwrap_or(false) || w.tx.send(line.clone()).is_ok());
    }

    /// Ends every watch (a cut connection).
    pub fn cut_watches(&mut self) {
        self.watchers.clear();
    }

    /// Deletes every slice `selector` passes, as kubelet's DeleteCollection does.
    pub fn delete_slices(&mut self, selector: &str) -> Vec<Value> {
        let selector = selector.to_string();
        let names: Vec<String> = self.slices.iter().filter(|(_, s)| selected(s, Some(&selector)).unwrap_or(false)).map(|(n, _)| n.clone()).collect();
        let mut gone = Vec::new();
        for name in names {
            if let Some(mut s) = self.slices.remove(&name) {
                let v = self.next_version();
                s["metadata"]["resourceVersion"] = v.to_string().into();
                self.emit("DELETED", &s, v);
                gone.push(s);
            }
        }
        gone
    }

    fn create(&mut self, mut slice: Value, dry_run: bool) -> (u16, Value) {
        if slice.pointer("/metadata/name").and_then(Value::as_str).is_none() {
            match slice.pointer("/metadata/generateName").and_then(Value::as_str) {
                Some(prefix) => {
                    let name = format!("{prefix}{:05x}", (self.resource_version * 7919) % 0xfffff);
                    slice["metadata"]["name"] = name.into();
                }
                None => return status(422, "Invalid", "metadata.name: Required value: name or generateName is required"),
            }
        }
        let name = slice["metadata"]["name"].as_str().unwrap_or("").to_string();
        if self.slices.contains_key(&name) {
            return status(409, "AlreadyExists", &format!("resourceslices.resource.k8s.io \"{name}\" already exists"));
        }
        if slice["apiVersion"] != "resource.k8s.io/v1" || slice["kind"] != "ResourceSlice" {
            return status(400, "BadRequest", "the body is not a resource.k8s.io/v1 ResourceSlice");
        }
        validation::drop_disabled(&mut slice, None, self.gates);
        if let Err(e) = validation::validate(&slice, None, self.minor) {
            return status(422, "Invalid", &format!("ResourceSlice.resource.k8s.io \"{name}\" is invalid: {e}"));
        }
        let meta = slice["metadata"].as_object_mut().unwrap();
        meta.insert("generation".into(), 1.into());
        meta.insert("uid".into(), format!("0000-slice-{}", self.resource_version).into());
        meta.insert("creationTimestamp".into(), "2025-01-01T00:00:00Z".into());
        if dry_run {
            slice["metadata"]["resourceVersion"] = "".into();
            return (201, slice);
        }
        let v = self.next_version();
        slice["metadata"]["resourceVersion"] = v.to_string().into();
        self.slices.insert(name, slice.clone());
        self.emit("ADDED", &slice, v);
        (201, slice)
    }

    fn update(&mut self, name: &str, mut slice: Value) -> (u16, Value) {
        let Some(existing) = self.slices.get(name).cloned() else { return not_found("resourceslices.resource.k8s.io", name) };
        if slice.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
            return status(400, "BadRequest", "the name of the object does not match the name on the URL");
        }
        if let Some(rv) = slice.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|rv| !rv.is_empty()) {
            if Some(rv) != existing.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                return status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again");
            }
        }
        validation::drop_disabled(&mut slice, Some(&existing), self.gates);
        if let Err(e) = validation::validate(&slice, Some(&existing), self.minor) {
            return status(422, "Invalid", &format!("ResourceSlice.resource.k8s.io \"{name}\" is invalid: {e}"));
        }
        let generation = existing["metadata"]["generation"].as_i64().unwrap_or(1);
        let v = self.next_version();
        let generation = if slice_spec_differs(&existing, &slice) { generation + 1 } else { generation };
        let meta = slice["metadata"].as_object_mut().unwrap();
        meta.insert("generation".into(), generation.into());
        let meta = slice["metadata"].as_object_mut().unwrap();
        meta.insert("uid".into(), existing["metadata"]["uid"].clone());
        meta.insert("creationTimestamp".into(), existing["metadata"]["creationTimestamp"].clone());
        meta.insert("resourceVersion".into(), v.to_string().into());
        self.slices.insert(name.to_string(), slice.clone());
        self.emit("MODIFIED", &slice, v);
        (200, slice)
    }

    fn delete(&mut self, name: &str) -> (u16, Value) {
        match self.slices.remove(name) {
            Some(mut s) => {
                let v = self.next_version();
                s["metadata"]["resourceVersion"] = v.to_string().into();
                self.emit("DELETED", &s, v);
                (200, s)
            }
            None => not_found("resourceslices.resource.k8s.io", name),
        }
    }

    fn list(&self, selector: Option<&String>) -> (u16, Value) {
        let mut items = Vec::new();
        for s in self.slices.values() {
            match selected(s, selector) {
                Ok(true) => items.push(s.clone()),
                Ok(false) => {}
                Err(e) => return status(400, "BadRequest", &e),
            }
        }
        (
            200,
            json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": self.resource_version.to_string()}, "items": items}),
        )
    }

    /// Everything but watches and claim GETs, which wait.
    fn handle(&mut self, method: &str, path: &str, params: &BTreeMap<String, String>, body: &[u8]) -> (u16, Value) {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let body_json = || serde_json::from_slice::<Value>(body).map_err(|e| status(400, "BadRequest", &format!("the body is not JSON: {e}")));
        let dry_run = params.get("dryRun").is_some_and(|d| d == "All") && !self.ignore_dry_run;
        match (method, parts.as_slice()) {
            ("GET", ["version"]) => {
                (200, json!({"major": "1", "minor": self.minor.to_string(), "gitVersion": format!("v1.{}.0", self.minor), "platform": "linux/amd64"}))
            }
            ("GET", ["api", "v1", "nodes", name]) => match (self.nodes_status, self.nodes.get(*name)) {
                (Some(code), _) => status(code, "Forbidden", "nodes are not served"),
                (None, Some(node)) => (200, node.clone()),
                (None, None) => not_found("nodes", name),
            },
            ("GET", ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name]) => {
                match self.claims.get(&(ns.to_string(), name.to_string())) {
                    Some(claim) => (200, claim.clone()),
                    None => not_found("resourceclaims.resource.k8s.io", name),
                }
            }
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => match self.slice_list_status {
                Some(code) => status(code, "InternalError", "slices cannot be listed"),
                None => self.list(params.get("fieldSelector")),
            },
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => match self.slices.get(*name) {
                Some(s) => (200, s.clone()),
                None => not_found("resourceslices.resource.k8s.io", name),
            },
            ("POST", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => match body_json() {
                Ok(slice) => self.create(slice, dry_run),
                Err(e) => e,
            },
            ("PUT", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => match body_json() {
                Ok(slice) => self.update(name, slice),
                Err(e) => e,
            },
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => self.delete(name),
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                let items = self.delete_slices(params.get("fieldSelector").map(String::as_str).unwrap_or(""));
                (200, json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {}, "items": items}))
            }
            _ => status(405, "MethodNotAllowed", &format!("{method} {path} is not served by this stub")),
        }
    }

    /// Starts a watch: the events after `from`, then the live ones.
    fn watch(&mut self, from: Option<u64>, selector: Option<String>) -> Result<(u64, mpsc::UnboundedReceiver<Bytes>), (u16, Value)> {
        if let Some(s) = &selector {
            selected(&json!({}), Some(s)).map_err(|e| status(400, "BadRequest", &e))?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(from) = from {
            let oldest = self.events.first().map_or(self.resource_version, |(v, _, _)| v.saturating_sub(1));
            if from < oldest {
                let gone = status(410, "Expired", &format!("too old resource version: {from} ({oldest})")).1;
                let _ = tx.send(Bytes::from(serde_json::to_string(&json!({"type": "ERROR", "object": gone})).unwrap() + "\n"));
                return Ok((u64::MAX, rx));
            }
            for (v, line, object) in &self.events {
                if *v > from && selected(object, selector.as_ref()).unwrap_or(false) {
                    let _ = tx.send(line.clone());
                }
            }
        }
        self.next_watcher += 1;
        let id = self.next_watcher;
        self.watchers.push(Watcher { id, selector, tx });
        Ok((id, rx))
    }

    fn end_watch(&mut self, id: u64) {
        self.watchers.retain(|w| w.id != id);
    }
}

fn slice_spec_differs(a: &Value, b: &Value) -> bool {
    a["spec"] != b["spec"]
}

async fn serve(state: Arc<Mutex<StubState>>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = request.method().as_str().to_uppercase();
    let url = request.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let (path, params) = query(&url);
    let log = |code: u16| {
        state.lock().unwrap().log.push(Logged { method: method.clone(), url: url.clone(), status: code });
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let is_watch = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    if method == "GET" && is_watch && parts == ["apis", "resource.k8s.io", "v1", "resourceslices"] {
        let from = params.get("resourceVersion").and_then(|v| v.parse().ok());
        let timeout = params.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(1800u64);
        let started = state.lock().unwrap().watch(from, params.get("fieldSelector").cloned());
        return Ok(match started {
            Err((code, value)) => {
                log(code);
                full(code, &value)
            }
            Ok((id, rx)) => {
                log(200);
                let ender = state.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(timeout)).await;
                    ender.lock().unwrap().end_watch(id);
                });
                let stream = futures_util::StreamExt::map(tokio_stream::wrappers::UnboundedReceiverStream::new(rx), |b| Ok::<_, Infallible>(Frame::data(b)));
                Response::builder().status(200).header("content-type", "application/json").body(StreamBody::new(stream).boxed()).unwrap()
            }
        });
    }
    if method == "GET" && parts.len() == 7 && parts[..4] == ["apis", "resource.k8s.io", "v1", "namespaces"] && parts[5] == "resourceclaims" {
        let (delay, refusal) = {
            let mut s = state.lock().unwrap();
            s.claims_in_flight += 1;
            s.claims_in_flight_max = s.claims_in_flight_max.max(s.claims_in_flight);
            (s.claim_delay, s.claim_refusals.get(&(parts[4].to_string(), parts[6].to_string())).copied())
        };
        tokio::time::sleep(delay).await;
        let (code, value) = {
            let mut s = state.lock().unwrap();
            s.claims_in_flight -= 1;
            match refusal {
                Some(code) => status(code, "InternalError", "the claim cannot be read now"),
                None => s.handle(&method, &path, &params, &body),
            }
        };
        log(code);
        return Ok(full(code, &value));
    }
    let (code, value) = state.lock().unwrap().handle(&method, &path, &params, &body);
    log(code);
    Ok(full(code, &value))
}

pub struct StubApi {
    pub url: String,
    pub state: Arc<Mutex<StubState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubApi {
    /// A stub with every gate this driver may use on.
    pub fn start() -> StubApi {
        StubApi::with_gates(Gates::ALL)
    }

    pub fn with_gates(gates: Gates) -> StubApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("the stub API server listens on 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(StubState::new(gates)));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let st = st.clone();
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |r| serve(st.clone(), r));
                                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                            });
                        }
                    }
                }
            });
            runtime.shutdown_timeout(Duration::from_millis(100));
        });
        StubApi { url: format!("http://127.0.0.1:{port}"), state, stop: Some(stop), thread: Some(thread) }
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

    pub fn remove_claim(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().claims.remove(&(namespace.to_string(), name.to_string()));
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

    /// Writes of ResourceSlices (POST, PUT, DELETE; dry runs left out).
    pub fn slice_writes(&self) -> usize {
        self.log()
            .iter()
            .filter(|l| {
                ["POST", "PUT", "DELETE", "PATCH"].contains(&l.method.as_str())
                    && l.url.starts_with("/apis/resource.k8s.io/v1/resourceslices")
                    && !l.url.contains("dryRun")
            })
            .count()
    }

    /// kubelet's wipe of a node's slices: DeleteCollection with `spec.nodeName=<node>`.
    pub fn wipe(&self, node: &str) -> usize {
        self.state.lock().unwrap().delete_slices(&format!("spec.nodeName={node}")).len()
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
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
