//! The devices this driver publishes for its node, and the ResourceSlices that carry them:
//! a pool named after the node, of as many slices as the API's limits ask.
//!
//! Where the cluster has DRAConsumableCapacity (the API server keeps the fields), each GPU
//! `gpu-<index>` is shareable (`allowMultipleAllocations`) with two consumable capacities:
//!
//! - `memory`: the GPU's memory less a reserve (`--memory-reserve`, for what the driver and
//!   processes outside any claim hold), rounded down to the step of its request policy
//!   (`--memory-step`). A claim that names no memory consumes the policy's default, all of
//!   it: the whole GPU, so nothing is ever overcommitted. A request is rounded up to the
//!   step by the scheduler; the amount consumed is the claim's memory cap.
//! - `compute`: 100 (percent of the GPU's time), whole percents. A claim that names none
//!   consumes 0: no ceiling on its kernels, and nothing of the GPU's time is set aside for
//!   it. A claim that consumes N (1-99) has its kernels held to N % of the GPU's time; 100
//!   is the whole GPU: no ceiling, and no other claim can set time aside on it (claims that
//!   consume 0 still fit beside it and run unthrottled). The scheduler keeps the sum on
//!   each GPU within 100, so claims with a share, all busy at once, each get theirs as long
//!   as claims without one leave the GPU the time.
//!
//! Where it does not (the API server drops `allowMultipleAllocations` and `requestPolicy`),
//! each GPU is published whole: one claim at a time, capped at the GPU's size. The two
//! capacities stay, as plain values, for selectors.
//!
//! The API server's validation refuses a whole slice for one device it finds wrong; the
//! rules that bear on what this driver writes are kept here: a request policy's `min +
//! step` must fit in the capacity (so a GPU too small for two steps is left out, with the
//! reason), at most 128 devices per slice (64 once devices consume counters or have
//! taints), string attributes of at most 64 characters.

use crate::inventory::{DriverInfo, GpuInfo};
use crate::quantity::format_bytes;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CounterSet, Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The driver's name, the domain of its attributes and capacities.
pub const DRIVER: &str = "gpu.fgpu.io";
pub const MEMORY: &str = "memory";
pub const COMPUTE: &str = "compute";
/// The `compute` capacity: 100 percent of the GPU's time.
pub const COMPUTE_WHOLE: u64 = 100;
/// Kubernetes' limit on an attribute's string value.
const MAX_STRING_ATTRIBUTE: usize = 64;
/// Devices in one slice (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;
/// Devices in one slice once any of them consumes counters or has taints
/// (`ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`).
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;

/// The feature gate whose fields this driver's shared GPUs need.
pub const CONSUMABLE_CAPACITY: &str = "DRAConsumableCapacity";

pub mod mig;

/// The feature gate whose fields partitions need.
pub const PARTITIONABLE_DEVICES: &str = "DRAPartitionableDevices";
/// Counter sets in one slice (`ResourceSliceMaxCounterSets`, from Kubernetes 1.35).
pub const MAX_COUNTER_SETS: usize = 8;

/// Where the counter sets go, by what the API server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterLayout {
    /// Kubernetes 1.34: a counter set in the same slice as the devices that consume it.
    Combined,
    /// From 1.35: counter sets in slices of their own (a slice holds counters or devices).
    Split,
}

/// What the cluster's API server keeps of what this driver may publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `allowMultipleAllocations` and `requestPolicy` (DRAConsumableCapacity).
    pub consumable_capacity: bool,
    /// `sharedCounters` and `consumesCounters` (DRAPartitionableDevices): MIG partitions.
    pub partitionable_devices: bool,
    /// Where the counter sets go (what the server's version accepts).
    pub counter_layout: CounterLayout,
}

impl Features {
    pub const ALL: Features = Features { consumable_capacity: true, partitionable_devices: true, counter_layout: CounterLayout::Split };
    /// Whole GPUs only, one claim each.
    pub const NONE: Features = Features { consumable_capacity: false, partitionable_devices: false, counter_layout: CounterLayout::Split };
}

/// How much of each GPU's memory is offered, and in what steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPolicy {
    pub reserve: u64,
    pub step: u64,
}

impl MemoryPolicy {
    /// The `memory` capacity of a GPU with `total` bytes: 0 when the reserve leaves less
    /// than one step.
    pub fn capacity(&self, total: u64) -> u64 {
        let step = self.step.max(1);
        total.saturating_sub(self.reserve) / step * step
    }

    /// Why a GPU of `total` bytes cannot be published, if it cannot: the API server refuses
    /// a request policy whose `min + step` is above the capacity (min is one step).
    pub fn refusal(&self, total: u64) -> Option<String> {
        let capacity = self.capacity(total);
        let least = self.step.saturating_mul(2);
        (capacity < least).then(|| {
            format!(
                "its memory capacity {} (the GPU's {} less --memory-reserve {}, in steps of --memory-step {}) is below the request policy's min + step ({}), which the API server refuses",
                format_bytes(capacity),
                format_bytes(total),
                format_bytes(self.reserve),
                format_bytes(self.step),
                format_bytes(least)
            )
        })
    }
}

/// A GPU this driver does not publish, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    pub index: u32,
    pub uuid: String,
    pub why: String,
}

/// The device name of the GPU with this index.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index a device name of this driver stands for.
pub fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name of slice `index` of the node's pool: `<node>-gpu.fgpu.io-<index>`, found again
/// by name. A node name too long for that (object names have at most 253 characters) is
/// cut and followed by a hash of the whole name.
pub fn slice_name(node: &str, index: usize) -> String {
    let tail = format!("-{DRIVER}-{index}");
    if node.len() + tail.len() <= 253 {
        return format!("{node}{tail}");
    }
    // FNV-1a, 64 bits: stable across releases, unlike std's hasher.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let suffix = format!("-{hash:016x}{tail}");
    let mut cut = 253 - suffix.len();
    while !node.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", node[..cut].trim_end_matches(['-', '.']))
}

/// A version as Kubernetes' `version` attribute wants it (semantic versioning 2.0):
/// `570.26` is `570.26.0`, `535.104.05` is `535.104.5`. `None` when it is not one to three
/// dot-separated numbers.
pub fn semver(text: &str) -> Option<String> {
    let parts: Vec<&str> = text.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 9) {
        return None;
    }
    let mut numbers: Vec<u64> = parts.iter().map(|p| p.parse().unwrap_or(0)).collect();
    numbers.resize(3, 0);
    Some(format!("{}.{}.{}", numbers[0], numbers[1], numbers[2]))
}

/// cuDriverGetVersion's number (12080) as a version (`12.8.0`).
pub fn cuda_semver(version: i32) -> Option<String> {
    (version > 0).then(|| format!("{}.{}.0", version / 1000, (version % 1000) / 10))
}

pub(crate) fn string_attribute(text: &str) -> DeviceAttribute {
    let mut cut = text.len().min(MAX_STRING_ATTRIBUTE);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    DeviceAttribute { string: Some(text[..cut].to_string()), ..Default::default() }
}

pub(crate) fn quantity(text: String) -> Quantity {
    Quantity(text)
}

/// A capacity, with its request policy where the cluster keeps one.
pub(crate) fn capacity(value: String, policy: CapacityRequestPolicy, features: Features) -> DeviceCapacity {
    DeviceCapacity { value: quantity(value), request_policy: features.consumable_capacity.then_some(policy) }
}

/// The devices of the node's GPUs as `features` allow, and the GPUs left out.
pub fn devices(gpus: &[GpuInfo], driver: &DriverInfo, policy: &MemoryPolicy, features: Features) -> (Vec<Device>, Vec<LeftOut>) {
    let mut out = Vec::new();
    let mut left_out = Vec::new();
    for gpu in gpus {
        if let Some(why) = policy.refusal(gpu.total) {
            left_out.push(LeftOut { index: gpu.index, uuid: gpu.uuid.clone(), why });
            continue;
        }
        let memory = policy.capacity(gpu.total);
        let mut attributes = BTreeMap::new();
        attributes.insert("type".to_string(), string_attribute("gpu"));
        attributes.insert("uuid".to_string(), string_attribute(&gpu.uuid));
        attributes.insert("productName".to_string(), string_attribute(&gpu.product));
        attributes.insert("index".to_string(), DeviceAttribute { int: Some(gpu.index.into()), ..Default::default() });
        if let Some(v) = driver.driver_version.as_deref().and_then(semver) {
            attributes.insert("driverVersion".to_string(), DeviceAttribute { version: Some(v), ..Default::default() });
        }
        if let Some(v) = driver.cuda_version.and_then(cuda_semver) {
            attributes.insert("cudaVersion".to_string(), DeviceAttribute { version: Some(v), ..Default::default() });
        }
        let capacities = capacities(memory, policy.step, features);
        out.push(Device {
            name: device_name(gpu.index),
            allow_multiple_allocations: features.consumable_capacity.then_some(true),
            attributes: Some(attributes),
            capacity: Some(capacities),
            ..Default::default()
        });
    }
    (out, left_out)
}

/// A shareable device's capacities: `memory` bytes, requested in steps of `step` (a claim
/// that names none takes all of it), and `compute` 100 (a claim that names none takes 0).
pub(crate) fn capacities(memory: u64, step: u64, features: Features) -> BTreeMap<String, DeviceCapacity> {
    let step = quantity(format_bytes(step));
    let mut capacities = BTreeMap::new();
    capacities.insert(
        MEMORY.to_string(),
        capacity(
            format_bytes(memory),
            CapacityRequestPolicy {
                default: Some(quantity(format_bytes(memory))),
                valid_range: Some(CapacityRequestPolicyRange { min: step.clone(), max: None, step: Some(step) }),
                valid_values: None,
            },
            features,
        ),
    );
    capacities.insert(
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
    capacities
}

/// What one slice of the pool holds: devices, or (from Kubernetes 1.35, for partitionable
/// devices) counter sets, never both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SliceContent {
    pub devices: Vec<Device>,
    pub shared_counters: Vec<CounterSet>,
}

/// The most devices one slice may hold, given whether they consume counters or have taints.
fn limit(device: &Device) -> usize {
    let counters = device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty());
    let taints = device.taints.as_ref().is_some_and(|t| !t.is_empty());
    if counters || taints {
        MAX_DEVICES_WITH_COUNTERS
    } else {
        MAX_DEVICES
    }
}

/// The pool's slices: the counter sets first, in slices of their own (at most
/// [`MAX_COUNTER_SETS`] each), then the devices in order, each slice as full as the API
/// allows. At least one slice, so that an empty pool is published as such.
pub fn pack(devices: Vec<Device>, shared_counters: Vec<CounterSet>) -> Vec<SliceContent> {
    let mut slices = Vec::new();
    for sets in shared_counters.chunks(MAX_COUNTER_SETS) {
        slices.push(SliceContent { devices: Vec::new(), shared_counters: sets.to_vec() });
    }
    let mut current: Vec<Device> = Vec::new();
    for device in devices {
        let cap = current.iter().chain(std::iter::once(&device)).map(limit).min().unwrap_or(MAX_DEVICES);
        if current.len() + 1 > cap {
            slices.push(SliceContent { devices: std::mem::take(&mut current), shared_counters: Vec::new() });
        }
        current.push(device);
    }
    if !current.is_empty() || slices.is_empty() {
        slices.push(SliceContent { devices: current, shared_counters: Vec::new() });
    }
    slices
}

/// Slice `index` of `count` of the node's pool, owned by the Node (`node_uid`, when it
/// could be read) so that it goes when the node does.
pub fn slice(node: &str, node_uid: Option<&str>, index: usize, count: usize, content: SliceContent, generation: i64) -> ResourceSlice {
    let owner = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    let counters = (!content.shared_counters.is_empty()).then_some(content.shared_counters);
    ResourceSlice {
        metadata: ObjectMeta { name: Some(slice_name(node, index)), owner_references: owner, ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation, resource_slice_count: count as i64 },
            devices: if counters.is_some() && content.devices.is_empty() { None } else { Some(content.devices) },
            shared_counters: counters,
            ..Default::default()
        },
    }
}

/// A slice made only to ask the API server, in a dry run, which fields it keeps: one device
/// with every gated field this driver may use.
pub fn feature_probe(node: &str) -> Value {
    let step = quantity("256Mi".into());
    let device = Device {
        name: "probe".into(),
        allow_multiple_allocations: Some(true),
        capacity: Some(BTreeMap::from([(
            MEMORY.to_string(),
            DeviceCapacity {
                value: quantity("1Gi".into()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity("1Gi".into())),
                    valid_range: Some(CapacityRequestPolicyRange { min: step.clone(), max: None, step: Some(step) }),
                    valid_values: None,
                }),
            },
        )])),
        ..Default::default()
    };
    let mut probe = serde_json::to_value(slice(node, None, 0, 1, SliceContent { devices: vec![device], shared_counters: Vec::new() }, 0)).expect("serialises");
    // A name of the server's making: a dry run never meets an existing slice's.
    probe["metadata"] = serde_json::json!({"generateName": feature_probe_prefix(node)});
    probe
}

/// The start of the names the server makes for [`feature_probe`]'s slices.
pub fn feature_probe_prefix(node: &str) -> String {
    format!("{node}-{DRIVER}-probe-")
}

/// The feature gates whose fields the server dropped: in `sent` (what this driver wrote)
/// and not in `stored` (what the server answered).
pub fn dropped(sent: &Value, stored: &Value) -> BTreeSet<&'static str> {
    let mut gates = BTreeSet::new();
    let devices = |v: &Value| v.pointer("/spec/devices").and_then(Value::as_array).cloned().unwrap_or_default();
    let stored_devices = devices(stored);
    for d in devices(sent) {
        let Some(kept) = stored_devices.iter().find(|s| s["name"] == d["name"]) else { continue };
        if d.get("allowMultipleAllocations").is_some() && kept.get("allowMultipleAllocations").is_none() {
            gates.insert(CONSUMABLE_CAPACITY);
        }
        for (name, cap) in d["capacity"].as_object().into_iter().flatten() {
            if cap.get("requestPolicy").is_some() && kept.pointer(&format!("/capacity/{name}/requestPolicy")).is_none() {
                gates.insert(CONSUMABLE_CAPACITY);
            }
        }
    }
    if counters_dropped(sent, stored) {
        gates.insert(PARTITIONABLE_DEVICES);
    }
    gates
}

/// Whether everything `desired` says is in `existing` with the same value (what the server
/// added, defaults and bookkeeping, is ignored); lists must match element by element.
pub fn contains(existing: &Value, desired: &Value) -> bool {
    match (existing, desired) {
        (Value::Object(e), Value::Object(d)) => d.iter().all(|(k, dv)| e.get(k).is_some_and(|ev| contains(ev, dv))),
        (Value::Array(e), Value::Array(d)) => e.len() == d.len() && e.iter().zip(d).all(|(ev, dv)| contains(ev, dv)),
        _ => existing == desired,
    }
}

/// Whether the slice on the server says what `desired` says: its spec, the pool's
/// generation left out (this driver counts it for the pool as a whole), and its owner; and
/// nothing more in its devices than `desired` has (a field this driver no longer writes,
/// such as `requestPolicy` after the cluster turned out not to keep it).
pub fn same(existing: &Value, desired: &ResourceSlice) -> bool {
    let mut want = serde_json::to_value(desired).expect("a ResourceSlice serialises");
    if let Some(pool) = want.pointer_mut("/spec/pool").and_then(Value::as_object_mut) {
        pool.remove("generation");
    }
    let spec_same = contains(&existing["spec"], &want["spec"]);
    let owner_same = match want.pointer("/metadata/ownerReferences") {
        Some(owners) => existing.pointer("/metadata/ownerReferences").is_some_and(|e| contains(e, owners)),
        None => true,
    };
    let gated_extra = existing.pointer("/spec/devices").and_then(Value::as_array).into_iter().flatten().any(|d| {
        let theirs = want.pointer("/spec/devices").and_then(Value::as_array).and_then(|w| w.iter().find(|x| x["name"] == d["name"]));
        let Some(theirs) = theirs else { return false };
        let extra_multiple = d.get("allowMultipleAllocations").is_some() && theirs.get("allowMultipleAllocations").is_none();
        let extra_policy = d["capacity"]
            .as_object()
            .into_iter()
            .flatten()
            .any(|(k, c)| c.get("requestPolicy").is_some() && theirs.pointer(&format!("/capacity/{k}/requestPolicy")).is_none());
        extra_multiple || extra_policy
    });
    spec_same && owner_same && !gated_extra && !counters_dropped(existing, &want)
}

fn non_empty(v: Option<&Value>) -> bool {
    v.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// Whether `a` has partitionable devices' fields that `b` lacks: its counter sets, or a
/// device's `consumesCounters` (dropped by the server when `a` was sent and `b` stored; or
/// no longer wanted when `a` is stored and `b` desired).
pub fn counters_dropped(a: &Value, b: &Value) -> bool {
    if non_empty(a.pointer("/spec/sharedCounters")) && !non_empty(b.pointer("/spec/sharedCounters")) {
        return true;
    }
    let devices = |v: &Value| v.pointer("/spec/devices").and_then(Value::as_array).cloned().unwrap_or_default();
    let theirs = devices(b);
    devices(a).iter().any(|d| non_empty(d.get("consumesCounters")) && theirs.iter().any(|t| t["name"] == d["name"] && !non_empty(t.get("consumesCounters"))))
}

#[cfg(test)]
mod mig_tests;
#[cfg(test)]
mod tests;
