//! The node's own account of each GPU: the prepared claims (tenants' shares, not admin
//! access) never consume more than the GPU's published capacity, whatever the scheduler
//! wrote. The scheduler keeps to it already; this is the check on the node that a stale or
//! hand-written allocation, or a change of `--memory-reserve`, cannot get past.
//!
//! - The `memory` consumed by the claims on a GPU sums to at most its published `memory`
//!   capacity, and their `compute` to at most 100.
//! - A claim with no consumed capacity holds its GPU alone: nothing else is prepared beside
//!   it, and it is not prepared beside anything.
//! - A claim reserved for several pods is prepared once, and counts once.
//!
//! GPUs are told apart by UUID, so an index that changed at a reboot changes nothing.

use crate::checkpoint::{CapRecord, PreparedClaim};
use crate::quantity::format_bytes;
use crate::slices::{self, MemoryPolicy, COMPUTE_WHOLE};
use crate::status::GpuUse;
use std::collections::BTreeMap;

/// What the claims other than `uid` hold on the GPU of `cap`.
fn others<'a>(prepared: &'a BTreeMap<String, PreparedClaim>, uid: &str, uuid: &'a str) -> impl Iterator<Item = (&'a PreparedClaim, &'a CapRecord)> + 'a {
    let uid = uid.to_string();
    prepared.iter().filter(move |(u, _)| **u != uid).flat_map(move |(_, c)| c.caps.iter().filter(move |k| k.uuid == uuid && !k.admin).map(move |k| (c, k)))
}

fn names<'a>(claims: impl Iterator<Item = &'a PreparedClaim>) -> String {
    claims.map(|c| format!("{}/{}", c.namespace, c.name)).collect::<Vec<_>>().join(", ")
}

fn percent(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        format!("{}", milli / 1000)
    } else {
        format!("{:.3}", milli as f64 / 1000.0)
    }
}

/// Why a claim does not fit beside the claims prepared on its GPU; `gpu` names the GPU
/// (`GPU gpu-0 (GPU-...)`), `beside` the claims prepared on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error("{gpu} is held whole by ResourceClaim {holder} (allocated with no consumed capacity)")]
    HeldWhole { gpu: String, holder: String },
    #[error("{gpu} is allocated whole to this claim (no consumed capacity), but ResourceClaim {beside} {} prepared on it", if *.count == 1 { "is" } else { "are" })]
    AllocatedWhole { gpu: String, beside: String, count: usize },
    #[error("{gpu}: the claims prepared on it ({beside}) consume {} of its {} memory capacity, and this claim asks {} more", format_bytes(*.used), format_bytes(*.capacity), format_bytes(*.asked))]
    Memory { gpu: String, beside: String, used: u64, capacity: u64, asked: u64 },
    #[error("{gpu}: the claims prepared on it ({beside}) consume {} of its {COMPUTE_WHOLE} compute, and this claim asks {} more", percent(*.used), percent(*.asked))]
    Compute { gpu: String, beside: String, used: u64, asked: u64 },
}

/// Whether `claim` (UID `uid`) fits beside the claims `prepared` on this node; the reason
/// when it does not.
pub fn check(prepared: &BTreeMap<String, PreparedClaim>, uid: &str, claim: &PreparedClaim, policy: &MemoryPolicy) -> Result<(), CapacityError> {
    for cap in claim.caps.iter().filter(|c| !c.admin) {
        let gpu = format!("GPU {} ({})", slices::device_name(cap.index), cap.uuid);
        let beside: Vec<(&PreparedClaim, &CapRecord)> = others(prepared, uid, &cap.uuid).collect();
        if beside.is_empty() {
            continue;
        }
        if let Some((holder, _)) = beside.iter().find(|(_, k)| k.exclusive) {
            return Err(CapacityError::HeldWhole { gpu, holder: format!("{}/{}", holder.namespace, holder.name) });
        }
        let names_beside = names(beside.iter().map(|(c, _)| *c));
        if cap.exclusive {
            return Err(CapacityError::AllocatedWhole { gpu, beside: names_beside, count: beside.len() });
        }
        let capacity = policy.capacity(cap.total);
        let memory: u64 = beside.iter().map(|(_, k)| k.memory).sum();
        if memory.saturating_add(cap.memory) > capacity {
            return Err(CapacityError::Memory { gpu, beside: names_beside, used: memory, capacity, asked: cap.memory });
        }
        let compute: u64 = beside.iter().map(|(_, k)| k.compute_millipercent.unwrap_or(0)).sum();
        let asked = cap.compute_millipercent.unwrap_or(0);
        if compute.saturating_add(asked) > COMPUTE_WHOLE * 1000 {
            return Err(CapacityError::Compute { gpu, beside: names_beside, used: compute, asked });
        }
    }
    Ok(())
}

/// Per GPU, what the prepared claims hold (for the status).
pub fn usage(prepared: &BTreeMap<String, PreparedClaim>, policy: &MemoryPolicy) -> Vec<GpuUse> {
    let mut by_uuid: BTreeMap<String, GpuUse> = BTreeMap::new();
    for claim in prepared.values() {
        for cap in claim.caps.iter().filter(|c| !c.admin) {
            let u = by_uuid.entry(cap.uuid.clone()).or_insert_with(|| GpuUse {
                device: slices::device_name(cap.index),
                uuid: cap.uuid.clone(),
                memory_capacity: policy.capacity(cap.total),
                ..Default::default()
            });
            u.memory_used = u.memory_used.saturating_add(cap.memory);
            u.compute_used_millipercent = u.compute_used_millipercent.saturating_add(cap.compute_millipercent.unwrap_or(0));
            u.exclusive |= cap.exclusive;
            u.claims.push(format!("{}/{}", claim.namespace, claim.name));
        }
    }
    by_uuid.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const POLICY: MemoryPolicy = MemoryPolicy { reserve: 512 * MIB, step: 256 * MIB };

    fn claim(name: &str, caps: &[(u32, u64, u64, bool, bool)]) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: name.into(),
            caps: caps
                .iter()
                .map(|&(index, memory, compute, exclusive, admin)| CapRecord {
                    index,
                    uuid: format!("GPU-{index}"),
                    total: 80 * GIB,
                    memory,
                    compute_millipercent: Some(compute * 1000),
                    exclusive,
                    admin,
                })
                .collect(),
            devices: Vec::new(),
            served_ledger: true,
            mig: Vec::new(),
        }
    }

    fn prepared(claims: &[(&str, PreparedClaim)]) -> BTreeMap<String, PreparedClaim> {
        claims.iter().map(|(u, c)| (u.to_string(), c.clone())).collect()
    }

    #[test]
    fn shares_fit_up_to_the_published_capacity() {
        let capacity = POLICY.capacity(80 * GIB);
        let p = prepared(&[("a", claim("a", &[(0, 40 * GIB, 30, false, false)]))]);
        assert!(check(&p, "b", &claim("b", &[(0, capacity - 40 * GIB, 70, false, false)]), &POLICY).is_ok());
        let err = check(&p, "b", &claim("b", &[(0, capacity - 40 * GIB + MIB, 10, false, false)]), &POLICY).unwrap_err().to_string();
        assert!(err.contains("GPU gpu-0 (GPU-0)") && err.contains("(ml/a) consume 40Gi of its 81408Mi memory capacity"), "{err}");
        let err = check(&p, "b", &claim("b", &[(0, GIB, 71, false, false)]), &POLICY).unwrap_err().to_string();
        assert!(err.contains("consume 30 of its 100 compute, and this claim asks 71 more"), "{err}");
        // Another GPU is another account.
        assert!(check(&p, "b", &claim("b", &[(1, capacity, 100, false, false)]), &POLICY).is_ok());
    }

    #[test]
    fn a_claim_counts_once_and_preparing_it_again_fits() {
        let capacity = POLICY.capacity(80 * GIB);
        let a = claim("a", &[(0, capacity, 100, false, false)]);
        let p = prepared(&[("a", a.clone())]);
        assert!(check(&p, "a", &a, &POLICY).is_ok());
    }

    #[test]
    fn a_whole_gpu_is_alone() {
        let whole = claim("whole", &[(0, 80 * GIB, 0, true, false)]);
        let share = claim("share", &[(0, GIB, 0, false, false)]);
        let err = check(&prepared(&[("w", whole.clone())]), "s", &share, &POLICY).unwrap_err().to_string();
        assert!(err.contains("held whole by ResourceClaim ml/whole"), "{err}");
        let err = check(&prepared(&[("s", share)]), "w", &whole, &POLICY).unwrap_err().to_string();
        assert!(err.contains("allocated whole to this claim") && err.contains("ml/share is prepared"), "{err}");
        assert!(check(&BTreeMap::new(), "w", &whole, &POLICY).is_ok());
    }

    #[test]
    fn admin_access_is_not_counted() {
        let admin = claim("admin", &[(0, 80 * GIB, 0, false, true)]);
        let whole = claim("whole", &[(0, 80 * GIB, 0, true, false)]);
        assert!(check(&prepared(&[("ad", admin.clone())]), "w", &whole, &POLICY).is_ok());
        assert!(check(&prepared(&[("w", whole.clone())]), "ad", &admin, &POLICY).is_ok());
        let u = usage(&prepared(&[("w", whole), ("ad", admin)]), &POLICY);
        assert_eq!((u.len(), u[0].claims.clone(), u[0].exclusive), (1, vec!["ml/whole".to_string()], true));
    }
}
