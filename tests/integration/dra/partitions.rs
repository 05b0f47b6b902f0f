//! MIG partitions published (docs/kubernetes.md, "MIG partitions: what is published"): the
//! plugin on a simulated A100 80GB in MIG mode with `--mig-gpus all`. The slices the stub
//! API server stored (so within its limits) are checked against the simulator's own profile
//! table, and a stub of the scheduler's allocator allocates from them as the scheduler does:
//! two 3g.40gb side by side, never a 4g.40gb or the whole GPU beside them, a fraction of a
//! partition beside another claim on it. On a server without DRAPartitionableDevices, the
//! GPU is published whole, said once.

use super::{Node, Plugin, NODE, NODE_UID};
use fgpu_sim_state::mig::Product;
use fgpu_sim_state::{SimConfig, SimState};
use fgpu_tests::dra::allocator::{allocate, Ask};
use fgpu_tests::dra::{Authority, Gates, Kubelet, StubApi};
use fgpu_tests::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A node whose one GPU is a simulated A100 80GB in MIG mode, and an API server of
/// Kubernetes 1.`minor` with `gates`.
fn mig_node(name: &str, gates: Gates, minor: u32) -> Option<Node> {
    let kubelet = Kubelet::new(Authority::GrpcGo)?;
    let env = Env::new(name);
    SimState::open_with(&env.sim_state, &SimConfig { devices: 1, product: Product::A100_80GB, mig: 1, ..SimConfig::default() }).unwrap();
    let api = StubApi::with_gates(gates);
    api.state.lock().unwrap().minor = minor;
    api.add_node(NODE, NODE_UID);
    api.kubeconfig(&env.dir.join("kubeconfig"));
    std::fs::create_dir_all(env.dir.join("cdi")).unwrap();
    Some(Node { env, api, kubelet })
}

/// The pool's slices once `ready` holds for them (all of them, at one generation).
fn pool(node: &Node, plugin: &Plugin, what: &str, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let slices: Vec<Value> = node.api.slices().into_values().collect();
        let count = slices.first().and_then(|s| s.pointer("/spec/pool/resourceSliceCount")).and_then(Value::as_u64).unwrap_or(0) as usize;
        if slices.len() == count && ready(&slices) {
            return slices;
        }
        assert!(Instant::now() < deadline, "no pool {what} in 30 s: {slices:?}\n{}", plugin.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn devices(slices: &[Value]) -> Vec<Value> {
    slices.iter().flat_map(|s| s.pointer("/spec/devices").and_then(Value::as_array).cloned().unwrap_or_default()).collect()
}

fn counter_sets(slices: &[Value]) -> Vec<Value> {
    slices.iter().flat_map(|s| s.pointer("/spec/sharedCounters").and_then(Value::as_array).cloned().unwrap_or_default()).collect()
}

/// The memory slices a device consumes.
fn memory_slices(device: &Value) -> Vec<u32> {
    let counters = &device["consumesCounters"][0]["counters"];
    (0..8).filter(|i| counters.get(format!("memory-slice-{i}")).is_some()).collect()
}

fn ask<'a>(attributes: &[(&'a str, Value)], memory: Option<&'a str>) -> Ask<'a> {
    Ask { attributes: attributes.to_vec(), memory, compute: None }
}

#[test]
fn dra_partitions_are_published_with_counters_and_never_allocated_overlapping() {
    let Some(node) = mig_node("dra-partitions", Gates::ALL, 36) else { return };
    let plugin = node.start(&["--mig-gpus", "all"]);
    let slices = pool(&node, &plugin, "with partitions", |s| devices(s).iter().any(|d| d["name"].as_str().is_some_and(|n| n.contains("-mig-"))));
    // 1.36: the counter set in a slice of its own.
    let sets = counter_sets(&slices);
    assert_eq!(sets.len(), 1, "{slices:?}");
    assert!(slices.iter().all(|s| s["spec"].get("sharedCounters").is_none() || s["spec"].get("devices").is_none()), "{slices:?}");
    let set = &sets[0]["counters"];
    // The ground truth: the simulator's profile table for this product.
    let profiles = Product::A100_80GB.gi_profiles();
    let whole = profiles.iter().max_by_key(|p| p.memory_slices).unwrap();
    assert_eq!(set["memory"]["value"], (whole.memory_mib << 20).to_string());
    assert_eq!(set["multiprocessors"]["value"], whole.sms.to_string());
    assert_eq!((0..8).filter(|i| set[format!("memory-slice-{i}")]["value"] == "1").count(), 8, "{set}");
    let all = devices(&slices);
    let placements: usize = profiles.iter().map(|p| p.placement_starts().len()).sum();
    assert_eq!(all.len(), 1 + placements, "the whole GPU and every placement: {:?}", all.iter().map(|d| &d["name"]).collect::<Vec<_>>());
    let uuid = node.env.sim().device_uuid_string(0);
    for p in profiles {
        for &start in p.placement_starts() {
            let name = format!("gpu-0-mig-{}-{start}", p.name.replace(['.', '+'], "-"));
            let d = all.iter().find(|d| d["name"] == name.as_str()).unwrap_or_else(|| panic!("no {name}"));
            assert_eq!(d["attributes"]["profile"]["string"], p.name);
            assert_eq!(d["attributes"]["parentUUID"]["string"], uuid.as_str());
            assert_eq!(memory_slices(d), (start..start + p.memory_slices).collect::<Vec<_>>(), "{name}");
            let used = &d["consumesCounters"][0]["counters"];
            assert_eq!(
                (used["memory"]["value"].as_str(), used["multiprocessors"]["value"].as_str()),
                (Some((p.memory_mib << 20).to_string().as_str()), Some(p.sms.to_string().as_str())),
                "{name}"
            );
            assert_eq!(d["allowMultipleAllocations"], true, "both gates kept: a partition is shareable");
        }
    }
    let gpu0 = all.iter().find(|d| d["name"] == "gpu-0").unwrap();
    assert_eq!(memory_slices(gpu0), (0..8).collect::<Vec<_>>());
    assert!(gpu0.get("allowMultipleAllocations").is_none());

    // The scheduler's view: counters taken once per partition, capacity per claim.
    let mig = |profile: &str, start: Option<u32>| {
        let mut a = vec![("type", json!("mig")), ("profile", json!(profile))];
        if let Some(s) = start {
            a.push(("placementStart", json!(s)));
        }
        a
    };
    let got = |n: &str, a: &Ask| allocate(&node.api, NODE, "ml", n, &format!("uid-{n}"), a);
    assert_eq!(got("a", &ask(&mig("3g.40gb", Some(0)), Some("20Gi"))).unwrap(), "gpu-0-mig-3g-40gb-0");
    assert_eq!(got("b", &ask(&mig("3g.40gb", Some(4)), None)).unwrap(), "gpu-0-mig-3g-40gb-4");
    let refused = got("c", &ask(&mig("4g.40gb", None), None)).unwrap_err();
    assert!(refused.contains("gpu-0-mig-4g-40gb-0: insufficient counter"), "{refused}");
    let refused = got("d", &ask(&[("type", json!("gpu"))], None)).unwrap_err();
    assert!(refused.contains("gpu-0: insufficient counter"), "{refused}");
    assert_eq!(got("e", &ask(&mig("3g.40gb", Some(0)), Some("4Gi"))).unwrap(), "gpu-0-mig-3g-40gb-0", "a fraction beside claim a");
    let claim = node.api.state.lock().unwrap().claims[&("ml".to_string(), "e".to_string())].clone();
    assert_eq!(claim.pointer("/status/allocation/devices/results/0/consumedCapacity/memory"), Some(&json!((4u64 << 30).to_string())), "{claim}");
    let refused = got("f", &ask(&mig("3g.40gb", None), Some("20Gi"))).unwrap_err();
    assert!(refused.contains("gpu-0-mig-3g-40gb-0: insufficient capacity") && refused.contains("gpu-0-mig-3g-40gb-4: insufficient capacity"), "{refused}");
    let status = node.status();
    assert_eq!(status["partitionableDevices"], "on", "{status}");
}

#[test]
fn dra_partitions_on_1_34_share_a_slice_with_their_counters_and_without_the_gate_the_gpu_is_whole() {
    let Some(node) = mig_node("dra-partitions-134", Gates::ALL, 34) else { return };
    let plugin = node.start(&["--mig-gpus", "0"]);
    let slices = pool(&node, &plugin, "with partitions beside their counters", |s| !counter_sets(s).is_empty());
    assert_eq!(slices.len(), 1, "one GPU: one slice, its counter set and its devices");
    let set = slices[0]["spec"]["sharedCounters"][0]["name"].as_str().unwrap().to_string();
    assert!(devices(&slices).iter().filter(|d| d["name"] != "gpu-0").all(|d| d["consumesCounters"][0]["counterSet"] == set.as_str()));
    assert!(allocate(&node.api, NODE, "ml", "a", "uid-a", &ask(&[("profile", json!("7g.80gb"))], None)).is_ok());
    assert!(allocate(&node.api, NODE, "ml", "b", "uid-b", &ask(&[("profile", json!("1g.10gb"))], None)).is_err());
    drop(plugin);

    let off = Gates { partitionable_devices: false, ..Gates::ALL };
    let Some(node) = mig_node("dra-partitions-off", off, 36) else { return };
    let plugin = node.start(&["--mig-gpus", "all", "--resync-interval", "1"]);
    let slices = pool(&node, &plugin, "with gpu-0", |s| !devices(s).is_empty());
    let names: Vec<Value> = devices(&slices).iter().map(|d| d["name"].clone()).collect();
    assert_eq!(names, [json!("gpu-0")], "{slices:?}");
    assert!(counter_sets(&slices).is_empty() && devices(&slices)[0].get("consumesCounters").is_none());
    // Three more looks: the line is said once.
    std::thread::sleep(Duration::from_secs(3));
    let log = plugin.log();
    assert_eq!(log.matches("DRAPartitionableDevices is off").count(), 1, "{log}");
    let status = node.status();
    assert_eq!(status["partitionableDevices"], "off", "{status}");
    assert!(status["partitionableDevicesReason"].as_str().unwrap().contains("published whole"), "{status}");
}
