//! fgpu-kubelet-plugin, the DRA driver `gpu.fgpu.io`, without a cluster: a fake kubelet
//! (gRPC over the plugin's sockets) and a stub API server on 127.0.0.1 named in a
//! kubeconfig (tests/support/dra.rs), against the simulated driver. The slices are checked
//! field by field against the simulator's own figures; a claim's CDI files are mounted as a
//! runtime mounts them and cap a process. The same devices in real podman containers are
//! tests/cdi/test.sh.

use fgpu_tests::dra::{claim_json, Alloc, ClaimRef, Kubelet, StubApi};
use fgpu_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

const NODE: &str = "node-a";
const NODE_UID: &str = "2c4a3a4e-9f0e-4d5e-8d0a-6f1b8e0c1d2f";
const RESERVE: u64 = 512 * MIB;
const STEP: u64 = 256 * MIB;

fn plugin_bin() -> PathBuf {
    let path = release_dir().join("fgpu-kubelet-plugin");
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// One node: its simulated GPUs (`env`), the API server, and the plugin's directories.
struct Node {
    env: Env,
    api: StubApi,
    kubelet: Kubelet,
}

/// A running plugin; killed when dropped. Its log is kept for failure messages.
struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn new(name: &str, gpus: u32) -> Node {
        let env = Env::new(name).devices(gpus);
        let api = StubApi::start();
        api.add_node(NODE, NODE_UID);
        api.kubeconfig(&env.dir.join("kubeconfig"));
        std::fs::create_dir_all(env.dir.join("cdi")).unwrap();
        Node { env, api, kubelet: Kubelet::new() }
    }

    fn cdi(&self) -> PathBuf {
        self.env.dir.join("cdi")
    }
    fn registration(&self) -> PathBuf {
        self.env.dir.join("registry/gpu.fgpu.io-reg.sock")
    }
    fn dra(&self) -> PathBuf {
        self.env.dir.join("plugins/gpu.fgpu.io/dra.sock")
    }
    fn state(&self) -> PathBuf {
        self.env.dir.join("state")
    }
    fn checkpoint(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.env.dir.join("plugins/gpu.fgpu.io/checkpoint.json")).unwrap()).unwrap()
    }

    /// A stand-in for NVIDIA's spec (nvidia-ctk cdi generate) in the CDI directory: GPU 0
    /// under its UUID, GPU 1 under its index only.
    fn nvidia_spec(&self) {
        let sim = self.env.sim();
        let text = format!(
            "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n  - name: \"{}\"\n    containerEdits: {{env: [\"NVIDIA_GPU=0\"]}}\n  - name: \"1\"\n    containerEdits: {{env: [\"NVIDIA_GPU=1\"]}}\n",
            sim.device_uuid_string(0)
        );
        std::fs::write(self.cdi().join("nvidia.yaml"), text).unwrap();
    }

    /// Starts the plugin and waits until kubelet could register it.
    fn start(&self, extra: &[&str]) -> Plugin {
        self.start_with(extra, &[])
    }

    /// [`Node::start`] with environment variables set (another simulated GPU).
    fn start_with(&self, extra: &[&str], vars: &[(&str, String)]) -> Plugin {
        let dir = &self.env.dir;
        let n = std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("plugin-")).count();
        let log = dir.join(format!("plugin-{n}.log"));
        let mut cmd = self.env.command(plugin_bin()).env("FGPU_SHIM", front_path()).env("NODE_NAME", NODE).0;
        cmd.arg("--kubeconfig").arg(dir.join("kubeconfig"));
        cmd.arg("--cdi-root").arg(self.cdi());
        cmd.arg("--cdi-spec-dirs").arg(self.cdi());
        cmd.arg("--kubelet-registrar-directory-path").arg(dir.join("registry"));
        cmd.arg("--kubelet-plugins-directory-path").arg(dir.join("plugins"));
        cmd.arg("--state-dir").arg(self.state());
        cmd.arg("--fgpu").arg(fgpu_bin());
        cmd.args(extra);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        let mut plugin = Plugin { child: cmd.spawn().unwrap(), log };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = plugin.child.try_wait().unwrap() {
                panic!("the plugin exited ({status}) before it could be registered:\n{}", plugin.log());
            }
            if self.kubelet.get_info(&self.registration()).is_ok() {
                return plugin;
            }
            assert!(std::time::Instant::now() < deadline, "the plugin did not answer GetInfo in 30 s:\n{}", plugin.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn slice(&self, plugin: &Plugin, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.api.slices().get("node-a-gpu.fgpu.io").filter(|s| condition(s)) {
                return s.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no ResourceSlice {what} in 30 s: {:?}\nrequests: {:?}\n{}",
                self.api.slices(),
                self.api.log(),
                plugin.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

/// The simulated driver's version string as pynvml reads it (nvmlSystemGetDriverVersion),
/// when the test venv is there.
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

fn uid(n: u32) -> String {
    format!("8e2b7f0a-54c1-4c1b-9d68-{n:012}")
}

/// The spec file (in `dir`) of kind `kind` that defines device `name`, if any.
fn spec_defining(dir: &Path, kind: &str, name: &str) -> Option<PathBuf> {
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
fn mounted_as_a_runtime_would(spec: &Path, then: &str) -> String {
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

#[test]
fn dra_plugin_registers_publishes_the_gpus_and_prepares_capped_claims() {
    let node = Node::new("dra-main", 2);
    node.env.client(&["init"]).success();
    node.nvidia_spec();
    let sim = node.env.sim();
    let (u0, u1) = (sim.device_uuid_string(0), sim.device_uuid_string(1));
    let api = &node.api;
    let alloc = |device, memory, compute| [Alloc { request: "gpu", pool: NODE, device, memory, compute }];
    api.add_claim(claim_json("ml", "train", &uid(1), Some(&alloc("gpu-0", Some("8Gi"), Some("30"))), &["train-0"]));
    api.add_claim(claim_json("ml", "whole", &uid(2), Some(&alloc("gpu-1", None, None)), &["whole-0"]));
    api.add_claim(claim_json("ml", "elsewhere", &uid(3), Some(&alloc("gpu-7", Some("8Gi"), None)), &["e-0"]));
    api.add_claim(claim_json("ml", "recreated", &uid(40), Some(&alloc("gpu-0", Some("8Gi"), None)), &["r-0"]));
    api.add_claim(claim_json("ml", "pending", &uid(6), None, &[]));
    let plugin = node.start(&[]);

    // Registration, as kubelet's plugin watcher does it.
    let info = node.kubelet.get_info(&node.registration()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.fgpu.io");
    assert_eq!(Path::new(&info.endpoint), node.dra());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    node.kubelet.notify(&node.registration(), true, "").unwrap();
    node.kubelet.notify(&node.registration(), false, "version mismatch").unwrap();

    // The slice, field by field, against the simulator's figures.
    let slice = node.slice(&plugin, "with two devices", |s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() == 2));
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(
        slice["metadata"]["ownerReferences"],
        serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": true}])
    );
    let spec = &slice["spec"];
    assert_eq!(spec["driver"], "gpu.fgpu.io");
    assert_eq!(spec["nodeName"], NODE);
    assert_eq!(spec["pool"], serde_json::json!({"name": NODE, "generation": 1, "resourceSliceCount": 1}));
    let driver_version = nvml_driver_version(&node.env);
    for i in 0..2 {
        let d = &spec["devices"][i];
        let total = sim.device_total(i);
        assert_eq!(d["name"], format!("gpu-{i}"), "{d}");
        assert_eq!(d["allowMultipleAllocations"], true, "{d}");
        let a = &d["attributes"];
        assert_eq!(a["uuid"], serde_json::json!({"string": sim.device_uuid_string(i)}), "{d}");
        assert_eq!(a["productName"], serde_json::json!({"string": sim.device_name(i)}), "{d}");
        assert_eq!(a["index"], serde_json::json!({"int": i}), "{d}");
        if let Some(v) = &driver_version {
            // Semantic versioning: three numbers, no leading zeros (535.104.05 is 535.104.5).
            let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap()).collect();
            parts.resize(3, 0);
            let expected = format!("{}.{}.{}", parts[0], parts[1], parts[2]);
            assert_eq!(a["driverVersion"], serde_json::json!({"version": expected}), "NVML says {v}: {d}");
        }
        assert_eq!(a["cudaVersion"], serde_json::json!({"version": format!("{}.{}.0", sim.driver_version() / 1000, sim.driver_version() % 1000 / 10)}), "{d}");
        let memory = &d["capacity"]["memory"];
        let offered = (total - RESERVE) / STEP * STEP;
        assert_eq!(bytes_of(&memory["value"]), offered, "the GPU's {total} bytes less 512 MiB, in 256 MiB steps: {d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["default"]), offered, "a claim naming no memory gets the whole GPU: {d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["validRange"]["min"]), STEP, "{d}");
        assert_eq!(bytes_of(&memory["requestPolicy"]["validRange"]["step"]), STEP, "{d}");
        let compute = &d["capacity"]["compute"];
        assert_eq!(compute["value"], "100", "{d}");
        assert_eq!(compute["requestPolicy"], serde_json::json!({"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}), "{d}");
    }

    // The slice as written is a valid resource.k8s.io/v1 ResourceSlice of Kubernetes 1.34.
    let file = node.env.dir.join("slice.json");
    std::fs::write(&file, serde_json::to_vec(&slice).unwrap()).unwrap();
    validate_manifests(&[&file]);

    // Prepare: every claim of the request gets an entry, keyed by UID.
    let claims = [
        ClaimRef::new("ml", "train", &uid(1)),
        ClaimRef::new("ml", "whole", &uid(2)),
        ClaimRef::new("ml", "elsewhere", &uid(3)),
        ClaimRef::new("ml", "recreated", &uid(4)),
        ClaimRef::new("ml", "missing", &uid(5)),
        ClaimRef::new("ml", "pending", &uid(6)),
    ];
    let answer = node.kubelet.prepare(&node.dra(), &claims).unwrap();
    let log = plugin.log();
    assert_eq!(answer.claims.len(), 6, "{answer:?}\n{log}");
    let train = &answer.claims[&uid(1)];
    assert_eq!(train.error, "", "{log}");
    assert_eq!(train.devices.len(), 1);
    let d = &train.devices[0];
    assert_eq!((d.request_names.as_slice(), d.pool_name.as_str(), d.device_name.as_str()), (["gpu".to_string()].as_slice(), NODE, "gpu-0"));
    let fgpu_train = format!("fgpu.io/gpu=claim-{}", uid(1));
    assert_eq!(d.cdi_device_ids, [format!("nvidia.com/gpu={u0}"), fgpu_train.clone()], "NVIDIA's UUID name is preferred");
    let whole = &answer.claims[&uid(2)];
    assert_eq!(whole.error, "", "{log}");
    assert_eq!(whole.devices[0].cdi_device_ids, ["nvidia.com/gpu=1".to_string(), format!("fgpu.io/gpu=claim-{}", uid(2))], "GPU 1 has only its index name");
    let refused = |u: u32, needle: &str| {
        let r = &answer.claims[&uid(u)];
        assert!(r.devices.is_empty() && r.error.contains(needle), "claim {u}: {needle:?} in {r:?}");
    };
    refused(3, "device node-a/gpu-7 is not on this node (it has gpu-0, gpu-1)");
    refused(4, "has UID");
    refused(5, "does not exist");
    refused(6, "not allocated");

    // The IDs are defined by specs in the CDI directory.
    assert!(spec_defining(&node.cdi(), "nvidia.com/gpu", &u0).is_some());
    let train_spec = spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(1))).expect("the claim's spec is in --cdi-root");
    assert!(spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(2))).is_some());
    assert_eq!(std::fs::read_dir(node.cdi()).unwrap().count(), 3, "no spec for a refused claim");
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

    // Preparing again answers the same, from the checkpoint, without asking the server.
    let claim_path = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train";
    let gets = api.count("GET", claim_path);
    assert_eq!(gets, 1);
    let again = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(again.claims[&uid(1)], *train);
    assert_eq!(api.count("GET", claim_path), gets);

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
    assert_eq!(answer.claims[&orphan].error, "");
    assert!(!node.cdi().join(format!("fgpu-claim-{orphan}.json")).exists(), "{}", plugin.log());
    assert!(!node.state().join(format!("claims/{orphan}")).exists(), "{}", plugin.log());
    let restarted = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(restarted.claims[&uid(1)], *train, "{}", plugin.log());
    assert_eq!(api.count("GET", claim_path), gets, "{}", plugin.log());

    // Unprepare: every claim gets an entry, and the claims' files go.
    let answer = node.kubelet.unprepare(&node.dra(), &claims[..3]).unwrap();
    assert_eq!(answer.claims.len(), 3, "{answer:?}");
    assert!(answer.claims.values().all(|r| r.error.is_empty()), "{answer:?}\n{}", plugin.log());
    assert_eq!(std::fs::read_dir(node.cdi()).unwrap().count(), 1, "only NVIDIA's spec is left");
    assert!(!node.state().join(format!("claims/{}", uid(1))).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&node.env.dir.display().to_string()), "a ledger tmpfs is still mounted:\n{mounts}");
    assert_eq!(node.checkpoint()["claims"], serde_json::json!({}));
    // Unpreparing again is not an error.
    let answer = node.kubelet.unprepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(answer.claims[&uid(1)].error, "");
    // Prepared anew, the claim is read from the server again.
    let answer = node.kubelet.prepare(&node.dra(), &claims[..1]).unwrap();
    assert_eq!(answer.claims[&uid(1)], *train);
    assert_eq!(api.count("GET", claim_path), gets + 1);
    node.kubelet.unprepare(&node.dra(), &claims[..1]).unwrap();
}

#[test]
fn dra_slice_follows_the_gpus_and_the_server() {
    let node = Node::new("dra-slices", 2);
    node.env.client(&["init"]).success();
    // A slice this driver wrote for this node under another name, and others' slices.
    {
        let mut state = node.api.state.lock().unwrap();
        for (name, driver, node_name) in
            [("node-a-old", "gpu.fgpu.io", NODE), ("node-a-nvidia", "gpu.nvidia.com", NODE), ("node-b-gpu.fgpu.io", "gpu.fgpu.io", "node-b")]
        {
            state.slices.insert(
                name.into(),
                serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name, "resourceVersion": "1"},
                    "spec": {"driver": driver, "nodeName": node_name, "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1}, "devices": []}}),
            );
        }
        // The node cannot be read at first: the slice is published without an owner.
        state.nodes_status = Some(403);
    }
    let plugin = node.start(&["--resync-interval", "1"]);
    let first = node.slice(&plugin, "published", |_| true);
    assert!(first["metadata"].get("ownerReferences").is_none(), "{first}");
    assert_eq!(first["spec"]["pool"]["generation"], 1);
    eventually("the stale slice of this driver and node is deleted", Duration::from_secs(30), || !node.api.slices().contains_key("node-a-old"));
    assert!(node.api.slices().contains_key("node-a-nvidia") && node.api.slices().contains_key("node-b-gpu.fgpu.io"), "others' slices are kept");

    // Once the node can be read, the slice gets its owner (a new generation).
    node.api.state.lock().unwrap().nodes_status = None;
    let owned = node.slice(&plugin, "with an owner", |s| s["metadata"]["ownerReferences"][0]["uid"] == NODE_UID);
    assert_eq!(owned["spec"]["pool"]["generation"], 2, "{owned}");

    // Deleted (as kubelet wipes a driver's slices when it goes away), it comes back.
    node.api.state.lock().unwrap().slices.remove("node-a-gpu.fgpu.io");
    let back = node.slice(&plugin, "published again", |_| true);
    assert_eq!(back["spec"]["devices"].as_array().unwrap().len(), 2);

    // The GPUs change (here: the plugin starts again on a host with one 40 GiB GPU): the
    // same slice is replaced, with the next generation.
    drop(plugin);
    let generation = back["spec"]["pool"]["generation"].as_i64().unwrap();
    let sim = [("FGPU_SIM_STATE", node.env.dir.join("sim-one-gpu").display().to_string()), ("FGPU_SIM_DEVICES", "1".into()), ("FGPU_SIM_MEMORY", "40G".into())];
    let plugin = node.start_with(&["--resync-interval", "1"], &sim);
    let one = node.slice(&plugin, "with one device", |s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() == 1));
    assert_eq!(one["spec"]["pool"]["generation"], generation + 1, "{one}");
    assert_eq!(bytes_of(&one["spec"]["devices"][0]["capacity"]["memory"]["value"]), (40 * GIB - RESERVE) / STEP * STEP, "{one}");
    assert_eq!(one["metadata"]["uid"], back["metadata"]["uid"], "replaced, not created anew");
    // Nothing watched: the stub's watch would have given an empty stream.
    assert!(node.api.log().iter().all(|l| !l.url.contains("watch")), "{:?}", node.api.log());
}

#[test]
fn dra_slice_is_written_when_the_server_cannot_read_it_back() {
    let node = Node::new("dra-slice-blind", 1);
    node.env.client(&["init"]).success();
    node.api.state.lock().unwrap().slice_get_status = Some(500);
    let plugin = node.start(&["--resync-interval", "1"]);
    let created = node.slice(&plugin, "created without a GET", |_| true);
    assert_eq!(created["spec"]["devices"].as_array().unwrap().len(), 1);
    // The next rounds find it there (POST: 409) and replace it, never with a lower generation.
    let replaced = node.slice(&plugin, "replaced", |s| s["spec"]["pool"]["generation"].as_i64() > created["spec"]["pool"]["generation"].as_i64());
    assert_eq!(replaced["metadata"]["uid"], created["metadata"]["uid"], "{replaced}");
    assert!(plugin.log().contains("writing it anyway"), "{}", plugin.log());
}

#[test]
fn dra_claim_is_one_cap_for_a_pod_and_refused_to_a_second_pod() {
    let node = Node::new("dra-share", 1);
    node.env.client(&["init"]).success();
    node.nvidia_spec();
    let alloc = [Alloc { request: "gpu", pool: NODE, device: "gpu-0", memory: Some("8Gi"), compute: None }];
    node.api.add_claim(claim_json("ml", "shared", &uid(7), Some(&alloc), &["pod-a", "pod-b"]));
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "shared", &uid(7))]).unwrap();
    assert_eq!(answer.claims[&uid(7)].error, "", "{}", plugin.log());
    assert!(plugin.log().contains("is reserved for 2 pods (pod-a, pod-b)"), "{}", plugin.log());
    let spec = node.cdi().join(format!("fgpu-claim-{}.json", uid(7)));

    // Pod A's first container holds 5 GiB; its second container (same IPC namespace, same
    // ledger directory) shares the 8 GiB; pod B (an IPC namespace of its own) is refused.
    let then = format!(
        "C={c}; $C init primary alloc 5G sleep 5000 > holder.out 2>&1 & \
         for i in $(seq 200); do grep -q '^alloc .* rc=0' holder.out && break; sleep 0.05; done; cat holder.out; \
         $C init primary alloc 3G | sed 's/^/same-pod /'; $C init primary alloc 2G | sed 's/^/same-pod /'; \
         unshare --ipc $C init primary alloc 1G 2>&1 | sed 's/^/other-pod /'; kill %1; wait",
        c = client("cuclient").display()
    );
    let Some(cmd) = node.env.with_private_etc(&mounted_as_a_runtime_would(&spec, &then)) else { return };
    let run = cmd.run();
    assert_eq!(run.lines("alloc"), [format!("alloc {} rc=0", 5 * GIB)], "{run}");
    assert_eq!(run.lines("same-pod alloc"), [format!("same-pod alloc {} rc=2", 3 * GIB), format!("same-pod alloc {} rc=0", 2 * GIB)], "{run}");
    let other: Vec<String> = run.lines("other-pod");
    assert!(!other.iter().any(|l| l.starts_with("other-pod alloc") && l.ends_with("rc=0")), "a second pod got memory beside the first:\n{run}");
    assert!(other.iter().any(|l| l.contains("another IPC namespace")), "the second pod is not told why:\n{run}");
    node.kubelet.unprepare(&node.dra(), &[ClaimRef::new("ml", "shared", &uid(7))]).unwrap();
}

#[test]
fn dra_manifests_are_valid_kubernetes_1_34_and_ask_what_the_docs_say() {
    let dir = workspace().join("deploy/kubernetes");
    let files = [dir.join("fgpu-dra-driver.yaml"), dir.join("examples/claim-template.yaml"), dir.join("examples/deployment.yaml")];
    validate_manifests(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    let Some(python) = python_with("yaml") else { return };
    let script = r#"
import sys, yaml
docs = {}
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        docs[(d["kind"], d["metadata"]["name"])] = d
dc = docs[("DeviceClass", "gpu.fgpu.io")]
assert dc["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "gpu.fgpu.io"', dc
tpl = docs[("ResourceClaimTemplate", "gpu-8gi-30pct")]
req = tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]
assert req["deviceClassName"] == "gpu.fgpu.io" and req["capacity"]["requests"] == {"memory": "8Gi", "compute": "30"}, req
dep = docs[("Deployment", "inference")]["spec"]["template"]["spec"]
assert dep["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu-8gi-30pct"}], dep
assert all(c["resources"]["claims"] == [{"name": "gpu"}] for c in dep["containers"]), dep
ds = docs[("DaemonSet", "fgpu-kubelet-plugin")]["spec"]["template"]["spec"]
c = ds["containers"][0]
assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"], c["env"]
mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
for path in ["/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi", "/etc/cdi", "/var/lib/fgpu/dra"]:
    assert path in mounts, path
assert mounts["/var/lib/fgpu/dra"]["mountPropagation"] == "Bidirectional"
assert c["securityContext"]["privileged"] is True
rules = docs[("ClusterRole", "fgpu-kubelet-plugin")]["rules"]
allowed = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
for need in [("", "nodes", "get"), ("resource.k8s.io", "resourceclaims", "get"), ("resource.k8s.io", "resourceslices", "create"),
             ("resource.k8s.io", "resourceslices", "update"), ("resource.k8s.io", "resourceslices", "get")]:
    assert need in allowed, need
assert not any(v == "watch" for (_, _, v) in allowed), "the plugin never watches"
print("ok")
"#;
    let run = Cmd(std::process::Command::new(python)).args(["-c", script]).args(&files).run();
    assert_eq!(run.stdout().trim(), "ok", "{run}");
}
