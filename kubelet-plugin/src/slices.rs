//! The ResourceSlice this driver publishes for its node: pool `<node name>`, one device
//! `gpu-<index>` per GPU, each shareable (`allowMultipleAllocations`) with two consumable
//! capacities:
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

use crate::quantity::format_bytes;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;
use std::collections::BTreeMap;

/// The driver's name, the domain of its attributes and capacities.
pub const DRIVER: &str = "gpu.fgpu.io";
pub const MEMORY: &str = "memory";
pub const COMPUTE: &str = "compute";
/// The `compute` capacity: 100 percent of the GPU's time.
pub const COMPUTE_WHOLE: u64 = 100;
/// Kubernetes' limit on an attribute's string value.
const MAX_STRING_ATTRIBUTE: usize = 64;

/// One GPU as the driver probe reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub product: String,
    pub total: u64,
}

/// The node's driver, for the devices' attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// nvmlSystemGetDriverVersion, such as `570.26` or `535.104.05`.
    pub driver_version: Option<String>,
    /// cuDriverGetVersion, such as 12080.
    pub cuda_version: Option<i32>,
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

/// The slice's name: `<node>-gpu.fgpu.io`, one per node, so the driver finds its own slice
/// again by name, with no list or watch. A node name too long for that (object names have
/// at most 253 characters) is cut and followed by a hash of the whole name.
pub fn slice_name(node: &str) -> String {
    let name = format!("{node}-{DRIVER}");
    if name.len() <= 253 {
        return name;
    }
    // FNV-1a, 64 bits: stable across releases, unlike std's hasher.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let suffix = format!("-{hash:016x}-{DRIVER}");
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

fn string_attribute(text: &str) -> DeviceAttribute {
    let mut cut = text.len().min(MAX_STRING_ATTRIBUTE);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    DeviceAttribute { string: Some(text[..cut].to_string()), ..Default::default() }
}

fn quantity(text: String) -> Quantity {
    Quantity(text)
}

/// The slice's devices: every GPU whose memory capacity is at least one step.
pub fn devices(gpus: &[GpuInfo], driver: &DriverInfo, policy: &MemoryPolicy) -> Vec<Device> {
    let mut out = Vec::new();
    for gpu in gpus {
        let memory = policy.capacity(gpu.total);
        if memory == 0 {
            continue;
        }
        let mut attributes = BTreeMap::new();
        attributes.insert("uuid".to_string(), string_attribute(&gpu.uuid));
        attributes.insert("productName".to_string(), string_attribute(&gpu.product));
        attributes.insert("index".to_string(), DeviceAttribute { int: Some(gpu.index.into()), ..Default::default() });
        if let Some(v) = driver.driver_version.as_deref().and_then(semver) {
            attributes.insert("driverVersion".to_string(), DeviceAttribute { version: Some(v), ..Default::default() });
        }
        if let Some(v) = driver.cuda_version.and_then(cuda_semver) {
            attributes.insert("cudaVersion".to_string(), DeviceAttribute { version: Some(v), ..Default::default() });
        }
        let mut capacity = BTreeMap::new();
        capacity.insert(
            MEMORY.to_string(),
            DeviceCapacity {
                value: quantity(format_bytes(memory)),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity(format_bytes(memory))),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity(format_bytes(policy.step)),
                        max: None,
                        step: Some(quantity(format_bytes(policy.step))),
                    }),
                    valid_values: None,
                }),
            },
        );
        capacity.insert(
            COMPUTE.to_string(),
            DeviceCapacity {
                value: quantity(COMPUTE_WHOLE.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity("0".into())),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity("0".into()),
                        max: Some(quantity(COMPUTE_WHOLE.to_string())),
                        step: Some(quantity("1".into())),
                    }),
                    valid_values: None,
                }),
            },
        );
        out.push(Device {
            name: device_name(gpu.index),
            allow_multiple_allocations: Some(true),
            attributes: Some(attributes),
            capacity: Some(capacity),
            ..Default::default()
        });
    }
    out
}

/// The node's slice, owned by the Node (`node_uid`, when it could be read) so that it goes
/// when the node does.
pub fn slice(node: &str, node_uid: Option<&str>, devices: Vec<Device>, generation: i64) -> ResourceSlice {
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
    ResourceSlice {
        metadata: ObjectMeta { name: Some(slice_name(node)), owner_references: owner, ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation, resource_slice_count: 1 },
            devices: Some(devices),
            ..Default::default()
        },
    }
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

/// Whether the slice on the server must be replaced by `desired`: its spec (leaving out the
/// pool's generation, which this driver counts) or its owner differ.
pub fn needs_update(existing: &Value, desired: &ResourceSlice) -> bool {
    let mut want = serde_json::to_value(desired).expect("a ResourceSlice serialises");
    if let Some(pool) = want.pointer_mut("/spec/pool").and_then(Value::as_object_mut) {
        pool.remove("generation");
    }
    let spec_same = contains(&existing["spec"], &want["spec"]);
    let owner_same = match want.pointer("/metadata/ownerReferences") {
        Some(owners) => existing.pointer("/metadata/ownerReferences").is_some_and(|e| contains(e, owners)),
        None => true,
    };
    !(spec_same && owner_same)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const POLICY: MemoryPolicy = MemoryPolicy { reserve: 512 * MIB, step: 256 * MIB };

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
    fn each_gpu_is_a_shareable_device_with_memory_and_compute() {
        let driver = DriverInfo { driver_version: Some("535.104.05".into()), cuda_version: Some(12080) };
        let devices = devices(&[gpu(0, 80 * GIB), gpu(1, 24 * GIB), gpu(2, 256 * MIB)], &driver, &POLICY);
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
    fn the_slice_names_its_pool_node_and_owner() {
        let s = serde_json::to_value(slice("node-a", Some("0a1b"), Vec::new(), 3)).unwrap();
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(s["kind"], "ResourceSlice");
        assert_eq!(s["metadata"]["name"], "node-a-gpu.fgpu.io");
        assert_eq!(
            s["metadata"]["ownerReferences"][0],
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "0a1b", "controller": true})
        );
        assert_eq!(s["spec"]["driver"], "gpu.fgpu.io");
        assert_eq!(s["spec"]["nodeName"], "node-a");
        assert_eq!(s["spec"]["pool"], serde_json::json!({"name": "node-a", "generation": 3, "resourceSliceCount": 1}));
        let s = serde_json::to_value(slice("node-a", None, Vec::new(), 1)).unwrap();
        assert!(s["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn long_node_names_give_valid_distinct_slice_names() {
        let a = "a".repeat(253);
        let b = format!("{}b", "a".repeat(252));
        assert!(slice_name(&a).len() <= 253 && slice_name(&b).len() <= 253);
        assert_ne!(slice_name(&a), slice_name(&b));
        assert!(slice_name(&a).ends_with("-gpu.fgpu.io"));
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

    #[test]
    fn an_unchanged_slice_needs_no_update_whatever_the_server_added() {
        let driver = DriverInfo::default();
        let desired = slice("n", Some("u"), devices(&[gpu(0, 80 * GIB)], &driver, &POLICY), 4);
        let mut existing = serde_json::to_value(&desired).unwrap();
        existing["metadata"]["resourceVersion"] = "17".into();
        existing["metadata"]["uid"] = "x".into();
        existing["spec"]["pool"]["generation"] = 9.into();
        existing["spec"]["devices"][0]["attributes"]["extra"] = serde_json::json!({"bool": true});
        assert!(!needs_update(&existing, &desired));
        let mut changed = existing.clone();
        changed["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi".into();
        assert!(needs_update(&changed, &desired));
        let mut fewer = existing.clone();
        fewer["spec"]["devices"] = serde_json::json!([]);
        assert!(needs_update(&fewer, &desired));
        let mut no_owner = existing.clone();
        no_owner["metadata"].as_object_mut().unwrap().remove("ownerReferences");
        assert!(needs_update(&no_owner, &desired));
    }
}
