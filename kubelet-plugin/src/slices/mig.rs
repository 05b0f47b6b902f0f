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

use super::{
    device_index, devices, pack, quantity, string_attribute, CounterLayout, Features, LeftOut, MemoryPolicy, SliceContent, COMPUTE, COMPUTE_WHOLE, MEMORY,
};
use crate::inventory::{DriverInfo, GpuInfo};
use crate::partitions::{self, MigGpu, MigProfile};
use crate::quantity::format_bytes;
use k8s_openapi::api::resource::v1::{Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption};
use std::collections::BTreeMap;

/// Counters in one counter set (`ResourceSliceMaxCountersPerCounterSet`); in 1.34, the
/// counters of all the sets of a slice together.
pub const MAX_COUNTERS: usize = 32;
/// Counters all the devices of one slice consume together (Kubernetes 1.34 only).
pub const MAX_DEVICE_COUNTERS_1_34: usize = 1024;
/// The capacity a partition's multiprocessors are published as.
pub const MULTIPROCESSORS: &str = "multiprocessors";

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
    super::capacities(offered, policy.step, features)
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
    let content = SliceContent { devices, shared_counters: vec![set] };
    let mut probe = serde_json::to_value(super::slice(node, None, 0, 1, content, 0)).expect("serialises");
    probe["metadata"] = serde_json::json!({"generateName": super::feature_probe_prefix(node)});
    probe
}

/// The devices of one managed GPU in MIG mode (its whole and its partitions) and the
/// counter set they consume.
#[derive(Debug, Clone, PartialEq)]
pub struct Partitioned {
    pub counters: CounterSet,
    pub devices: Vec<Device>,
}

/// The node's devices as `features` allow: GPUs published as before, and each managed GPU
/// in MIG mode (`mig`, matched by index and UUID) as its whole and its partitions, where the
/// cluster keeps partitionable devices; and the GPUs left out.
pub fn pool_devices(
    gpus: &[GpuInfo],
    mig: &[MigGpu],
    driver: &DriverInfo,
    policy: &MemoryPolicy,
    features: Features,
) -> (Vec<Device>, Vec<Partitioned>, Vec<LeftOut>) {
    let (all, left_out) = devices(gpus, driver, policy, features);
    if !features.partitionable_devices {
        return (all, Vec::new(), left_out);
    }
    let (mut plain, mut parts) = (Vec::new(), Vec::new());
    for d in all {
        let index = device_index(&d.name);
        let uuid = gpus.iter().find(|g| Some(g.index) == index).map(|g| g.uuid.as_str());
        let Some(m) = mig.iter().find(|m| Some(m.index) == index && Some(m.uuid.as_str()) == uuid && m.enabled() && !m.profiles.is_empty()) else {
            plain.push(d);
            continue;
        };
        let common: BTreeMap<String, DeviceAttribute> = d
            .attributes
            .iter()
            .flatten()
            .filter(|(k, _)| ["productName", "driverVersion", "cudaVersion"].contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut devices = vec![whole(d, m)];
        devices.extend(partition_devices(m, &common, policy, features));
        parts.push(Partitioned { counters: counter_set(m), devices });
    }
    (plain, parts, left_out)
}

/// The pool's slices for `plain` devices and `parts`: from Kubernetes 1.35 the counter sets
/// in slices of their own ([`pack`]); in 1.34 each GPU's counter set in the slice of the
/// devices that consume it, one GPU a slice, then the other devices.
pub fn pack_pool(plain: Vec<Device>, parts: Vec<Partitioned>, layout: CounterLayout) -> Vec<SliceContent> {
    match layout {
        CounterLayout::Split => {
            let sets = parts.iter().map(|p| p.counters.clone()).collect();
            let devices = plain.into_iter().chain(parts.into_iter().flat_map(|p| p.devices)).collect();
            pack(devices, sets)
        }
        CounterLayout::Combined => {
            let mut slices: Vec<SliceContent> = parts.into_iter().map(|p| SliceContent { devices: p.devices, shared_counters: vec![p.counters] }).collect();
            if !plain.is_empty() || slices.is_empty() {
                slices.extend(pack(plain, Vec::new()));
            }
            slices
        }
    }
}
