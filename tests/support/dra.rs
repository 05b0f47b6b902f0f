//! Kubernetes without a cluster, for fgpu-kubelet-plugin's tests: a stub API server
//! ([`api_server`], with the API server's own dropping of gated fields and validation of
//! slices, [`validation`]), a stub of the scheduler's allocator ([`allocator`]) and a fake kubelet ([`Kubelet`]) that calls the plugin's
//! registration and DRA services as kubelet does: a gRPC client that sends the
//! `:authority` kubelet's grpc-go sends (tests/python/fake_kubelet.py, grpcio and the h2
//! library, with its own transcription of Kubernetes' .proto files).

pub mod allocator;
pub mod api_server;
pub mod http;
pub mod validation;

pub use api_server::{Logged, StubApi, StubState};
pub use validation::Gates;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One allocated device of a claim, as the scheduler writes it.
#[derive(Clone)]
pub struct Alloc<'a> {
    /// The request, or `request/subrequest` for a prioritized list's choice.
    pub request: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    /// `consumedCapacity.memory` (none: a cluster without DRAConsumableCapacity).
    pub memory: Option<&'a str>,
    pub compute: Option<&'a str>,
    /// `adminAccess: true`.
    pub admin: bool,
}

impl<'a> Alloc<'a> {
    pub fn new(pool: &'a str, device: &'a str, memory: Option<&'a str>, compute: Option<&'a str>) -> Alloc<'a> {
        Alloc { request: "gpu", pool, device, memory, compute, admin: false }
    }
}

/// A ResourceClaim as the API server serves it once the scheduler allocated it, with
/// `consumedCapacity` and `shareID` where the allocation consumed capacity; `pods` are the
/// pods it is reserved for. No allocation when `allocs` is `None`. A request named
/// `request/subrequest` is written as a prioritized list (`firstAvailable`).
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
            let exactly = json!({"deviceClassName": "gpu.fgpu.io", "allocationMode": "ExactCount", "count": 1, "capacity": {"requests": requests}});
            match a.request.split_once('/') {
                Some((request, sub)) => json!({"name": request, "firstAvailable": [
                    {"name": "large", "deviceClassName": "gpu.fgpu.io", "allocationMode": "ExactCount", "count": 1,
                     "capacity": {"requests": {"memory": "64Gi"}}},
                    {"name": sub, "deviceClassName": "gpu.fgpu.io", "allocationMode": "ExactCount", "count": 1, "capacity": exactly["capacity"]}]}),
                None if a.admin => {
                    let mut exactly = exactly;
                    exactly["adminAccess"] = true.into();
                    json!({"name": a.request, "exactly": exactly})
                }
                None => json!({"name": a.request, "exactly": exactly}),
            }
        })
        .collect();
    let mut claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7", "creationTimestamp": "2025-01-01T00:00:00Z",
            "finalizers": ["resource.kubernetes.io/delete-protection"]},
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
                if a.admin {
                    r["adminAccess"] = true.into();
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

    fn json(claims: &[ClaimRef]) -> String {
        Value::Array(claims.iter().map(|c| json!({"namespace": c.namespace, "name": c.name, "uid": c.uid})).collect()).to_string()
    }
}

/// What kubelet sends as `:authority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// The socket's path, percent-encoded (grpc-go dialling a bare path: kubelet's plugin
    /// watcher, and the DRA client of older kubelets).
    GrpcGo,
    /// `localhost` (grpc-go dialling `unix:<path>`: newer kubelets' DRA client).
    Localhost,
    /// None at all.
    Absent,
}

impl Authority {
    pub const ALL: [Authority; 3] = [Authority::GrpcGo, Authority::Localhost, Authority::Absent];

    fn flag(self) -> &'static str {
        match self {
            Authority::GrpcGo => "grpc-go",
            Authority::Localhost => "localhost",
            Authority::Absent => "absent",
        }
    }
}

/// kubelet, as far as a DRA driver sees it: gRPC calls over the plugin's Unix sockets,
/// made by tests/python/fake_kubelet.py. Each answer is the script's JSON.
pub struct Kubelet {
    python: PathBuf,
    pub authority: Authority,
}

/// The fake kubelet script.
pub fn fake_kubelet() -> PathBuf {
    crate::workspace().join("tests/python/fake_kubelet.py")
}

impl Kubelet {
    /// `None` (with the reason printed; a failure under CI) when the test Python lacks
    /// grpcio, grpcio-tools or h2.
    pub fn new(authority: Authority) -> Option<Kubelet> {
        let python = crate::python_with("grpc, grpc_tools, h2")?;
        Some(Kubelet { python, authority })
    }

    fn call(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(&self.python)
            .arg(fake_kubelet())
            .args(["--authority", self.authority.flag()])
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", fake_kubelet().display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let value: Value = serde_json::from_str(stdout.trim())
            .map_err(|e| format!("fake_kubelet.py {args:?} ({}) printed no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}", out.status))?;
        match value.get("error").and_then(Value::as_str) {
            Some(error) => Err(error.to_string()),
            None => Ok(value),
        }
    }

    /// GetInfo then NotifyRegistrationStatus(registered), as kubelet's plugin watcher: the
    /// plugin's info.
    pub fn register(&self, socket: &Path) -> Result<Value, String> {
        self.call(&["register", &socket.to_string_lossy()]).map(|v| v["info"].clone())
    }

    pub fn notify(&self, socket: &Path, registered: bool, error: &str) -> Result<(), String> {
        self.call(&["notify", &socket.to_string_lossy(), if registered { "true" } else { "false" }, error]).map(|_| ())
    }

    /// NodePrepareResources for `claims` in one call: the answer per claim UID.
    pub fn prepare(&self, socket: &Path, claims: &[ClaimRef]) -> Result<Value, String> {
        self.call(&["prepare", &socket.to_string_lossy(), &ClaimRef::json(claims)]).map(|v| v["claims"].clone())
    }

    pub fn unprepare(&self, socket: &Path, claims: &[ClaimRef]) -> Result<Value, String> {
        self.call(&["unprepare", &socket.to_string_lossy(), &ClaimRef::json(claims)]).map(|v| v["claims"].clone())
    }

    /// kubelet's device health stream (DRAResourceHealth.NodeWatchResources) as a kubelet
    /// of `version` ("1.34", "1.35" or "1.36") opens it, after GetInfo on the registration
    /// socket `socket`: running, one JSON line per message (tests/python/fake_kubelet.py).
    pub fn watch_health(&self, socket: &Path, version: &str) -> crate::Background {
        crate::Cmd(Command::new(&self.python))
            .arg(fake_kubelet())
            .args(["--authority", self.authority.flag(), "--kubelet", version, "watch-health"])
            .arg(socket)
            .spawn()
    }

    /// One NodePrepareResources per claim, all at once: the answers, and each call's time.
    pub fn prepare_concurrently(&self, socket: &Path, claims: &[ClaimRef]) -> Result<Value, String> {
        self.call(&["concurrent", &socket.to_string_lossy(), &ClaimRef::json(claims)])
    }
}
