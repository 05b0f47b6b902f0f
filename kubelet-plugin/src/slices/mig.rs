//! The devices of a managed GPU in MIG mode, where the cluster keeps DRAPartitionableDevices'
//! fields: the whole GPU and every (profile, placement) of it, each consuming the GPU's
//! shared counters, so that the scheduler never allocates two partitions that overlap, nor
//! a partition beside the whole GPU.
//!
//! One counter set per GPU, `gpu-<index>-counters`, modelled as NVIDIA's DRA driver models
//! its DynamicMIG devices: a counter per memory slice (`memory-slice-0` .. `-7`, 1 each),
//! and `memory`, `multiprocessors` and the engines (`copy-engines`, `decoders`, `encoders`,
//! `jpeg-engines`, `ofa-engines`), each the most any profile of the GPU has (the whole-GPU
//! profile's). A partition consumes the memory slices of its placement and its profile's
//! figures (zeroes left out); the whole GPU consumes every counter.
//!
//! Where DRAConsumableCapacity's fields are kept too, a partition is also shareable
//! (`allowMultipleAllocations`) with consumable `memory` (the instance's, in the steps of
//! `--memory-step`) and `compute` (100 percent of the instance's time): several claims then
//! share one instance, each capped by fgpu. The scheduler takes the partition's counters
//! once, when it first allocates it, and each claim's capacity per claim. The whole GPU of a
//! GPU in MIG mode is never shared: it stands for the GPU held whole (fgpu never changes
//! MIG mode; NVIDIA's driver, which does on Hopper, publishes no whole GPU on an Ampere GPU
//! in MIG mode).

use super::{capacity, quantity, string_attribute, Features, MemoryPolicy, COMPUTE, COMPUTE_WHOLE, MEMORY};
use crate::partitions::{self, MigGpu, MigProfile};
use crate::quantity::format_bytes;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
};
use std::collections::BTreeMap;

/// The feature gate whose fields partitions need.
pub const PARTITIONABLE_DEVICES: &str = "DRAPartitionableDevices";
/// Counter sets in one slice (`ResourceSliceMaxCounterSets`, from Kubernetes 1.35).
pub const MAX_COUNTER_SETS: usize = 8;
/// Counters in one counter set (`ResourceSliceMaxCountersPerCounterSet`); in 1.34, the
/// counters of all the sets of a slice together.
pub const MAX_COUNTERS: usize = 32;
/// Counters all the devices of one slice consume together (Kubernetes 1.34 only).
pub const MAX_DEVICE_COUNTERS_1_34: usize = 1024;
/// The capacity a partition's multiprocessors are published as.
pub const MULTIPROCESSORS: &str = "multiprocessors";

/// Where the counter sets go, by what the API server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterLayout {
    /// Kubernetes 1.34: a counter set in the same slice as the devices that consume it.
    Combined,
    /// From 1.35: counter sets in slices of their own (a slice holds counters or devices).
    Split,
}

/// The name of GPU `index`'s counter set.
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}-counters")
}

fn memory_slice(i: u32) -> String {
    format!("memory-slice-{i}")
}

/// A profile's figures as counters (zeroes left out).
fn figures(p: &MigProfile) -> Vec<(&'static str, u64)> {
    let all = [
        ("memory", p.memory_mib << 20),
        (MULTIPROCESSORS, p.sms as u64),
        ("copy-engines", p.copy_engines as u64),
        ("decoders", p.decoders as u64),
        ("encoders", p.encoders as u64),
        ("jpeg-engines", p.jpegs as u64),
        ("ofa-engines", p.ofas as u64),
    ];
    all.into_iter().filter(|(_, v)| *v > 0).collect()
}

fn counter(value: u64) -> Counter {
    Counter { value: quantity(value.to_string()) }
}

/// GPU `gpu`'s counter set: each figure the most any profile has, and every memory slice.
pub fn counter_set(gpu: &MigGpu) -> CounterSet {
    let mut counters: BTreeMap<String, Counter> = BTreeMap::new();
    let mut most: BTreeMap<&'static str, u64> = BTreeMap::new();
    for p in &gpu.profiles {
        for (name, v) in figures(p) {
            let m = most.entry(name).or_default();
            *m = (*m).max(v);
        }
    }
    for (name, v) in most {
        counters.insert(name.to_string(), counter(v));
    }
    for i in 0..memory_slices(gpu) {
        counters.insert(memory_slice(i), counter(1));
    }
    CounterSet { name: counter_set_name(gpu.index), counters }
}

/// How many memory slices the GPU has: the end of its last placement.
pub fn memory_slices(gpu: &MigGpu) -> u32 {
    gpu.profiles.iter().flat_map(|p| p.placements.iter().map(|(s, n)| s + n)).max().unwrap_or(0)
}

fn consumption(gpu: &MigGpu, counters: BTreeMap<String, Counter>) -> Option<Vec<DeviceCounterConsumption>> {
    Some(vec![DeviceCounterConsumption { counter_set: counter_set_name(gpu.index), counters }])
}

fn int(v: u64) -> DeviceAttribute {
    DeviceAttribute { int: Some(v as i64), ..Default::default() }
}

/// The shareable capacities of a partition of `memory` bytes: `memory` in the policy's
/// steps (nothing held back: no process outside a claim runs in an instance fgpu created
/// for claims), `compute` 100.
fn shared_capacities(memory: u64, policy: &MemoryPolicy, features: Features) -> BTreeMap<String, DeviceCapacity> {
    let offered = MemoryPolicy { reserve: 0, step: policy.step }.capacity(memory);
    let step = quantity(format_bytes(policy.step));
    let mut caps = BTreeMap::new();
    caps.insert(
        MEMORY.to_string(),
        capacity(
            format_bytes(offered),
            CapacityRequestPolicy {
                default: Some(quantity(format_bytes(offered))),
                valid_range: Some(CapacityRequestPolicyRange { min: step.clone(), max: None, step: Some(step) }),
                valid_values: None,
            },
            features,
        ),
    );
    caps.insert(
        COMPUTE.to_string(),
        capacity(
            COMPUTE_WHOLE.to_string(),
            CapacityRequestPolicy {
                default: Some(quantity("0".into())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: quantity("0".into()),
                    max: Some(quantity(COMPUTE_WHOLE.to_string())),
                    step: Some(quantity("1".into())),
                }),
                valid_values: None,
            },
            features,
        ),
    );
    caps
}

/// The partitions of `gpu` as devices; `common`: the attributes every device of the GPU
/// carries (its product and driver). A partition whose memory leaves less than two steps
/// is published unshared.
pub fn partition_devices(gpu: &MigGpu, common: &BTreeMap<String, DeviceAttribute>, policy: &MemoryPolicy, features: Features) -> Vec<Device> {
    let mut out = Vec::new();
    for p in &gpu.profiles {
        for &(start, size) in &p.placements {
            let mut attributes = common.clone();
            attributes.insert("type".into(), string_attribute("mig"));
            attributes.insert("profile".into(), string_attribute(&p.name));
            attributes.insert("placementStart".into(), int(start.into()));
            attributes.insert("placementSize".into(), int(size.into()));
            attributes.insert("parentUUID".into(), string_attribute(&gpu.uuid));
            attributes.insert("parentIndex".into(), int(gpu.index.into()));
            let memory = p.memory_mib << 20;
            let shared = features.consumable_capacity && policy.step.saturating_mul(2) <= memory;
            let mut caps = if shared {
                shared_capacities(memory, policy, features)
            } else {
                BTreeMap::from([
                    (MEMORY.to_string(), DeviceCapacity { value: quantity(format_bytes(memory)), request_policy: None }),
                    (COMPUTE.to_string(), DeviceCapacity { value: quantity(COMPUTE_WHOLE.to_string()), request_policy: None }),
                ])
            };
            caps.insert(MULTIPROCESSORS.into(), DeviceCapacity { value: quantity(p.sms.to_string()), request_policy: None });
            let mut counters: BTreeMap<String, Counter> = figures(p).into_iter().map(|(n, v)| (n.to_string(), counter(v))).collect();
            for i in start..start + size {
                counters.insert(memory_slice(i), counter(1));
            }
            out.push(Device {
                name: partitions::device_name(gpu.index, &p.name, start),
                allow_multiple_allocations: shared.then_some(true),
                attributes: Some(attributes),
                capacity: Some(caps),
                consumes_counters: consumption(gpu, counters),
                ..Default::default()
            });
        }
    }
    out
}

/// The whole GPU `device` (as published when MIG is not used) made the whole of a GPU in
/// MIG mode: held by one claim, consuming every counter of its set.
pub fn whole(mut device: Device, gpu: &MigGpu) -> Device {
    device.allow_multiple_allocations = None;
    for cap in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
        cap.request_policy = None;
    }
    if let Some(a) = device.attributes.as_mut() {
        a.insert("migEnabled".into(), DeviceAttribute { bool: Some(true), ..Default::default() });
    }
    device.consumes_counters = consumption(gpu, counter_set(gpu).counters);
    device
}

/// A slice made only to ask the API server, in a dry run, whether it keeps partitionable
/// devices' fields and where: `Combined`, a counter set and a device that consumes it in one
/// slice (what 1.34 wants, and 1.35 refuses); `Split`, a counter set alone.
pub fn partition_probe(node: &str, layout: CounterLayout) -> serde_json::Value {
    let set = CounterSet { name: "probe".into(), counters: BTreeMap::from([("memory-slice-0".to_string(), counter(1))]) };
    let devices = match layout {
        CounterLayout::Combined => vec![Device {
            name: "probe".into(),
            consumes_counters: Some(vec![DeviceCounterConsumption { counter_set: "probe".into(), counters: set.counters.clone() }]),
            ..Default::default()
        }],
        CounterLayout::Split => Vec::new(),
    };
    let content = super::SliceContent { devices, shared_counters: vec![set] };
    let mut probe = serde_json::to_value(super::slice(node, None, 0, 1, content, 0)).expect("serialises");
    probe["metadata"] = serde_json::json!({"generateName": super::feature_probe_prefix(node)});
    probe
}

fn non_empty(v: Option<&serde_json::Value>) -> bool {
    v.and_then(serde_json::Value::as_array).is_some_and(|a| !a.is_empty())
}

/// Whether the server dropped partitionable devices' fields from `sent`: its counter sets,
/// or a device's `consumesCounters`.
pub fn dropped(sent: &serde_json::Value, stored: &serde_json::Value) -> bool {
    if non_empty(sent.pointer("/spec/sharedCounters")) && !non_empty(stored.pointer("/spec/sharedCounters")) {
        return true;
    }
    let devices = |v: &serde_json::Value| v.pointer("/spec/devices").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    let kept = devices(stored);
    devices(sent).iter().any(|d| non_empty(d.get("consumesCounters")) && kept.iter().any(|k| k["name"] == d["name"] && !non_empty(k.get("consumesCounters"))))
}

/// Whether `existing` (on the server) has partitionable devices' fields that `desired` (as
/// JSON) no longer has: a slice written before the driver learnt they are not kept.
pub fn extra(existing: &serde_json::Value, desired: &serde_json::Value) -> bool {
    if non_empty(existing.pointer("/spec/sharedCounters")) && !non_empty(desired.pointer("/spec/sharedCounters")) {
        return true;
    }
    let wanted = desired.pointer("/spec/devices").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    existing
        .pointer("/spec/devices")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .any(|d| non_empty(d.get("consumesCounters")) && wanted.iter().any(|w| w["name"] == d["name"] && !non_empty(w.get("consumesCounters"))))
}
