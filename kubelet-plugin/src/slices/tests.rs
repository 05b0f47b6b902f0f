use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const POLICY: MemoryPolicy = MemoryPolicy { reserve: 512 * MIB, step: 256 * MIB };
const WHOLE: Features = Features::NONE;

fn gpu(index: u32, total: u64) -> GpuInfo {
    GpuInfo { index, uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"), product: "NVIDIA H100 80GB HBM3".into(), total }
}

#[test]
fn memory_is_the_gpu_less_the_reserve_rounded_down_to_the_step() {
    assert_eq!(POLICY.capacity(80 * GIB), 80 * GIB - 512 * MIB);
    assert_eq!(POLICY.capacity(81559 * MIB), (81559 - 512) / 256 * 256 * MIB);
    assert_eq!(POLICY.capacity(600 * MIB), 0);
    assert_eq!(MemoryPolicy { reserve: 0, step: 0 }.capacity(1000), 1000);
}

#[test]
fn a_gpu_below_min_plus_step_is_left_out_with_the_reason() {
    // 1 GiB less 512 MiB is 512 MiB: exactly min + step, which the server takes.
    assert_eq!(POLICY.refusal(GIB), None);
    // 1 GiB - 1 byte leaves 256 MiB: one step only.
    let why = POLICY.refusal(GIB - 1).unwrap();
    assert!(why.contains("256Mi") && why.contains("min + step (512Mi)") && why.contains("--memory-reserve 512Mi"), "{why}");
    let (devices, left) = devices(&[gpu(0, 80 * GIB), gpu(1, 700 * MIB)], &DriverInfo::default(), &POLICY, Features::ALL);
    assert_eq!(devices.len(), 1);
    assert_eq!((left.len(), left[0].index), (1, 1));
}

#[test]
fn each_gpu_is_a_shareable_device_with_memory_and_compute() {
    let driver = DriverInfo { driver_version: Some("535.104.05".into()), cuda_version: Some(12080) };
    let (devices, _) = devices(&[gpu(0, 80 * GIB), gpu(1, 24 * GIB), gpu(2, 256 * MIB)], &driver, &POLICY, Features::ALL);
    let json = serde_json::to_value(&devices).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2, "a GPU smaller than the reserve is left out: {json}");
    let d = &json[0];
    assert_eq!(d["name"], "gpu-0");
    assert_eq!(d["allowMultipleAllocations"], true);
    assert_eq!(d["attributes"]["uuid"]["string"], "GPU-00000000-0000-0000-0000-000000000000");
    assert_eq!(d["attributes"]["productName"]["string"], "NVIDIA H100 80GB HBM3");
    assert_eq!(d["attributes"]["index"]["int"], 0);
    assert_eq!(d["attributes"]["driverVersion"]["version"], "535.104.5");
    assert_eq!(d["attributes"]["cudaVersion"]["version"], "12.8.0");
    assert_eq!(d["capacity"]["memory"]["value"], "81408Mi");
    assert_eq!(d["capacity"]["memory"]["requestPolicy"]["default"], "81408Mi");
    assert_eq!(d["capacity"]["memory"]["requestPolicy"]["validRange"], serde_json::json!({"min": "256Mi", "step": "256Mi"}));
    assert_eq!(d["capacity"]["compute"]["value"], "100");
    assert_eq!(d["capacity"]["compute"]["requestPolicy"]["default"], "0");
    assert_eq!(d["capacity"]["compute"]["requestPolicy"]["validRange"], serde_json::json!({"min": "0", "max": "100", "step": "1"}));
    assert_eq!(json[1]["capacity"]["memory"]["value"], "24064Mi");
    assert_eq!(json[1]["attributes"]["index"]["int"], 1);
}

#[test]
fn without_consumable_capacity_each_gpu_is_whole() {
    let (devices, _) = devices(&[gpu(0, 80 * GIB)], &DriverInfo::default(), &POLICY, WHOLE);
    let d = serde_json::to_value(&devices[0]).unwrap();
    assert!(d.get("allowMultipleAllocations").is_none(), "{d}");
    assert_eq!(d["capacity"], serde_json::json!({"compute": {"value": "100"}, "memory": {"value": "81408Mi"}}));
}

#[test]
fn the_pool_is_packed_into_slices_within_the_apis_limits() {
    let many = |n: u32| devices(&(0..n).map(|i| gpu(i, 80 * GIB)).collect::<Vec<_>>(), &DriverInfo::default(), &POLICY, Features::ALL).0;
    assert_eq!(pack(Vec::new(), Vec::new()).len(), 1, "an empty pool is one empty slice");
    assert_eq!(pack(many(8), Vec::new()).iter().map(|s| s.devices.len()).collect::<Vec<_>>(), [8]);
    assert_eq!(pack(many(130), Vec::new()).iter().map(|s| s.devices.len()).collect::<Vec<_>>(), [128, 2]);
    // Devices that consume counters: 64 a slice, and the counters in a slice of their own.
    let mut counted = many(70);
    for d in &mut counted {
        d.consumes_counters = Some(vec![k8s_openapi::api::resource::v1::DeviceCounterConsumption { counter_set: "gpu-0".into(), counters: BTreeMap::new() }]);
    }
    let sets = vec![CounterSet { name: "gpu-0".into(), counters: BTreeMap::new() }];
    let packed = pack(counted, sets);
    assert_eq!(packed.iter().map(|s| (s.shared_counters.len(), s.devices.len())).collect::<Vec<_>>(), [(1, 0), (0, 64), (0, 6)]);
    let s = serde_json::to_value(slice("n", None, 0, 3, packed[0].clone(), 1)).unwrap();
    assert!(s["spec"].get("devices").is_none() && s["spec"]["sharedCounters"].is_array(), "{s}");
}

#[test]
fn a_slice_names_its_pool_node_and_owner() {
    let s = serde_json::to_value(slice("node-a", Some("0a1b"), 1, 2, SliceContent::default(), 3)).unwrap();
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(s["kind"], "ResourceSlice");
    assert_eq!(s["metadata"]["name"], "node-a-gpu.fgpu.io-1");
    assert_eq!(
        s["metadata"]["ownerReferences"][0],
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "0a1b", "controller": true})
    );
    assert_eq!(s["spec"]["driver"], "gpu.fgpu.io");
    assert_eq!(s["spec"]["nodeName"], "node-a");
    assert_eq!(s["spec"]["pool"], serde_json::json!({"name": "node-a", "generation": 3, "resourceSliceCount": 2}));
    let s = serde_json::to_value(slice("node-a", None, 0, 1, SliceContent::default(), 1)).unwrap();
    assert!(s["metadata"].get("ownerReferences").is_none());
}

#[test]
fn long_node_names_give_valid_distinct_slice_names() {
    let a = "a".repeat(253);
    let b = format!("{}b", "a".repeat(252));
    assert!(slice_name(&a, 0).len() <= 253 && slice_name(&b, 0).len() <= 253);
    assert_ne!(slice_name(&a, 0), slice_name(&b, 0));
    assert_ne!(slice_name(&a, 0), slice_name(&a, 1));
    assert!(slice_name(&a, 12).ends_with("-gpu.fgpu.io-12"));
}

#[test]
fn versions() {
    assert_eq!(semver("570.26").as_deref(), Some("570.26.0"));
    assert_eq!(semver("535.104.05").as_deref(), Some("535.104.5"));
    assert_eq!(semver("580.65.06").as_deref(), Some("580.65.6"));
    assert_eq!(semver("r570"), None);
    assert_eq!(semver("1.2.3.4"), None);
    assert_eq!(cuda_semver(12080).as_deref(), Some("12.8.0"));
    assert_eq!(cuda_semver(11080).as_deref(), Some("11.8.0"));
    assert_eq!(cuda_semver(0), None);
}

#[test]
fn device_names_map_back_to_indexes() {
    assert_eq!(device_index(&device_name(7)), Some(7));
    for bad in ["gpu-", "gpu-07", "gpu-x", "gpu0", "mig-1", "gpu-99999999999"] {
        assert_eq!(device_index(bad), None, "{bad}");
    }
}

fn desired(features: Features) -> ResourceSlice {
    let (d, _) = devices(&[gpu(0, 80 * GIB)], &DriverInfo::default(), &POLICY, features);
    slice("n", Some("u"), 0, 1, SliceContent { devices: d, shared_counters: Vec::new() }, 4)
}

#[test]
fn an_unchanged_slice_is_the_same_whatever_the_server_added() {
    let desired = desired(Features::ALL);
    let mut existing = serde_json::to_value(&desired).unwrap();
    existing["metadata"]["resourceVersion"] = "17".into();
    existing["metadata"]["uid"] = "x".into();
    existing["spec"]["pool"]["generation"] = 9.into();
    existing["spec"]["devices"][0]["attributes"]["extra"] = serde_json::json!({"bool": true});
    assert!(same(&existing, &desired));
    let mut changed = existing.clone();
    changed["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi".into();
    assert!(!same(&changed, &desired));
    let mut fewer = existing.clone();
    fewer["spec"]["devices"] = serde_json::json!([]);
    assert!(!same(&fewer, &desired));
    let mut no_owner = existing.clone();
    no_owner["metadata"].as_object_mut().unwrap().remove("ownerReferences");
    assert!(!same(&no_owner, &desired));
    let mut count = existing.clone();
    count["spec"]["pool"]["resourceSliceCount"] = 2.into();
    assert!(!same(&count, &desired));
}

#[test]
fn whole_gpus_are_not_the_same_as_a_stored_shareable_slice() {
    // A slice stored while the cluster kept the fields, and now whole GPUs are wanted.
    let stored = serde_json::to_value(desired(Features::ALL)).unwrap();
    assert!(!same(&stored, &desired(WHOLE)));
    assert!(same(&serde_json::to_value(desired(WHOLE)).unwrap(), &desired(WHOLE)));
}

#[test]
fn dropped_fields_name_their_gate() {
    let sent = serde_json::to_value(desired(Features::ALL)).unwrap();
    assert!(dropped(&sent, &sent).is_empty());
    let mut stored = sent.clone();
    let device = stored["spec"]["devices"][0].as_object_mut().unwrap();
    device.remove("allowMultipleAllocations");
    for cap in device["capacity"].as_object_mut().unwrap().values_mut() {
        cap.as_object_mut().unwrap().remove("requestPolicy");
    }
    assert_eq!(dropped(&sent, &stored), BTreeSet::from([CONSUMABLE_CAPACITY]));
    let probe = feature_probe("node-a");
    assert_eq!(probe["metadata"], serde_json::json!({"generateName": "node-a-gpu.fgpu.io-probe-"}));
    assert_eq!(probe["spec"]["devices"][0]["allowMultipleAllocations"], true);
}
