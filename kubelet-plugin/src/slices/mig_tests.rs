//! MIG partitions as devices and counters, packed within the API's limits. The profiles
//! are what `fgpu mig list --json` printed on the simulator for each product (its figures
//! are NVIDIA's, docs/simulator.md).

use super::mig::{pack_pool, pool_devices};
use super::*;
use crate::partitions::{MigGpu, MigMode, MigProfile};
use serde_json::Value;
use std::collections::BTreeMap;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const POLICY: MemoryPolicy = MemoryPolicy { reserve: 512 * MIB, step: 256 * MIB };

type Row = (&'static str, u32, u32, u64, u32, [u32; 5], &'static [(u32, u32)]);

const A100: [Row; 7] = [
    ("1g.10gb", 19, 1, 9728, 14, [1, 0, 0, 0, 0], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("2g.20gb", 14, 2, 19968, 28, [2, 1, 0, 0, 0], &[(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", 9, 3, 40192, 42, [3, 2, 0, 0, 0], &[(0, 4), (4, 4)]),
    ("4g.40gb", 5, 4, 40192, 56, [4, 2, 0, 0, 0], &[(0, 4)]),
    ("7g.80gb", 0, 7, 80896, 98, [7, 5, 0, 1, 1], &[(0, 8)]),
    ("1g.10gb+me", 20, 1, 9728, 14, [1, 1, 0, 1, 1], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("1g.20gb", 15, 1, 19968, 14, [1, 1, 0, 0, 0], &[(0, 2), (2, 2), (4, 2), (6, 2)]),
];
const H100: [Row; 7] = [
    ("1g.10gb", 19, 1, 9984, 16, [1, 1, 0, 1, 0], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("2g.20gb", 14, 2, 20096, 32, [2, 2, 0, 2, 0], &[(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", 9, 3, 40448, 60, [3, 3, 0, 3, 0], &[(0, 4), (4, 4)]),
    ("4g.40gb", 5, 4, 40448, 64, [4, 4, 0, 4, 0], &[(0, 4)]),
    ("7g.80gb", 0, 7, 81152, 132, [8, 7, 0, 7, 1], &[(0, 8)]),
    ("1g.10gb+me", 20, 1, 9984, 16, [1, 1, 0, 1, 1], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("1g.20gb", 15, 1, 20096, 26, [1, 1, 0, 1, 0], &[(0, 2), (2, 2), (4, 2), (6, 2)]),
];
const H200: [Row; 7] = [
    ("1g.18gb", 19, 1, 16384, 16, [1, 1, 0, 1, 0], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("2g.35gb", 14, 2, 33280, 32, [2, 2, 0, 2, 0], &[(0, 2), (2, 2), (4, 2)]),
    ("3g.71gb", 9, 3, 71552, 60, [3, 3, 0, 3, 0], &[(0, 4), (4, 4)]),
    ("4g.71gb", 5, 4, 71552, 64, [4, 4, 0, 4, 0], &[(0, 4)]),
    ("7g.141gb", 0, 7, 143360, 132, [8, 7, 0, 7, 1], &[(0, 8)]),
    ("1g.18gb+me", 20, 1, 16384, 16, [1, 1, 0, 1, 1], &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("1g.35gb", 15, 1, 33280, 26, [1, 1, 0, 1, 0], &[(0, 2), (2, 2), (4, 2), (6, 2)]),
];

/// An 8-GPU node of `product` with `total` bytes a GPU, every GPU managed and in MIG mode.
fn node(product: &str, total: u64, rows: &[Row]) -> (Vec<GpuInfo>, Vec<MigGpu>) {
    let gpus: Vec<GpuInfo> =
        (0..8).map(|i| GpuInfo { index: i, uuid: format!("GPU-{i:08}-aaaa-bbbb-cccc-000000000000"), product: product.into(), total }).collect();
    let profiles: Vec<MigProfile> = rows
        .iter()
        .map(|&(name, id, slices, memory_mib, sms, [ce, dec, enc, jpg, ofa], placements)| MigProfile {
            name: name.into(),
            id,
            slices,
            memory_mib,
            sms,
            placements: placements.to_vec(),
            copy_engines: ce,
            decoders: dec,
            encoders: enc,
            jpegs: jpg,
            ofas: ofa,
        })
        .collect();
    let mig = gpus
        .iter()
        .map(|g| MigGpu { index: g.index, uuid: g.uuid.clone(), mig: Some(MigMode { current: true, pending: true }), profiles: profiles.clone() })
        .collect();
    (gpus, mig)
}

fn array(v: &Value, pointer: &str) -> Vec<Value> {
    v.pointer(pointer).and_then(Value::as_array).cloned().unwrap_or_default()
}

/// Checks every slice against the API's limits for `layout` (1.34: combined; 1.35: split)
/// and every consumption against the counter sets; gives (slices, devices, counter sets).
fn within_limits(contents: Vec<SliceContent>, layout: CounterLayout) -> (usize, usize, usize) {
    let count = contents.len();
    let slices: Vec<Value> = contents.into_iter().enumerate().map(|(i, c)| serde_json::to_value(slice("node-a", None, i, count, c, 1)).unwrap()).collect();
    let mut sets: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let (mut devices, mut names) = (0, std::collections::BTreeSet::new());
    for s in &slices {
        let counters = array(s, "/spec/sharedCounters");
        let list = array(s, "/spec/devices");
        let total: usize = counters.iter().map(|c| c["counters"].as_object().unwrap().len()).sum();
        match layout {
            CounterLayout::Split => {
                assert!(counters.is_empty() || s["spec"].get("devices").is_none(), "1.35: counters or devices, never both");
                assert!(counters.len() <= MAX_COUNTER_SETS);
                assert!(counters.iter().all(|c| c["counters"].as_object().unwrap().len() <= mig::MAX_COUNTERS));
            }
            CounterLayout::Combined => {
                assert!(total <= mig::MAX_COUNTERS, "1.34: {total} counters in one slice");
                let consumed: usize = list.iter().flat_map(|d| array(d, "/consumesCounters")).map(|c| c["counters"].as_object().unwrap().len()).sum();
                assert!(consumed <= mig::MAX_DEVICE_COUNTERS_1_34, "{consumed}");
            }
        }
        let counted = list.iter().any(|d| !array(d, "/consumesCounters").is_empty());
        assert!(list.len() <= if counted { MAX_DEVICES_WITH_COUNTERS } else { MAX_DEVICES });
        for c in &counters {
            let values = c["counters"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v["value"].as_str().unwrap().parse().unwrap())).collect();
            assert!(sets.insert(c["name"].as_str().unwrap().to_string(), values).is_none(), "set names are unique in the pool");
        }
        for d in &list {
            devices += 1;
            assert!(names.insert(d["name"].as_str().unwrap().to_string()));
            let attrs = d["attributes"].as_object().unwrap().len() + d["capacity"].as_object().unwrap().len();
            assert!(attrs <= 32, "{attrs}");
            for a in d["attributes"].as_object().unwrap().values() {
                assert!(a["string"].as_str().is_none_or(|t| t.len() <= 64));
            }
            let consumes = array(d, "/consumesCounters");
            assert!(consumes.len() <= 2);
            for c in consumes {
                assert!(c["counters"].as_object().unwrap().len() <= mig::MAX_COUNTERS);
                if layout == CounterLayout::Combined {
                    assert!(counters.iter().any(|s| s["name"] == c["counterSet"]), "1.34: the set is in the device's slice");
                }
            }
        }
    }
    // Every consumption names a set and counters it has, and never more than it has.
    for s in &slices {
        for d in array(s, "/spec/devices") {
            for c in array(&d, "/consumesCounters") {
                let set = &sets[c["counterSet"].as_str().unwrap()];
                for (k, v) in c["counters"].as_object().unwrap() {
                    assert!(v["value"].as_str().unwrap().parse::<u64>().unwrap() <= set[k], "{} {k}", d["name"]);
                }
            }
        }
    }
    (slices.len(), devices, sets.len())
}

#[test]
fn an_8_gpu_node_is_packed_within_every_limit_on_1_34_and_1_35() {
    for (product, total, rows) in
        [("NVIDIA A100-SXM4-80GB", 80 * GIB, &A100), ("NVIDIA H100 80GB HBM3", 81559 * MIB, &H100), ("NVIDIA H200", 143771 * MIB, &H200)]
    {
        let (gpus, mig) = node(product, total, rows);
        let partitions: usize = rows.iter().map(|r| r.6.len()).sum();
        assert_eq!(partitions, 25);
        for (layout, want_slices) in [(CounterLayout::Split, 1 + (8 * 26usize).div_ceil(64)), (CounterLayout::Combined, 8)] {
            let features = Features { counter_layout: layout, ..Features::ALL };
            let (plain, parts, left) = pool_devices(&gpus, &mig, &DriverInfo::default(), &POLICY, features);
            assert!(plain.is_empty() && left.is_empty() && parts.len() == 8);
            let (slices, devices, sets) = within_limits(pack_pool(plain, parts, layout), layout);
            assert_eq!((slices, devices, sets), (want_slices, 8 * 26, 8), "{product} {layout:?}");
        }
    }
}

#[test]
fn partitions_consume_their_slices_and_figures_and_the_whole_gpu_everything() {
    let (gpus, mig) = node("NVIDIA A100-SXM4-80GB", 80 * GIB, &A100);
    let (_, parts, _) = pool_devices(&gpus[..1], &mig[..1], &DriverInfo::default(), &POLICY, Features::ALL);
    let set = serde_json::to_value(&parts[0].counters).unwrap();
    assert_eq!(set["name"], "gpu-0-counters");
    let c = &set["counters"];
    assert_eq!(
        (c["memory"]["value"].as_str(), c["multiprocessors"]["value"].as_str(), c["decoders"]["value"].as_str(), c["ofa-engines"]["value"].as_str()),
        (Some("84825604096"), Some("98"), Some("5"), Some("1"))
    );
    assert_eq!((0..8).filter(|i| c[format!("memory-slice-{i}")]["value"] == "1").count(), 8);
    assert!(c.get("encoders").is_none(), "no profile has an encoder");
    let devices: Vec<Value> = parts[0].devices.iter().map(|d| serde_json::to_value(d).unwrap()).collect();
    assert_eq!(devices.len(), 26);
    let whole = &devices[0];
    assert_eq!((whole["name"].as_str(), whole["attributes"]["type"]["string"].as_str()), (Some("gpu-0"), Some("gpu")));
    assert!(whole.get("allowMultipleAllocations").is_none(), "the whole of a GPU in MIG mode is never shared");
    assert_eq!(whole["consumesCounters"][0]["counters"], set["counters"]);
    let p = devices.iter().find(|d| d["name"] == "gpu-0-mig-3g-40gb-4").unwrap();
    let a = &p["attributes"];
    assert_eq!(
        (a["type"]["string"].as_str(), a["profile"]["string"].as_str(), a["placementStart"]["int"].as_i64(), a["placementSize"]["int"].as_i64()),
        (Some("mig"), Some("3g.40gb"), Some(4), Some(4))
    );
    assert_eq!(
        (a["parentUUID"]["string"].as_str(), a["parentIndex"]["int"].as_i64(), a["productName"]["string"].as_str()),
        (Some(gpus[0].uuid.as_str()), Some(0), Some("NVIDIA A100-SXM4-80GB"))
    );
    let used = &p["consumesCounters"][0]["counters"];
    let slices: Vec<u32> = (0..8).filter(|i| used.get(format!("memory-slice-{i}")).is_some()).collect();
    assert_eq!(slices, [4, 5, 6, 7]);
    assert_eq!(
        (used["memory"]["value"].as_str(), used["multiprocessors"]["value"].as_str(), used["decoders"]["value"].as_str()),
        (Some("42144366592"), Some("42"), Some("2"))
    );
    // Shared, with the instance's memory in steps, and compute.
    assert_eq!(p["allowMultipleAllocations"], true);
    assert_eq!(p["capacity"]["memory"]["value"], "40192Mi");
    assert_eq!(p["capacity"]["memory"]["requestPolicy"]["validRange"], serde_json::json!({"min": "256Mi", "step": "256Mi"}));
    assert_eq!(p["capacity"]["compute"]["requestPolicy"]["default"], "0");
    assert_eq!(p["capacity"]["multiprocessors"]["value"], "42");
    let me = devices.iter().find(|d| d["name"] == "gpu-0-mig-1g-10gb-me-6").unwrap();
    assert_eq!(me["consumesCounters"][0]["counters"]["ofa-engines"]["value"], "1", "a +me takes the GPU's one OFA");
}

#[test]
fn without_consumable_capacity_partitions_are_not_shared_and_without_partitions_gpus_are_whole() {
    let (gpus, mig) = node("NVIDIA A100-SXM4-80GB", 80 * GIB, &A100);
    let features = Features { consumable_capacity: false, ..Features::ALL };
    let (_, parts, _) = pool_devices(&gpus[..1], &mig[..1], &DriverInfo::default(), &POLICY, features);
    let p = serde_json::to_value(&parts[0].devices[3]).unwrap();
    assert!(p.get("allowMultipleAllocations").is_none() && p["capacity"]["memory"].get("requestPolicy").is_none(), "{p}");
    let features = Features { partitionable_devices: false, ..Features::ALL };
    let (plain, parts, _) = pool_devices(&gpus, &mig, &DriverInfo::default(), &POLICY, features);
    assert!(parts.is_empty());
    assert_eq!(plain.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), (0..8).map(device_name).collect::<Vec<_>>());
    assert!(plain.iter().all(|d| d.consumes_counters.is_none()));
    // A GPU whose UUID differs from the listing's is not partitioned.
    let mut other = mig.clone();
    other[0].uuid = "GPU-other".into();
    let (plain, parts, _) = pool_devices(&gpus[..1], &other[..1], &DriverInfo::default(), &POLICY, Features::ALL);
    assert_eq!((plain.len(), parts.len()), (1, 0));
}

#[test]
fn dropped_partition_fields_name_their_gate() {
    for layout in [CounterLayout::Combined, CounterLayout::Split] {
        let sent = mig::partition_probe("node-a", layout);
        assert!(dropped(&sent, &sent).is_empty());
        let mut stored = sent.clone();
        stored["spec"].as_object_mut().unwrap().remove("sharedCounters");
        if let Some(d) = stored.pointer_mut("/spec/devices/0").and_then(Value::as_object_mut) {
            d.remove("consumesCounters");
        }
        assert_eq!(dropped(&sent, &stored), std::collections::BTreeSet::from([PARTITIONABLE_DEVICES]), "{layout:?}");
    }
    let combined = mig::partition_probe("node-a", CounterLayout::Combined);
    assert!(combined["spec"]["sharedCounters"].is_array() && combined["spec"]["devices"][0]["consumesCounters"].is_array());
    assert!(mig::partition_probe("node-a", CounterLayout::Split)["spec"].get("devices").is_none());
}
