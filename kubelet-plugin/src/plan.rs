//! What a claim's allocation, as the scheduler wrote it, gives on this node: the caps per
//! GPU, and the devices kubelet is answered with.
//!
//! - Each device of this driver must be a GPU of this node's pool; its consumed memory is
//!   the cap, its consumed compute the share. With no consumed capacity (a cluster without
//!   DRAConsumableCapacity, where a device goes to one claim only), the claim holds the
//!   GPU alone, capped at the GPU's size.
//! - A result with `adminAccess` is not a tenant's share: it consumes nothing (the
//!   scheduler does not count it either) and is not capped (docs/kubernetes.md).
//! - With prioritized lists (`firstAvailable`) a result names `<request>/<subrequest>`,
//!   while containers name the request: kubelet is answered with the request alone.
//!
//! - A device that names a MIG partition ([`crate::partitions`]) is an instance to create
//!   (or to share, when another claim holds it already): its consumed memory and compute
//!   are the cap inside the instance, checked against the instance's memory, not the GPU's;
//!   with none, the claim has the whole instance.
//!
//! Anything this node cannot honour is refused: the pod must not start uncapped.

use crate::api::{AllocationResult, Claim};
use crate::checkpoint::CapRecord;
use crate::inventory::GpuInfo;
use crate::partitions::{self, MigGpu, Partition};
use crate::quantity::Quantity;
use crate::slices::{self, COMPUTE, COMPUTE_WHOLE, DRIVER, MEMORY};
use std::collections::BTreeMap;

/// One allocated device of this driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    /// The request it serves, without a subrequest.
    pub request: String,
    pub device: String,
    pub index: u32,
    pub admin: bool,
    pub share_id: Option<String>,
}

/// One allocated MIG partition: the instance, and the claim's cap inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPartition {
    pub request: String,
    pub partition: Partition,
    /// Bytes: the consumed memory, or the instance's.
    pub memory: u64,
    /// Thousandths of a percent of the instance's time; 0: no ceiling.
    pub compute_millipercent: u64,
    /// Allocated with no consumed capacity: the instance is this claim's alone.
    pub exclusive: bool,
    pub share_id: Option<String>,
}

/// What a claim's allocation gives on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    /// One per GPU, by index.
    pub caps: Vec<CapRecord>,
    pub devices: Vec<PlannedDevice>,
    /// The MIG partitions, in the allocation's order.
    pub partitions: Vec<PlannedPartition>,
}

impl ClaimPlan {
    /// Whether any GPU is a tenant's share, which fgpu's device caps.
    pub fn capped(&self) -> bool {
        self.caps.iter().any(|c| !c.admin) || !self.partitions.is_empty()
    }
}

/// The request a result serves: `gpu/small` (a subrequest of a prioritized list) is `gpu`.
pub fn base_request(name: &str) -> &str {
    name.split_once('/').map_or(name, |(request, _)| request)
}

/// Why a claim's allocation cannot be honoured on this node.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("it is not allocated")]
    NotAllocated,
    #[error("device {device} is in pool {pool:?}, not this node's ({node:?})")]
    OtherPool { device: String, pool: String, node: String },
    #[error("device {device} is not on this node (it has {have})")]
    NotHere { device: String, have: String },
    #[error("device {device}: {why}")]
    Device { device: String, why: DeviceProblem },
}

/// What is wrong with one allocated device's result.
#[derive(Debug, thiserror::Error)]
pub enum DeviceProblem {
    #[error("admin access to a MIG partition is not offered (ask for the whole GPU)")]
    AdminOnPartition,
    #[error("consumed capacity {0:?} is not one this driver publishes")]
    UnknownCapacity(String),
    #[error("consumed {name} {value} is not a quantity")]
    NotAQuantity { name: String, value: String },
    #[error("{0}")]
    Quantity(#[from] crate::quantity::QuantityError),
    #[error("negative memory")]
    NegativeMemory,
    #[error("negative compute")]
    NegativeCompute,
    #[error("the allocation consumes no memory")]
    NoMemory,
    /// `within`: "GPU's", "3g.40gb instance's".
    #[error("the allocation consumes {consumed} bytes of memory, more than the {within} {total}")]
    MoreMemory { consumed: u64, within: String, total: u64 },
    #[error("the allocation consumes more than {COMPUTE_WHOLE} compute")]
    MoreCompute,
}

fn consumed(result: &AllocationResult, name: &str) -> Result<Option<Quantity>, DeviceProblem> {
    let Some(value) = result.consumed_capacity.as_ref().and_then(|c| c.get(name)) else { return Ok(None) };
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(DeviceProblem::NotAQuantity { name: name.to_string(), value: other.to_string() }),
    };
    Ok(Some(Quantity::parse(&text)?))
}

/// What one result consumes of a device whose memory is `whole`: the memory (all of it
/// when the result names none), the compute in thousandths of a percent, and whether it
/// names neither (the device is the claim's alone).
struct Consumption {
    memory: u64,
    compute: u64,
    exclusive: bool,
}

fn consumption(r: &AllocationResult, whole: u64) -> Result<Consumption, DeviceProblem> {
    if let Some(other) = r.consumed_capacity.as_ref().and_then(|c| c.keys().find(|k| *k != MEMORY && *k != COMPUTE)) {
        return Err(DeviceProblem::UnknownCapacity(other.clone()));
    }
    let memory = consumed(r, MEMORY)?;
    let compute = consumed(r, COMPUTE)?;
    let exclusive = memory.is_none() && compute.is_none();
    let memory = match memory {
        Some(q) => q.floor_units().ok_or(DeviceProblem::NegativeMemory)?,
        None => whole,
    };
    let compute = match compute {
        Some(q) => q.floor_milli().ok_or(DeviceProblem::NegativeCompute)?,
        None => 0,
    };
    if memory == 0 {
        return Err(DeviceProblem::NoMemory);
    }
    Ok(Consumption { memory, compute, exclusive })
}

/// The cap a result gives inside a partition.
fn partition_plan(r: &AllocationResult, partition: Partition) -> Result<PlannedPartition, DeviceProblem> {
    if r.admin_access == Some(true) {
        return Err(DeviceProblem::AdminOnPartition);
    }
    let Consumption { memory, compute, exclusive } = consumption(r, partition.memory)?;
    if memory > partition.memory {
        return Err(DeviceProblem::MoreMemory { consumed: memory, within: format!("{} instance's", partition.profile), total: partition.memory });
    }
    if compute > COMPUTE_WHOLE * 1000 {
        return Err(DeviceProblem::MoreCompute);
    }
    Ok(PlannedPartition {
        request: base_request(&r.request).to_string(),
        partition,
        memory,
        compute_millipercent: compute,
        exclusive,
        share_id: r.share_id.clone(),
    })
}

/// The plan of `claim` on `node`, whose GPUs are `gpus` and whose partitionable GPUs' MIG
/// is `mig`.
pub fn plan(claim: &Claim, node: &str, gpus: &[GpuInfo], mig: &[MigGpu]) -> Result<ClaimPlan, PlanError> {
    let allocation = claim.status.allocation.as_ref().ok_or(PlanError::NotAllocated)?;
    let mut caps: BTreeMap<u32, CapRecord> = BTreeMap::new();
    let mut devices = Vec::new();
    let mut planned = Vec::new();
    let have = || if gpus.is_empty() { "no GPU".into() } else { gpus.iter().map(|g| slices::device_name(g.index)).collect::<Vec<_>>().join(", ") };
    for r in allocation.devices.results.iter().filter(|r| r.driver == DRIVER) {
        let device = format!("{}/{}", r.pool, r.device);
        if r.pool != node {
            return Err(PlanError::OtherPool { device, pool: r.pool.clone(), node: node.to_string() });
        }
        let problem = |why: DeviceProblem| PlanError::Device { device: device.clone(), why };
        if let Some(partition) = partitions::find(mig, &r.device) {
            planned.push(partition_plan(r, partition).map_err(problem)?);
            continue;
        }
        let Some(gpu) = slices::device_index(&r.device).and_then(|i| gpus.iter().find(|g| g.index == i)) else {
            return Err(PlanError::NotHere { device, have: have() });
        };
        let admin = r.admin_access == Some(true);
        devices.push(PlannedDevice {
            request: base_request(&r.request).to_string(),
            device: r.device.clone(),
            index: gpu.index,
            admin,
            share_id: r.share_id.clone(),
        });
        let cap = caps.entry(gpu.index).or_insert_with(|| CapRecord {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            total: gpu.total,
            memory: 0,
            compute_millipercent: Some(0),
            exclusive: false,
            admin: true,
        });
        if admin {
            // The whole GPU, uncounted, unless a tenant's share of it is in the claim too.
            if cap.admin {
                cap.memory = gpu.total;
            }
            continue;
        }
        let Consumption { memory, compute, exclusive } = consumption(r, gpu.total).map_err(problem)?;
        if cap.admin {
            // The first tenant's share of this GPU in the claim.
            *cap = CapRecord { memory: 0, compute_millipercent: Some(0), admin: false, ..cap.clone() };
        }
        cap.exclusive |= exclusive;
        cap.memory = cap.memory.saturating_add(memory);
        cap.compute_millipercent = cap.compute_millipercent.map(|c| c.saturating_add(compute));
        if cap.memory > gpu.total {
            return Err(problem(DeviceProblem::MoreMemory { consumed: cap.memory, within: "GPU's".into(), total: gpu.total }));
        }
        if cap.compute_millipercent.unwrap_or(0) > COMPUTE_WHOLE * 1000 {
            return Err(problem(DeviceProblem::MoreCompute));
        }
    }
    Ok(ClaimPlan { caps: caps.into_values().collect(), devices, partitions: planned })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AllocatedDevices, Allocation, ClaimStatus};

    const GIB: u64 = 1 << 30;

    fn gpus() -> Vec<GpuInfo> {
        (0..2).map(|i| GpuInfo { index: i, uuid: format!("GPU-{i}"), product: "H100".into(), total: 80 * GIB }).collect()
    }

    fn result(device: &str, consumed: &[(&str, serde_json::Value)]) -> AllocationResult {
        AllocationResult {
            request: "gpu".into(),
            admin_access: None,
            driver: DRIVER.into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: Some("s".into()),
            consumed_capacity: (!consumed.is_empty()).then(|| consumed.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()),
        }
    }

    fn claim(results: Vec<AllocationResult>) -> Claim {
        Claim { status: ClaimStatus { allocation: Some(Allocation { devices: AllocatedDevices { results } }), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn consumed_memory_and_compute_are_the_caps() {
        let c = claim(vec![result("gpu-1", &[("memory", "8Gi".into()), ("compute", "30".into())])]);
        let p = plan(&c, "node-a", &gpus(), &[]).unwrap();
        let cap =
            CapRecord { index: 1, uuid: "GPU-1".into(), total: 80 * GIB, memory: 8 * GIB, compute_millipercent: Some(30_000), exclusive: false, admin: false };
        assert_eq!(p.caps, [cap]);
        assert_eq!(p.devices, [PlannedDevice { request: "gpu".into(), device: "gpu-1".into(), index: 1, admin: false, share_id: Some("s".into()) }]);
    }

    #[test]
    fn no_consumed_capacity_is_the_whole_gpu_alone() {
        let p = plan(&claim(vec![result("gpu-0", &[])]), "node-a", &gpus(), &[]).unwrap();
        assert_eq!((p.caps[0].memory, p.caps[0].compute_millipercent, p.caps[0].exclusive), (80 * GIB, Some(0), true));
    }

    #[test]
    fn subrequests_answer_as_their_request() {
        let mut r = result("gpu-0", &[("memory", "4Gi".into())]);
        r.request = "gpu/small".into();
        let p = plan(&claim(vec![r]), "node-a", &gpus(), &[]).unwrap();
        assert_eq!(p.devices[0].request, "gpu");
        assert_eq!(base_request("gpu"), "gpu");
    }

    #[test]
    fn admin_access_is_the_whole_gpu_uncounted() {
        let mut r = result("gpu-0", &[]);
        r.admin_access = Some(true);
        let p = plan(&claim(vec![r.clone()]), "node-a", &gpus(), &[]).unwrap();
        assert!(!p.capped());
        assert_eq!((p.caps[0].admin, p.caps[0].memory, p.caps[0].exclusive), (true, 80 * GIB, false));
        assert!(p.devices[0].admin);
        // Beside a tenant's share of another GPU: that one is capped, this one whole.
        let p = plan(&claim(vec![r, result("gpu-1", &[("memory", "8Gi".into())])]), "node-a", &gpus(), &[]).unwrap();
        assert!(p.capped());
        assert_eq!(p.caps.iter().map(|c| (c.admin, c.memory)).collect::<Vec<_>>(), [(true, 80 * GIB), (false, 8 * GIB)]);
    }

    #[test]
    fn two_shares_of_one_gpu_in_one_claim_add_up() {
        let mut second = result("gpu-0", &[("memory", "2Gi".into()), ("compute", 10.into())]);
        second.request = "aux".into();
        let c = claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("compute", "30".into())]), second]);
        let p = plan(&c, "node-a", &gpus(), &[]).unwrap();
        assert_eq!((p.caps.len(), p.caps[0].memory, p.caps[0].compute_millipercent), (1, 10 * GIB, Some(40_000)));
        assert_eq!(p.devices.len(), 2);
    }

    #[test]
    fn other_drivers_are_left_to_them() {
        let mut other = result("gpu-9", &[]);
        other.driver = "gpu.nvidia.com".into();
        let p = plan(&claim(vec![other]), "node-a", &gpus(), &[]).unwrap();
        assert!(p.caps.is_empty() && p.devices.is_empty());
    }

    #[test]
    fn what_this_node_cannot_honour_is_refused() {
        let err = |c: Claim| plan(&c, "node-a", &gpus(), &[]).unwrap_err().to_string();
        assert!(err(claim(vec![result("gpu-7", &[])])).contains("gpu-7 is not on this node (it has gpu-0, gpu-1)"));
        assert!(err(claim(vec![result("mig-0", &[])])).contains("not on this node"));
        let mut elsewhere = result("gpu-0", &[]);
        elsewhere.pool = "node-b".into();
        assert!(err(claim(vec![elsewhere])).contains("not this node's"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "81Gi".into())])])).contains("more than the GPU"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "0".into())])])).contains("no memory"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("compute", "101".into())])])).contains("more than 100"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("cores", "4".into())])])).contains("\"cores\""));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "eight".into())])])).contains("not a Kubernetes quantity"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", serde_json::json!([1]))])])).contains("not a quantity"));
        assert!(err(Claim::default()).contains("not allocated"));
    }

    fn a100() -> Vec<MigGpu> {
        let profile = |name: &str, id, slices, memory_mib, placements: Vec<(u32, u32)>| partitions::MigProfile {
            name: name.into(),
            id,
            slices,
            memory_mib,
            sms: 14 * slices,
            placements,
            copy_engines: slices,
            decoders: 0,
            encoders: 0,
            jpegs: 0,
            ofas: 0,
        };
        vec![MigGpu {
            index: 0,
            uuid: "GPU-0".into(),
            mig: Some(partitions::MigMode { current: true, pending: true }),
            profiles: vec![profile("1g.10gb", 19, 1, 9728, (0..7).map(|s| (s, 1)).collect()), profile("3g.40gb", 9, 3, 40192, vec![(0, 4), (4, 4)])],
        }]
    }

    #[test]
    fn a_partition_is_an_instance_and_its_consumed_capacity_the_cap_inside_it() {
        let c = claim(vec![result("gpu-0-mig-1g-10gb-6", &[("memory", "4Gi".into()), ("compute", "50".into())])]);
        let p = plan(&c, "node-a", &gpus(), &a100()).unwrap();
        assert!(p.caps.is_empty() && p.devices.is_empty() && p.capped());
        let pp = &p.partitions[0];
        assert_eq!((pp.partition.start, pp.partition.size, pp.partition.profile_id), (6, 1, 19));
        assert_eq!((pp.memory, pp.compute_millipercent, pp.exclusive), (4 * GIB, 50_000, false));
        // With no consumed capacity, the whole instance.
        let p = plan(&claim(vec![result("gpu-0-mig-3g-40gb-4", &[])]), "node-a", &gpus(), &a100()).unwrap();
        assert_eq!((p.partitions[0].memory, p.partitions[0].exclusive), (40192 << 20, true));
        // The instance's memory bounds the cap, not the GPU's 80 GiB.
        let err = plan(&claim(vec![result("gpu-0-mig-1g-10gb-6", &[("memory", "10Gi".into())])]), "node-a", &gpus(), &a100()).unwrap_err().to_string();
        assert!(err.contains("more than the 1g.10gb instance's"), "{err}");
        // A placement the profile does not have is not on this node.
        let err = plan(&claim(vec![result("gpu-0-mig-3g-40gb-1", &[])]), "node-a", &gpus(), &a100()).unwrap_err().to_string();
        assert!(err.contains("not on this node"), "{err}");
        let mut admin = result("gpu-0-mig-3g-40gb-4", &[]);
        admin.admin_access = Some(true);
        assert!(plan(&claim(vec![admin]), "node-a", &gpus(), &a100()).unwrap_err().to_string().contains("admin access"));
    }
}
