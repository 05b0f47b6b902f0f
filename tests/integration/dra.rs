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

/// Device health and metrics.
mod health;
/// MIG partitions created at prepare, destroyed at unprepare.
mod mig_prepare;
/// MIG partitions published, and allocated by a stub of the scheduler's allocator.
mod partitions;

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

/// The slices follow the GPUs and the server: strays removed, the owner set once the Node
/// can be read, slices deleted or changed by someone else put back within seconds through
/// the watch (the periodic look is an hour away), also after the watch was cut; and the
/// plugin asks the API server for exactly what its ClusterRole grants.
#[test]
fn dra_slices_follow_the_gpus_and_the_server_through_the_watch() {
    let Some(node) = Node::new("dra-slices", 2, Gates::ALL) else { return };
    node.nvidia_spec();
    // Slices this driver wrote for this node under another name or pool, and others' slices.
    {
        let mut state = node.api.state.lock().unwrap();
        for (name, driver, node_name, pool) in [
            ("node-a-gpu.fgpu.io", "gpu.fgpu.io", NODE, NODE),
            ("node-a-old-pool", "gpu.fgpu.io", NODE, "node-a-old"),
            ("node-a-nvidia", "gpu.nvidia.com", NODE, NODE),
            ("node-b-gpu.fgpu.io-0", "gpu.fgpu.io", "node-b", "node-b"),
        ] {
            state.slices.insert(
                name.into(),
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name, "resourceVersion": "1", "generation": 1},
                    "spec": {"driver": driver, "nodeName": node_name, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []}}),
            );
        }
        // The node cannot be read at first: the slice is published without an owner.
        state.nodes_status = Some(403);
        // A server that stores a dry run's slice all the same.
        state.ignore_dry_run = true;
    }
    node.api.add_claim(claim_json("ml", "train", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), Some("30"))]), &["train-0"]));
    let plugin = node.start(&["--resync-interval", "3600"]);
    let first = node.slice(&plugin, "published", |_| true);
    assert!(first["metadata"].get("ownerReferences").is_none(), "{first}");
    // Above the stray of the same pool (generation 1), which the scheduler then ignores
    // until it is gone.
    assert_eq!(first["spec"]["pool"]["generation"], 2);
    eventually("the strays of this driver and node are deleted", Duration::from_secs(30), || {
        let s = node.api.slices();
        !s.contains_key("node-a-gpu.fgpu.io") && !s.contains_key("node-a-old-pool")
    });
    assert!(node.api.slices().contains_key("node-a-nvidia") && node.api.slices().contains_key("node-b-gpu.fgpu.io-0"), "others' slices are kept");
    // The dry run's slice, stored by this server, is deleted, and no dry run is made again.
    eventually("the dry run's slice is deleted", Duration::from_secs(30), || !node.api.slices().keys().any(|k| k.contains("-probe-")));
    assert!(plugin.log().contains("stored the slice of a dry run"), "{}", plugin.log());
    assert_eq!(node.api.count("POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun"), 1);

    // Deleted by someone else (one slice), it is back within seconds, with the Node as its
    // owner now that the Node can be read.
    node.api.state.lock().unwrap().nodes_status = None;
    let t0 = Instant::now();
    node.api.state.lock().unwrap().delete_slices(&format!("metadata.name={SLICE}"));
    let back = node.slice_within(&plugin, "back after a deletion", Duration::from_secs(10), |_| true);
    eprintln!("a deleted slice was back in {:.2} s", t0.elapsed().as_secs_f64());
    assert_eq!(back["metadata"]["ownerReferences"][0]["uid"], NODE_UID, "{back}");
    // Changed by someone else: set right.
    {
        let mut state = node.api.state.lock().unwrap();
        let mut changed = state.slices[SLICE].clone();
        changed["spec"]["devices"].as_array_mut().unwrap().pop();
        let v = 9000;
        changed["metadata"]["resourceVersion"] = v.to_string().into();
        state.slices.insert(SLICE.into(), changed);
        state.cut_watches();
    }
    // The watch was cut as well: it is started again (after a list), which finds the change.
    let fixed =
        node.slice_within(&plugin, "set right after a change", Duration::from_secs(15), |s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() == 2));
    assert!(fixed["spec"]["pool"]["generation"].as_i64() > back["spec"]["pool"]["generation"].as_i64(), "{fixed}");
    // kubelet's wipe at its start (DeleteCollection of the node's slices).
    let t0 = Instant::now();
    assert_eq!(node.api.wipe(NODE), 2, "this driver's slice and NVIDIA's");
    node.slice_within(&plugin, "back after kubelet's wipe", Duration::from_secs(10), |_| true);
    eprintln!("the wiped slice was back in {:.2} s", t0.elapsed().as_secs_f64());
    // A server that cannot list slices: they are read by name, and set right all the same.
    node.api.state.lock().unwrap().slice_list_status = Some(500);
    node.api.state.lock().unwrap().delete_slices(&format!("metadata.name={SLICE}"));
    node.slice_within(&plugin, "back while slices cannot be listed", Duration::from_secs(10), |_| true);
    let writes = node.api.slice_writes();
    node.api.state.lock().unwrap().cut_watches();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node.api.slice_writes(), writes, "written again while nothing changed: {:?}", node.api.log());
    node.api.state.lock().unwrap().slice_list_status = None;
    // A claim prepared, for the RBAC check below.
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "train", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "", "{answer}");
    // Then nothing more is written: the slice is as it should be.
    let writes = node.api.slice_writes();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node.api.slice_writes(), writes, "{:?}", node.api.log());

    // Everything the plugin asked, as (API group, resource, verb), is what its ClusterRole
    // grants, and all of it.
    let mut asked = std::collections::BTreeSet::new();
    for l in node.api.log() {
        let path = l.url.split('?').next().unwrap();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, resource, named) = match parts.as_slice() {
            ["api", "v1", "nodes", _] => ("", "nodes", true),
            ["apis", "resource.k8s.io", "v1", "namespaces", _, "resourceclaims", _] => ("resource.k8s.io", "resourceclaims", true),
            ["apis", "resource.k8s.io", "v1", "resourceslices"] => ("resource.k8s.io", "resourceslices", false),
            ["apis", "resource.k8s.io", "v1", "resourceslices", _] => ("resource.k8s.io", "resourceslices", true),
            _ => panic!("the plugin asked for {} {}", l.method, l.url),
        };
        let verb = match (l.method.as_str(), named) {
            ("GET", true) => "get",
            ("GET", false) if l.url.contains("watch=true") => "watch",
            ("GET", false) => "list",
            ("POST", false) => "create",
            ("PUT", true) => "update",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => "patch",
        };
        asked.insert(format!("{group}/{resource}/{verb}"));
    }
    let Some(python) = python_with("yaml") else { return };
    let script = "import sys, yaml, json\nrules = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'ClusterRole'][0]['rules']\nprint(json.dumps(sorted({g + '/' + r + '/' + v for rule in rules for g in rule['apiGroups'] for r in rule['resources'] for v in rule['verbs']})))";
    let run = Cmd(std::process::Command::new(python)).args(["-c", script]).arg(workspace().join("deploy/kubernetes/fgpu-dra-driver.yaml")).success();
    let granted: std::collections::BTreeSet<String> = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(asked, granted, "what the plugin asked, and what its ClusterRole grants");
}

/// An API server without DRAConsumableCapacity (1.34 and 1.35 by default) drops the
/// fields: the plugin publishes whole GPUs once, says so, and never rewrites the slice; a
/// claim then has its GPU alone. The plugin reads NVML from a driver root.
#[test]
fn dra_without_consumable_capacity_publishes_whole_gpus_once() {
    let Some(node) = Node::new("dra-no-gate", 1, Gates::V1_34) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "whole", &uid(1), Some(&[alloc("gpu-0", None, None)]), &["a-0"]));
    node.api.add_claim(claim_json("ml", "second", &uid(2), Some(&[alloc("gpu-0", None, None)]), &["b-0"]));
    // The driver's libraries under a driver root, as the DaemonSet mounts the host's, and not
    // on the library path.
    let root = node.env.dir.join("driver-root");
    let libs = root.join("usr/lib64");
    std::fs::create_dir_all(&libs).unwrap();
    for lib in ["libnvidia-ml.so.1", "libcuda.so.1"] {
        std::os::unix::fs::symlink(sim_lib_dir().join(lib), libs.join(lib)).unwrap();
    }
    let (mut cmd, log) = node.plugin_command(&["--resync-interval", "1", "--driver-root"]);
    cmd.arg(&root).env_remove("LD_LIBRARY_PATH");
    let plugin = Plugin { child: cmd.spawn().unwrap(), log };
    eventually("kubelet registers the plugin", Duration::from_secs(60), || node.registration().exists() && node.kubelet.register(&node.registration()).is_ok());
    let slice = node.slice(&plugin, "published", |_| true);
    let d = &slice["spec"]["devices"][0];
    assert!(d.get("allowMultipleAllocations").is_none(), "{d}");
    assert_eq!(
        d["capacity"],
        json!({"compute": {"value": "100"}, "memory": {"value": format!("{}Mi", (node.env.sim().device_total(0) - RESERVE) / STEP * STEP / MIB)}})
    );
    let writes = node.api.slice_writes();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(node.api.slice_writes(), writes, "the slice is written again and again: {:?}\n{}", node.api.log(), plugin.log());
    assert_eq!(writes, 1, "one write: {:?}", node.api.log());
    let said = plugin.log();
    assert_eq!(said.matches("DRAConsumableCapacity is off").count(), 1, "said once:\n{said}");
    let status = node.status();
    assert_eq!(status["consumableCapacity"], "off", "{status}");
    assert!(status["consumableCapacityReason"].as_str().unwrap().contains("drops allowMultipleAllocations and requestPolicy"), "{status}");
    // The GPU goes to one claim at a time: a second allocation of it (which the scheduler
    // would not make) is refused on the node, with the reason.
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "whole", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "", "{answer}\n{}", plugin.log());
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "second", &uid(2))]).unwrap();
    assert!(answer[uid(2)]["error"].as_str().unwrap().contains("held whole by ResourceClaim ml/whole"), "{answer}");
}

/// Flags that leave no GPU are refused at start, with the reason.
#[test]
fn dra_flags_that_leave_no_gpu_are_refused() {
    let Some(node) = Node::new("dra-flags", 1, Gates::ALL) else { return };
    // 80 GiB less 512 MiB is one step of 40 GiB: below min + step (80 GiB).
    let (mut cmd, log) = node.plugin_command(&["--memory-step", "40Gi"]);
    let mut plugin = Plugin { child: cmd.spawn().unwrap(), log };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = plugin.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the plugin runs with flags that leave no GPU:\n{}", plugin.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = plugin.log();
    assert!(!status.success(), "{said}");
    assert!(said.contains("--memory-reserve 512Mi and --memory-step 40Gi leave no GPU to publish"), "{said}");
    assert!(node.api.slice_writes() == 0);
}

/// kubelet prepares different pods' claims at once: none waits for another's API call. The
/// node's own account refuses what would pass a GPU's capacity, counting a claim once.
#[test]
fn dra_prepares_concurrently_within_each_gpus_capacity() {
    let Some(node) = Node::new("dra-concurrent", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    const N: u32 = 16;
    for i in 0..N {
        node.api.add_claim(claim_json("ml", &format!("c{i}"), &uid(100 + i), Some(&[alloc("gpu-0", Some("4Gi"), Some("5"))]), &["p"]));
    }
    // What is left after 16 x 4 GiB: 81408 - 65536 = 15872 MiB; 16 GiB does not fit.
    node.api.add_claim(claim_json("ml", "big", &uid(200), Some(&[alloc("gpu-0", Some("16Gi"), None)]), &["big-0"]));
    node.api.add_claim(claim_json("ml", "busy", &uid(201), Some(&[alloc("gpu-0", Some("1Gi"), Some("25"))]), &["busy-0"]));
    node.api.add_claim(claim_json("ml", "shared", &uid(202), Some(&[alloc("gpu-0", Some("15Gi"), Some("20"))]), &["s-0", "s-1"]));
    let plugin = node.start(&[]);
    // Each claim's GET takes 1 s: sixteen in a row would take 16 s.
    node.api.state.lock().unwrap().claim_delay = Duration::from_secs(1);
    let claims: Vec<ClaimRef> = (0..N).map(|i| ClaimRef::new("ml", &format!("c{i}"), &uid(100 + i))).collect();
    let answer = node.kubelet.prepare_concurrently(&node.dra(), &claims).unwrap();
    assert_eq!(answer["errors"], json!({}), "{answer}");
    for c in &claims {
        assert_eq!(answer["claims"][&c.uid]["error"], "", "{answer}\n{}", plugin.log());
    }
    let in_flight = node.api.state.lock().unwrap().claims_in_flight_max;
    eprintln!("16 concurrent prepares: the slowest took {:.2} s; {in_flight} claim reads were in flight at once", answer["slowest"].as_f64().unwrap());
    assert!(in_flight >= 8, "the plugin read at most {in_flight} claims at once:\n{answer}");
    node.api.state.lock().unwrap().claim_delay = Duration::ZERO;
    let err = |name: &str, u: u32| {
        let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", name, &uid(u))]).unwrap();
        answer[uid(u)]["error"].as_str().unwrap().to_string()
    };
    let big = err("big", 200);
    assert!(big.contains("consume 64Gi of its 81408Mi memory capacity, and this claim asks 16Gi more"), "{big}");
    let busy = err("busy", 201);
    assert!(busy.contains("consume 80 of its 100 compute, and this claim asks 25 more"), "{busy}");
    // A claim of two pods, prepared for each: once, and counted once.
    assert_eq!(err("shared", 202), "");
    assert_eq!(err("shared", 202), "");
    let status = node.status();
    assert_eq!(status["gpus"][0]["memoryUsed"].as_u64(), Some(64 * GIB + 15 * GIB), "{status}");
    assert_eq!(status["gpus"][0]["computeUsedMillipercent"].as_u64(), Some(100_000), "{status}");
    assert_eq!(status["gpus"][0]["claims"].as_array().unwrap().len(), 17, "{status}");
}

/// Claims deleted while the plugin was down are unprepared when it starts, only where the
/// API server says they are gone (404, or another claim of the name); one the server
/// cannot read now stays prepared.
#[test]
fn dra_claims_gone_while_the_plugin_was_down_are_cleaned_up_on_404_only() {
    let Some(node) = Node::new("dra-gone", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    for (i, name) in ["deleted", "recreated", "unreadable", "kept"].iter().enumerate() {
        node.api.add_claim(claim_json("ml", name, &uid(i as u32), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    }
    let plugin = node.start(&[]);
    let refs: Vec<ClaimRef> = ["deleted", "recreated", "unreadable", "kept"].iter().enumerate().map(|(i, n)| ClaimRef::new("ml", n, &uid(i as u32))).collect();
    let answer = node.kubelet.prepare(&node.dra(), &refs).unwrap();
    assert!(answer.as_object().unwrap().values().all(|r| r["error"] == ""), "{answer}");
    drop(plugin);
    node.api.remove_claim("ml", "deleted");
    node.api.add_claim(claim_json("ml", "recreated", &uid(99), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    node.api.state.lock().unwrap().claim_refusals.insert(("ml".into(), "unreadable".into()), 500);
    let plugin = node.start(&[]);
    eventually("the claims that are gone are unprepared", Duration::from_secs(30), || node.checkpoint()["claims"].as_object().unwrap().len() == 2);
    let left: Vec<String> = node.checkpoint()["claims"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(left, [uid(2), uid(3)], "{}", plugin.log());
    assert!(!node.cdi().join(format!("fgpu-claim-{}.json", uid(0))).exists() && !node.state().join(format!("claims/{}", uid(1))).exists());
    assert!(node.cdi().join(format!("fgpu-claim-{}.json", uid(2))).exists(), "kept on an API error");
    assert!(
        plugin.log().contains("no longer exists") && plugin.log().contains("is another claim now") && plugin.log().contains("it stays prepared"),
        "{}",
        plugin.log()
    );
}

/// Nobody but root reaches a claim's files: another user of the node can neither list nor
/// open, lock or create anything under them; the sockets, the checkpoint and the status are
/// root's alone; directories an earlier release left 0755 are set right.
#[test]
fn dra_claim_files_are_out_of_other_users_reach() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to act as another user") {
        return;
    }
    let Some(node) = Node::new("dra-private", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "train", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), None)]), &["p"]));
    // An earlier release's tree: claims/ and a claim's directory 0755.
    let old = node.state().join(format!("claims/{}", uid(5)));
    std::fs::create_dir_all(old.join("config")).unwrap();
    for dir in [node.state().join("claims"), old.clone()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "train", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "", "{answer}\n{}", plugin.log());
    let claim = node.state().join(format!("claims/{}", uid(1)));
    // The ledger's files, as the plugin made them, and a process of the claim that holds
    // the ledger's memory file.
    let socket = claim.join("config/ledger.sock");
    let mut member = node
        .env
        .command(client("cuclient"))
        .env("FGPU_LEDGER", claim.join("ledger/ledger"))
        .env("FGPU_LEDGER_SOCKET", &socket)
        .env("FGPU_LIMIT", "1G")
        .shim()
        .args(["init", "primary", "alloc", "1M", "hold"])
        .spawn();
    member.wait_for("holding");
    assert_eq!(mode(&claim.join("ledger/ledger")), 0o666, "every process of the claim, as any user, locks it");
    assert_eq!(mode(&socket), 0o666, "every process of the claim, as any user, asks it");
    assert_eq!(mode(&node.state().join("claims")), 0o700);
    assert_eq!(mode(&claim), 0o700);
    assert_eq!(mode(&old), 0o700, "an earlier release's 0755 is set right");
    assert_eq!(mode(&node.registration()), 0o600);
    assert_eq!(mode(&node.dra()), 0o600);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io")), 0o700);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io/checkpoint.json")), 0o600);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io/status.json")), 0o600);
    // Another user (nobody) tries.
    let ledger = claim.join("ledger/ledger");
    let attacks = format!(
        "ls {claims} >/dev/null 2>&1 && echo listed; cat {conf} >/dev/null 2>&1 && echo read-config; \
         cat {ledger} >/dev/null 2>&1 && echo opened-ledger; flock -n {ledger} true 2>/dev/null && echo locked-ledger; \
         touch {dir}/intruder 2>/dev/null && echo created; ls {dir} >/dev/null 2>&1 && echo listed-ledger; echo done",
        claims = node.state().join("claims").display(),
        conf = claim.join("config/fgpu.conf").display(),
        ledger = ledger.display(),
        dir = claim.join("ledger").display()
    );
    let run = node.env.command_as(65534, "sh").args(["-c", &attacks]).run();
    assert_eq!(run.stdout().trim(), "done", "another user reached a claim's files\n{run}");
    // The served ledger: its keeper's socket, and the memory file a process of the claim
    // holds (taken with pidfd_getfd, or reopened through /proc).
    let reach = format!(
        r#"
import ctypes, os, socket
try:
    s = socket.socket(socket.AF_UNIX); s.connect({socket:?}); print("connected-to-the-keeper")
except OSError as e: print("socket", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, {pid}, 0)
if pidfd >= 0 and any(libc.syscall(438, pidfd, n, 0) >= 0 for n in range(256)): print("took-a-descriptor")
try:
    for n in os.listdir("/proc/{pid}/fd"):
        os.open("/proc/{pid}/fd/" + n, os.O_RDONLY); print("reopened-a-descriptor"); break
except OSError as e: print("proc", e.errno)
print("done")
"#,
        socket = socket.display().to_string(),
        pid = member.pid()
    );
    let Some(python) = python_with("ctypes") else { return };
    let run = node.env.command_as(65534, &python).args(["-c", &reach]).run();
    let out = run.stdout();
    assert!(
        out.contains("done") && !out.contains("connected") && !out.contains("took") && !out.contains("reopened"),
        "another user reached the claim's ledger\n{run}"
    );
    assert!(out.contains(&format!("socket {}", libc::EACCES)), "the socket is out of reach (claims/ is root's alone)\n{run}");
    member.kill(libc::SIGKILL);
}

/// SIGTERM: the calls in flight finish, kubelet's registration socket goes first, prepared
/// claims stay prepared.
#[test]
fn dra_stops_gracefully() {
    let Some(node) = Node::new("dra-stop", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "slow", &uid(1), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    node.api.add_claim(claim_json("ml", "done", &uid(2), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "done", &uid(2))]).unwrap();
    assert_eq!(answer[uid(2)]["error"], "");
    node.api.state.lock().unwrap().claim_delay = Duration::from_secs(3);
    let (dra, python) = (node.dra(), python_with("grpc").unwrap());
    let claims = json!([{"namespace": "ml", "name": "slow", "uid": uid(1)}]).to_string();
    let in_flight =
        std::thread::spawn(move || Cmd(std::process::Command::new(python)).arg(fgpu_tests::dra::fake_kubelet()).args(["prepare"]).arg(&dra).arg(&claims).run());
    eventually("the prepare is in flight", Duration::from_secs(20), || node.api.state.lock().unwrap().claims_in_flight == 1);
    let (code, log) = plugin.terminate(Duration::from_secs(30));
    let run = in_flight.join().unwrap();
    assert_eq!(code, Some(0), "{log}");
    let answer: Value = serde_json::from_str(run.stdout().trim()).unwrap_or(Value::Null);
    assert_eq!(answer["claims"][uid(1)]["error"], "", "the call in flight was cut\n{run}\n{log}");
    assert!(!node.registration().exists(), "kubelet's registration socket stays\n{log}");
    assert!(node.cdi().join(format!("fgpu-claim-{}.json", uid(1))).exists() && node.cdi().join(format!("fgpu-claim-{}.json", uid(2))).exists(), "{log}");
    assert!(log.contains("prepared claims stay prepared"), "{log}");
}

#[test]
fn dra_manifests_are_valid_kubernetes_1_34_and_ask_what_the_docs_say() {
    let dir = workspace().join("deploy/kubernetes");
    let files = [dir.join("fgpu-dra-driver.yaml"), dir.join("examples/claim-template.yaml"), dir.join("examples/deployment.yaml")];
    validate_manifests(&files.iter().map(PathBuf::as_path).chain([dir.join("examples/mig.yaml").as_path()]).collect::<Vec<_>>());
    let Some(python) = python_with("yaml") else { return };
    let run = Cmd(std::process::Command::new(python)).arg(workspace().join("tests/python/dra_manifests.py")).args(&files).run();
    assert_eq!(run.stdout().trim(), "ok", "{run}");
}
