//! fgpu-kubelet-plugin, the DRA driver `gpu.fgpu.io`, without a cluster: a fake kubelet
//! that calls as kubelet's grpc-go does (tests/python/fake_kubelet.py: the `:authority`
//! grpc-go sends, concurrent calls, 45 s deadlines) and a stub API server that drops the
//! fields of disabled gates, validates slices as the API server does and streams watches
//! (tests/support/dra/), against the simulated driver. The slices are checked field by
//! field against the simulator's own figures; a claim's CDI files are mounted as a runtime
//! mounts them and cap a process. The same devices in real podman containers are
//! tests/cdi/dra.sh.
//!
//! `FGPU_DRA_PLUGIN=<path>` runs these tests against another build of the plugin (an older
//! release, to show what a test catches).

use fgpu_tests::dra::{claim_json, Alloc, Authority, ClaimRef, Gates, Kubelet, StubApi};
use fgpu_tests::*;
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Claims under load and over time.
mod claims;
/// Device health and metrics.
mod health;
/// MIG partitions created at prepare, destroyed at unprepare.
mod mig_prepare;
/// MIG partitions published, and allocated by a stub of the scheduler's allocator.
mod partitions;
/// What is published as the GPUs and the server change.
mod publishing;

const NODE: &str = "node-a";
const NODE_UID: &str = "2c4a3a4e-9f0e-4d5e-8d0a-6f1b8e0c1d2f";
const RESERVE: u64 = 512 * MIB;
const STEP: u64 = 256 * MIB;
const SLICE: &str = "node-a-gpu.fgpu.io-0";

fn plugin_bin() -> PathBuf {
    let path = std::env::var_os("FGPU_DRA_PLUGIN").map(PathBuf::from).unwrap_or_else(|| release_dir().join("fgpu-kubelet-plugin"));
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// One node: its simulated GPUs (`env`), the API server, kubelet and the plugin's directories.
pub(crate) struct Node {
    pub(crate) env: Env,
    pub(crate) api: StubApi,
    pub(crate) kubelet: Kubelet,
}

/// A running plugin; stopped when dropped. Its log is kept for failure messages.
pub(crate) struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }

    /// SIGTERM, as kubelet stops a pod: the exit status and the log.
    pub(crate) fn terminate(mut self, within: Duration) -> (Option<i32>, String) {
        // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.code(), self.log());
            }
            if Instant::now() > deadline {
                return (None, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the plugin mounted under the node's directory (the claims' ledger tmpfs) goes with
/// it, whatever the test left prepared: the test's directory is then removed whole.
impl Drop for Node {
    fn drop(&mut self) {
        let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
        let prefix = format!("{}/", self.env.dir.display());
        let mut points: Vec<&str> = mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&prefix)).collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = std::process::Command::new("umount").args(["-l", point]).status();
        }
    }
}

impl Node {
    /// `None` (skipped, or a failure under CI) without the fake kubelet's Python.
    pub(crate) fn new(name: &str, gpus: u32, gates: Gates) -> Option<Node> {
        let kubelet = Kubelet::new(Authority::GrpcGo)?;
        let env = Env::new(name).devices(gpus);
        let api = StubApi::with_gates(gates);
        api.add_node(NODE, NODE_UID);
        api.kubeconfig(&env.dir.join("kubeconfig"));
        std::fs::create_dir_all(env.dir.join("cdi")).unwrap();
        env.client(&["init"]).success();
        Some(Node { env, api, kubelet })
    }

    pub(crate) fn cdi(&self) -> PathBuf {
        self.env.dir.join("cdi")
    }
    fn registry(&self) -> PathBuf {
        self.env.dir.join("registry")
    }
    fn registration(&self) -> PathBuf {
        self.registry().join("gpu.fgpu.io-reg.sock")
    }
    fn plugins(&self) -> PathBuf {
        self.env.dir.join("plugins")
    }
    pub(crate) fn dra(&self) -> PathBuf {
        self.plugins().join("gpu.fgpu.io/dra.sock")
    }
    pub(crate) fn state(&self) -> PathBuf {
        self.env.dir.join("state")
    }
    fn checkpoint(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.plugins().join("gpu.fgpu.io/checkpoint.json")).unwrap()).unwrap()
    }

    /// A stand-in for NVIDIA's spec (nvidia-ctk cdi generate) in the CDI directory: GPU 0
    /// under its UUID, GPU 1 under its index only.
    pub(crate) fn nvidia_spec(&self) {
        let sim = self.env.sim();
        let text = format!(
            "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n  - name: \"{}\"\n    containerEdits: {{env: [\"NVIDIA_GPU=0\"]}}\n  - name: \"1\"\n    containerEdits: {{env: [\"NVIDIA_GPU=1\"]}}\n",
            sim.device_uuid_string(0)
        );
        std::fs::write(self.cdi().join("nvidia.yaml"), text).unwrap();
    }

    fn plugin_command(&self, extra: &[&str]) -> (std::process::Command, PathBuf) {
        let dir = &self.env.dir;
        let n = std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("plugin-")).count();
        let log = dir.join(format!("plugin-{n}.log"));
        let mut cmd = self.env.command(plugin_bin()).env("FGPU_SHIM", front_path()).env("NODE_NAME", NODE).0;
        cmd.arg("--kubeconfig").arg(dir.join("kubeconfig"));
        cmd.arg("--cdi-root").arg(self.cdi());
        cmd.arg("--cdi-spec-dirs").arg(self.cdi());
        cmd.arg("--kubelet-registrar-directory-path").arg(self.registry());
        cmd.arg("--kubelet-plugins-directory-path").arg(self.plugins());
        cmd.arg("--state-dir").arg(self.state());
        cmd.arg("--fgpu").arg(fgpu_bin());
        cmd.args(extra);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        (cmd, log)
    }

    /// Starts the plugin and waits until kubelet registered it (GetInfo and
    /// NotifyRegistrationStatus through the registration socket).
    pub(crate) fn start(&self, extra: &[&str]) -> Plugin {
        self.start_with(extra, &[])
    }

    /// [`Node::start`] with environment variables set (another simulated GPU).
    pub(crate) fn start_with(&self, extra: &[&str], vars: &[(&str, String)]) -> Plugin {
        let (mut cmd, log) = self.plugin_command(extra);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut plugin = Plugin { child: cmd.spawn().unwrap(), log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = plugin.child.try_wait().unwrap() {
                panic!("the plugin exited ({status}) before it could be registered:\n{}", plugin.log());
            }
            if self.registration().exists() {
                match self.kubelet.register(&self.registration()) {
                    Ok(_) => return plugin,
                    Err(e) => assert!(Instant::now() < deadline, "kubelet could not register the plugin in 60 s: {e}\n{}", plugin.log()),
                }
            }
            assert!(Instant::now() < deadline, "the plugin made no registration socket in 60 s:\n{}", plugin.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn slice(&self, plugin: &Plugin, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        self.slice_within(plugin, what, Duration::from_secs(30), condition)
    }

    fn slice_within(&self, plugin: &Plugin, what: &str, within: Duration, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.api.slices().get(SLICE).filter(|s| condition(s)) {
                return s.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no ResourceSlice {what} in {} s: {:?}\nrequests: {:?}\n{}",
                within.as_secs(),
                self.api.slices(),
                self.api.log(),
                plugin.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn status(&self) -> Value {
        let run = Cmd(std::process::Command::new(plugin_bin())).args(["status", "--kubelet-plugins-directory-path"]).arg(self.plugins()).success();
        serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("status is not JSON ({e})\n{run}"))
    }
}

/// A Kubernetes quantity of bytes, as this test writes them (Ki, Mi, Gi or plain).
fn bytes_of(q: &Value) -> u64 {
    let text = q.as_str().unwrap_or_else(|| panic!("{q} is not a quantity string"));
    for (suffix, shift) in [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)] {
        if let Some(n) = text.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap() << shift;
        }
    }
    text.parse().unwrap()
}

/// The simulated driver's version string as pynvml reads it (nvmlSystemGetDriverVersion).
fn nvml_driver_version(env: &Env) -> Option<String> {
    let python = python_with("pynvml")?;
    let script = "import pynvml; pynvml.nvmlInit(); v = pynvml.nvmlSystemGetDriverVersion(); print(v.decode() if isinstance(v, bytes) else v)";
    Some(env.command(python).args(["-c", script]).success().stdout().trim().to_string())
}

/// Validates Kubernetes objects with kubernetes-validate against Kubernetes 1.34's schema,
/// strictly (no field the schema lacks), when the test venv has it.
fn validate_manifests(files: &[&Path]) {
    let Some(python) = python_with("kubernetes_validate") else { return };
    let run = Cmd(std::process::Command::new(python)).args(["-m", "kubernetes_validate", "--strict", "-k", "1.34.0"]).args(files).run();
    assert!(run.output.status.success(), "{run}");
    // A kind it has no schema for only warns: every object must have passed.
    let out = run.stdout() + &run.stderr();
    assert!(!out.contains("WARN") && !out.contains("ERROR") && out.contains("passed"), "{run}");
}

pub(crate) fn uid(n: u32) -> String {
    format!("8e2b7f0a-54c1-4c1b-9d68-{n:012}")
}

pub(crate) fn alloc<'a>(device: &'a str, memory: Option<&'a str>, compute: Option<&'a str>) -> Alloc<'a> {
    Alloc::new(NODE, device, memory, compute)
}

/// The spec file (in `dir`) of kind `kind` that defines device `name`, if any.
pub(crate) fn spec_defining(dir: &Path, kind: &str, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).find(|p| {
        let Ok(text) = std::fs::read_to_string(p) else { return false };
        let value: Value = if p.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).unwrap_or(Value::Null)
        } else {
            // The stand-in NVIDIA spec is the only YAML here: check it by text.
            return text.contains(&format!("kind: {kind}")) && text.contains(&format!("name: \"{name}\""));
        };
        value["kind"] == kind && value["devices"].as_array().is_some_and(|d| d.iter().any(|d| d["name"] == name))
    })
}

/// A shell script that mounts what a claim's spec asks for in a private mount namespace
/// (each bind mount, read-only where the spec says `ro`; the preload list names the
/// library where it is on this host), then runs `then`.
pub(crate) fn mounted_as_a_runtime_would(spec: &Path, then: &str) -> String {
    let spec: Value = serde_json::from_slice(&std::fs::read(spec).unwrap()).unwrap();
    let mut mounts: Vec<Value> = spec["containerEdits"]["mounts"].as_array().unwrap().clone();
    mounts.extend(spec["devices"][0]["containerEdits"]["mounts"].as_array().unwrap().iter().cloned());
    let mut script = String::from("set -e; mount -t tmpfs fgpu-test /run; ");
    for m in &mounts {
        let (host, container) = (m["hostPath"].as_str().unwrap(), m["containerPath"].as_str().unwrap());
        let ro = m["options"].as_array().unwrap().iter().any(|o| o == "ro");
        if container == "/etc/ld.so.preload" {
            // The host's copy of the library, at the path the preload list names.
            let lib = Path::new(host).parent().unwrap().join("lib/libfgpu.so");
            script.push_str(&format!("echo {} > /etc/ld.so.preload; ", lib.display()));
            continue;
        }
        if container == "/usr/lib/fgpu" || container.starts_with("/run/fgpu-service") {
            continue;
        }
        script.push_str(&format!("mkdir -p {container}; mount --bind {host} {container}; "));
        if ro {
            script.push_str(&format!("mount -o remount,bind,ro {container}; "));
        }
    }
    script.push_str("set +e; ");
    script.push_str(then);
    script
}

pub(crate) fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).mode() & 0o7777
}

/// kubelet's three ways of naming the plugin in `:authority`: each registers the plugin
/// and prepares and unprepares a claim through both sockets. h2 (under tonic) refuses the
/// first, grpc-go's percent-encoded socket path, unless the plugin's relay replaces it.
#[test]
fn dra_kubelet_registers_and_prepares_with_each_authority() {
    let Some(node) = Node::new("dra-authority", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "train", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), Some("30"))]), &["train-0"]));
    // Started and registered by a plain localhost client, so that a plugin that refuses
    // grpc-go's authority still gets to the calls below.
    let (cmd, log) = node.plugin_command(&[]);
    let mut cmd = cmd;
    let plugin = Plugin { child: cmd.spawn().unwrap(), log };
    let localhost = Kubelet::new(Authority::Localhost).unwrap();
    eventually("the plugin answers GetInfo", Duration::from_secs(60), || node.registration().exists() && localhost.register(&node.registration()).is_ok());
    let claim = [ClaimRef::new("ml", "train", &uid(1))];
    let mut failures = Vec::new();
    for authority in Authority::ALL {
        let kubelet = Kubelet::new(authority).unwrap();
        let t0 = Instant::now();
        let registered = kubelet.register(&node.registration());
        let seconds = t0.elapsed().as_secs_f64();
        eprintln!(
            "registration with {authority:?}: {} in {seconds:.2} s (the fake kubelet's Python start included)",
            if registered.is_ok() { "ok" } else { "FAILED" }
        );
        match registered {
            Ok(info) => assert_eq!(Path::new(info["endpoint"].as_str().unwrap()), node.dra(), "{info}"),
            Err(e) => {
                failures.push(format!("{authority:?}: registration: {e}"));
                continue;
            }
        }
        match kubelet.prepare(&node.dra(), &claim) {
            Ok(answer) => assert_eq!(answer[uid(1)]["error"], "", "{answer}"),
            Err(e) => failures.push(format!("{authority:?}: NodePrepareResources: {e}")),
        }
        match kubelet.unprepare(&node.dra(), &claim) {
            Ok(answer) => assert_eq!(answer[uid(1)]["error"], "", "{answer}"),
            Err(e) => failures.push(format!("{authority:?}: NodeUnprepareResources: {e}")),
        }
    }
    assert!(failures.is_empty(), "kubelet's calls failed:\n{}\n{}", failures.join("\n"), plugin.log());
    assert!(plugin.log().contains("served as \"localhost\""), "the relay says once what it replaced:\n{}", plugin.log());
    // The probe the DaemonSet runs goes the same way.
    let check = Cmd(std::process::Command::new(plugin_bin())).args(["check", "--kubelet-registrar-directory-path"]).arg(node.registry()).success();
    assert!(check.stdout().starts_with("ok: "), "{check}");
    drop(plugin);
    let check = Cmd(std::process::Command::new(plugin_bin())).args(["check", "--kubelet-registrar-directory-path"]).arg(node.registry()).run();
    assert!(!check.output.status.success(), "check passed with no plugin running\n{check}");
}

#[test]
fn dra_plugin_registers_publishes_the_gpus_and_prepares_capped_claims() {
    let Some(node) = Node::new("dra-main", 2, Gates::ALL) else { return };
    node.nvidia_spec();
    let sim = node.env.sim();
    let (u0, u1) = (sim.device_uuid_string(0), sim.device_uuid_string(1));
    let api = &node.api;
    api.add_claim(claim_json("ml", "train", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), Some("30"))]), &["train-0"]));
    api.add_claim(claim_json("ml", "whole", &uid(2), Some(&[alloc("gpu-1", None, None)]), &["whole-0"]));
    api.add_claim(claim_json("ml", "elsewhere", &uid(3), Some(&[alloc("gpu-7", Some("8Gi"), None)]), &["e-0"]));
    api.add_claim(claim_json("ml", "recreated", &uid(40), Some(&[alloc("gpu-0", Some("8Gi"), None)]), &["r-0"]));
    api.add_claim(claim_json("ml", "pending", &uid(6), None, &[]));
    // A prioritized list: the scheduler chose the subrequest `small` of request `gpu`.
    let small = Alloc { request: "gpu/small", ..alloc("gpu-0", Some("4Gi"), Some("10")) };
    api.add_claim(claim_json("ml", "listed", &uid(7), Some(&[small]), &["listed-0"]));
    // Admin access: a monitoring tool's claim.
    let admin = Alloc { admin: true, ..alloc("gpu-0", None, None) };
    api.add_claim(claim_json("ops", "monitor", &uid(8), Some(&[admin]), &["dcgm-0"]));
    let plugin = node.start(&[]);

    // Registration, as kubelet's plugin watcher does it.
    let info = node.kubelet.register(&node.registration()).unwrap();
    assert_eq!(
        info,
        json!({"type": "DRAPlugin", "name": "gpu.fgpu.io", "endpoint": node.dra().display().to_string(), "supportedVersions": ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]})
    );
    node.kubelet.notify(&node.registration(), false, "version mismatch").unwrap();

    // The slice, field by field, against the simulator's figures.
    let slice = node.slice(&plugin, "with two devices", |s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() == 2));
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(slice["metadata"]["ownerReferences"], json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": true}]));
    let spec = &slice["spec"];
    assert_eq!(spec["driver"], "gpu.fgpu.io");
    assert_eq!(spec["nodeName"], NODE);
    assert_eq!(spec["pool"], json!({"name": NODE, "generation": 1, "resourceSliceCount": 1}));
    let driver_version = nvml_driver_version(&node.env);
    for i in 0..2 {
        let d = &spec["devices"][i];
        let total = sim.device_total(i);
        assert_eq!(d["name"], format!("gpu-{i}"), "{d}");
        assert_eq!(d["allowMultipleAllocations"], true, "{d}");
        let a = &d["attributes"];
        assert_eq!(a["uuid"], json!({"string": sim.device_uuid_string(i)}), "{d}");
        assert_eq!(a["productName"], json!({"string": sim.device_name(i)}), "{d}");
        assert_eq!(a["index"], json!({"int": i}), "{d}");
        if let Some(v) = &driver_version {
            // Semantic versioning: three numbers, no leading zeros (535.104.05 is 535.104.5).
            let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap()).collect();
            parts.resize(3, 0);
            let expected = format!("{}.{}.{}", parts[0], parts[1], parts[2]);
            assert_eq!(a["driverVersion"], json!({"version": expected}), "NVML says {v}: {d}");
        }
        assert_eq!(a["cudaVersion"], json!({"version": format!("{}.{}.0", sim.driver_version() / 1000, sim.driver_version() % 1000 / 10)}), "{d}");
        let memory = &d["capacity"]["memory"];
        let offered = (total - RESERVE) / STEP * STEP;
        assert_eq!(bytes_of(&memory["value"]), offered, "the GPU's {total} bytes less 512 MiB, in 256 MiB steps: {d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["default"]), offered, "a claim naming no memory gets the whole GPU: {d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["validRange"]["min"]), STEP, "{d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["validRange"]["step"]), STEP, "{d}");
        let compute = &d["capacity"]["compute"];
        assert_eq!(compute["value"], "100", "{d}");
        assert_eq!(compute["requestPolicy"], json!({"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}), "{d}");
    }
    // The slice as written is a valid resource.k8s.io/v1 ResourceSlice of Kubernetes 1.34.
    let file = node.env.dir.join("slice.json");
    std::fs::write(&file, serde_json::to_vec(&slice).unwrap()).unwrap();
    validate_manifests(&[&file]);
    let status = node.status();
    assert_eq!((status["consumableCapacity"].as_str(), status["published"].clone()), (Some("on"), json!(["gpu-0", "gpu-1"])), "{status}");
    assert_eq!(status["registered"], false, "kubelet's last word: {status}");

    // Prepare: every claim of the request gets an entry, keyed by UID.
    let claims = [
        ClaimRef::new("ml", "train", &uid(1)),
        ClaimRef::new("ml", "whole", &uid(2)),
        ClaimRef::new("ml", "elsewhere", &uid(3)),
        ClaimRef::new("ml", "recreated", &uid(4)),
        ClaimRef::new("ml", "missing", &uid(5)),
        ClaimRef::new("ml", "pending", &uid(6)),
        ClaimRef::new("ml", "listed", &uid(7)),
        ClaimRef::new("ops", "monitor", &uid(8)),
    ];
    let answer = node.kubelet.prepare(&node.dra(), &claims).unwrap();
    let log = plugin.log();
    assert_eq!(answer.as_object().unwrap().len(), 8, "{answer}\n{log}");
    let train = &answer[uid(1)];
    let fgpu_train = format!("fgpu.io/gpu=claim-{}", uid(1));
    assert_eq!(
        *train,
        json!({"error": "", "devices": [{"requestNames": ["gpu"], "poolName": NODE, "deviceName": "gpu-0",
            "cdiDeviceIds": [format!("nvidia.com/gpu={u0}"), fgpu_train], "shareId": "5d1c6b1e-0000-4000-8000-000000000000"}]}),
        "NVIDIA's UUID name is preferred, and the allocation's shareID is passed on\n{log}"
    );
    let whole = &answer[uid(2)];
    assert_eq!(whole["error"], "", "{log}");
    assert_eq!(whole["devices"][0]["cdiDeviceIds"], json!(["nvidia.com/gpu=1", format!("fgpu.io/gpu=claim-{}", uid(2))]), "GPU 1 has only its index name");
    assert!(whole["devices"][0].get("shareId").is_none(), "no consumed capacity, no share: {whole}");
    let listed = &answer[uid(7)];
    assert_eq!(listed["error"], "", "{log}");
    assert_eq!(listed["devices"][0]["requestNames"], json!(["gpu"]), "containers name the request, not the subrequest: {listed}");
    let monitor = &answer[uid(8)];
    assert_eq!(monitor["error"], "", "{log}");
    assert_eq!(monitor["devices"][0]["cdiDeviceIds"], json!([format!("nvidia.com/gpu={u0}")]), "admin access: NVIDIA's device alone, uncapped: {monitor}");
    let refused = |u: u32, needle: &str| {
        let r = &answer[uid(u)];
        assert!(r["devices"].as_array().is_none_or(|d| d.is_empty()) && r["error"].as_str().unwrap().contains(needle), "claim {u}: {needle:?} in {r}");
    };
    refused(3, "device node-a/gpu-7 is not on this node (it has gpu-0, gpu-1)");
    refused(4, "has UID");
    refused(5, "does not exist");
    refused(6, "not allocated");

    // The IDs are defined by specs in the CDI directory.
    assert!(spec_defining(&node.cdi(), "nvidia.com/gpu", &u0).is_some());
    let train_spec = spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(1))).expect("the claim's spec is in --cdi-root");
    assert!(spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(2))).is_some());
    assert!(spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(7))).is_some());
    assert_eq!(std::fs::read_dir(node.cdi()).unwrap().count(), 4, "no spec for a refused claim or an admin's");
    let conf = |u: u32| std::fs::read_to_string(node.state().join(format!("claims/{}/config/fgpu.conf", uid(u)))).unwrap();
    let line = |text: &str, key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
    assert_eq!(line(&conf(1), "limit = ").as_deref(), Some(format!("{u0}=8G,*=1").as_str()), "{}", conf(1));
    assert_eq!(line(&conf(1), "compute = ").as_deref(), Some(format!("{u0}=30%").as_str()), "{}", conf(1));
    assert_eq!(
        line(&conf(2), "limit = ").as_deref(),
        Some(format!("{u1}={}G,*=1", sim.device_total(1) / GIB).as_str()),
        "no consumed capacity: the whole GPU\n{}",
        conf(2)
    );
    assert_eq!(line(&conf(2), "compute = "), None);
    assert_eq!(line(&conf(7), "limit = ").as_deref(), Some(format!("{u0}=4G,*=1").as_str()), "{}", conf(7));
    // The node's account, in the status: gpu-0 holds train (8Gi, 30) and listed (4Gi, 10).
    let status = node.status();
    let gpu0 = status["gpus"].as_array().unwrap().iter().find(|g| g["device"] == "gpu-0").unwrap().clone();
    assert_eq!((gpu0["memoryUsed"].as_u64(), gpu0["computeUsedMillipercent"].as_u64()), (Some(12 * GIB), Some(40_000)), "{status}");

    // The claim's files, mounted as a runtime would, cap a process at 8 GiB; the ledger is
    // the claim's host directory.
    let c = client("cuclient");
    let script = mounted_as_a_runtime_would(
        &train_spec,
        &format!(
            "C={c}; $C init primary info alloc 9G; FGPU_LIMIT=64G $C init primary alloc 7G; echo 'limit = 64G' >> /etc/fgpu/fgpu.conf || echo write-refused",
            c = c.display()
        ),
    );
    if let Some(cmd) = node.env.with_private_etc(&script) {
        let run = cmd.run();
        assert_eq!(run.field("info", "total"), (8 * GIB).to_string(), "{run}\n{}", plugin.log());
        assert_eq!(run.lines("alloc"), [format!("alloc {} rc=2", 9 * GIB), format!("alloc {} rc=0", 7 * GIB)], "{run}");
        assert!(run.stdout().contains("write-refused"), "{run}");
        assert!(node.state().join(format!("claims/{}/ledger/ledger", uid(1))).exists(), "the ledger lives in the claim's directory\n{run}");
    }

    // kubelet restarts: it deletes the node's slices, registers the plugin again, and
    // prepares its claims again. The answers are the same, from the checkpoint, without
    // asking the server; the slices come back.
    let claim_path = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train";
    let gets = api.count("GET", claim_path);
    assert_eq!(gets, 1);
    assert!(api.wipe(NODE) >= 1);
    node.kubelet.register(&node.registration()).unwrap();
    let again = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(again[uid(1)], *train);
    assert_eq!(api.count("GET", claim_path), gets);
    node.slice_within(&plugin, "back after kubelet's wipe", Duration::from_secs(10), |_| true);

    // A restarted plugin (after a reboot that took /var/run/cdi) answers the same, and
    // writes the spec again at start.
    let log = plugin.kill();
    std::fs::remove_file(&train_spec).unwrap();
    // Files of a claim the checkpoint does not know (the plugin stopped before it saved it).
    let orphan = uid(9);
    std::fs::write(node.cdi().join(format!("fgpu-claim-{orphan}.json")), "{}").unwrap();
    std::fs::create_dir_all(node.state().join(format!("claims/{orphan}/config"))).unwrap();
    let plugin = node.start(&[]);
    assert!(train_spec.exists(), "the restarted plugin did not restore the spec\n{log}\n{}", plugin.log());
    // They are kept (a running pod may read them) until kubelet unprepares the claim.
    assert!(node.cdi().join(format!("fgpu-claim-{orphan}.json")).exists(), "{}", plugin.log());
    assert!(plugin.log().contains(&format!("not in the checkpoint are kept until kubelet unprepares them: {orphan}")), "{}", plugin.log());
    let answer = node.kubelet.unprepare(&node.dra(), &[ClaimRef::new("ml", "orphan", &orphan)]).unwrap();
    assert_eq!(answer[&orphan]["error"], "");
    assert!(!node.cdi().join(format!("fgpu-claim-{orphan}.json")).exists(), "{}", plugin.log());
    assert!(!node.state().join(format!("claims/{orphan}")).exists(), "{}", plugin.log());
    let restarted = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(restarted[uid(1)], *train, "{}", plugin.log());

    // Unprepare: every claim gets an entry, and the claims' files go.
    let prepared = [claims[0].clone(), claims[1].clone(), claims[2].clone(), claims[6].clone(), claims[7].clone()];
    let answer = node.kubelet.unprepare(&node.dra(), &prepared).unwrap();
    assert_eq!(answer.as_object().unwrap().len(), 5, "{answer}");
    assert!(answer.as_object().unwrap().values().all(|r| r["error"] == ""), "{answer}\n{}", plugin.log());
    assert_eq!(std::fs::read_dir(node.cdi()).unwrap().count(), 1, "only NVIDIA's spec is left");
    assert!(!node.state().join(format!("claims/{}", uid(1))).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&node.env.dir.display().to_string()), "a ledger tmpfs is still mounted:\n{mounts}");
    assert_eq!(node.checkpoint()["claims"], json!({}));
    // Unpreparing again is not an error; prepared anew, the claim is read from the server again.
    let answer = node.kubelet.unprepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "");
    let gets = api.count("GET", claim_path);
    let answer = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(answer[uid(1)], *train);
    assert_eq!(api.count("GET", claim_path), gets + 1);
    node.kubelet.unprepare(&node.dra(), &claims[..1]).unwrap();
}
