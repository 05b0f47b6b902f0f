//! What the plugin publishes as the GPUs and the server change: slices that follow the
//! GPUs and the server through the watch, whole GPUs once where DRAConsumableCapacity is
//! off, flags that leave no GPU refused, and the manifests as Kubernetes 1.34 reads them.

use super::*;

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

#[test]
fn dra_manifests_are_valid_kubernetes_1_34_and_ask_what_the_docs_say() {
    let dir = workspace().join("deploy/kubernetes");
    let files = [dir.join("fgpu-dra-driver.yaml"), dir.join("examples/claim-template.yaml"), dir.join("examples/deployment.yaml")];
    validate_manifests(&files.iter().map(PathBuf::as_path).chain([dir.join("examples/mig.yaml").as_path()]).collect::<Vec<_>>());
    let Some(python) = python_with("yaml") else { return };
    let run = Cmd(std::process::Command::new(python)).arg(workspace().join("tests/python/dra_manifests.py")).args(&files).run();
    assert_eq!(run.stdout().trim(), "ok", "{run}");
}
