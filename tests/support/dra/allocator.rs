//! A stub of the scheduler's DRA allocator, for one claim of one device at a time, written
//! from Kubernetes' structured allocator (staging/src/k8s.io/dynamic-resource-allocation/
//! structured/internal/experimental/allocator_experimental.go, consumable_capacity.go), not
//! from the driver's code:
//!
//! - a pool is used only whole: every slice of its newest generation present;
//! - devices are tried in the order of the pool's slices, the first that fits is taken;
//! - a device matches when its attributes have the asked values (what a DeviceClass's or a
//!   request's CEL such as `device.attributes["gpu.fgpu.io"].profile == "3g.40gb"` says);
//! - a device that does not allow multiple allocations is taken by one claim at a time;
//! - a device that consumes counters is taken only while every counter it consumes is
//!   left in its counter set, the sets' values less what every allocated device consumes,
//!   each allocated device once, however many claims share it (`checkAvailableCounters`,
//!   with kubernetes#139040); a shareable device already allocated is not checked again
//!   (kubernetes#134103);
//! - a shareable device (`allowMultipleAllocations`) takes a claim while, for each of its
//!   capacities with a request policy, what the claim asks (else the policy's default),
//!   rounded up to the policy's step and at least its min, fits beside what the claims
//!   already on it consume; the allocation gets a `shareID` and the `consumedCapacity`.
//!
//! The claim it writes (with [`super::claim_json`]) is what the plugin reads at prepare.

use super::validation::quantity;
use super::{claim_json, Alloc, StubApi};
use serde_json::Value;
use std::collections::BTreeMap;

/// What one claim asks: one device whose attributes have these values, and capacity (such
/// as `4Gi` of `memory`) where it names some.
#[derive(Debug, Clone, Default)]
pub struct Ask<'a> {
    pub attributes: Vec<(&'a str, Value)>,
    pub memory: Option<&'a str>,
    pub compute: Option<&'a str>,
}

/// Units of a quantity (rounded up, as the allocator does for consumed capacity).
fn units(text: &str) -> Option<i128> {
    quantity(text).map(|n| (n + 999_999_999).div_euclid(1_000_000_000))
}

fn counters(v: &Value) -> BTreeMap<String, i128> {
    v.as_object().into_iter().flatten().filter_map(|(k, c)| Some((k.clone(), units(c["value"].as_str()?)?))).collect()
}

/// The newest generation of `pool`'s slices, if every one of them is there.
fn whole_pool(slices: &BTreeMap<String, Value>, pool: &str) -> Result<Vec<Value>, String> {
    let of_pool: Vec<&Value> = slices.values().filter(|s| s.pointer("/spec/pool/name").and_then(Value::as_str) == Some(pool)).collect();
    let generation =
        of_pool.iter().filter_map(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64)).max().ok_or(format!("no slice of pool {pool}"))?;
    let newest: Vec<Value> = of_pool.into_iter().filter(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64) == Some(generation)).cloned().collect();
    let count = newest[0].pointer("/spec/pool/resourceSliceCount").and_then(Value::as_i64).unwrap_or(0);
    if newest.len() as i64 != count {
        return Err(format!("pool {pool} is incomplete: {} of {count} slices at generation {generation}", newest.len()));
    }
    Ok(newest)
}

/// Where a device stands among the allocated claims.
#[derive(Default)]
struct Held {
    exclusive: bool,
    /// Per capacity, what the claims sharing it consume.
    shared: Option<BTreeMap<String, i128>>,
}

fn held(claims: &[Value], pool: &str) -> BTreeMap<String, Held> {
    let mut out: BTreeMap<String, Held> = BTreeMap::new();
    for claim in claims {
        for r in claim.pointer("/status/allocation/devices/results").and_then(Value::as_array).into_iter().flatten() {
            if r["pool"] != pool || r["driver"] != "gpu.fgpu.io" || r["adminAccess"] == true {
                continue;
            }
            let h = out.entry(r["device"].as_str().unwrap_or("").to_string()).or_default();
            if r.get("shareID").is_some_and(|s| !s.is_null()) {
                let shared = h.shared.get_or_insert_with(BTreeMap::new);
                for (k, v) in r["consumedCapacity"].as_object().into_iter().flatten() {
                    *shared.entry(k.clone()).or_default() += v.as_str().and_then(units).unwrap_or(0);
                }
            } else {
                h.exclusive = true;
            }
        }
    }
    out
}

fn matches(device: &Value, ask: &Ask) -> bool {
    ask.attributes.iter().all(|(k, want)| {
        let a = &device["attributes"][*k];
        ["string", "int", "bool", "version"].iter().any(|t| a.get(*t) == Some(want))
    })
}

/// What the claim consumes of a shareable device's capacities, if it fits.
fn consumed(device: &Value, ask: &Ask, already: &BTreeMap<String, i128>) -> Option<BTreeMap<String, i128>> {
    let mut out = BTreeMap::new();
    for (name, cap) in device["capacity"].as_object().into_iter().flatten() {
        let Some(policy) = cap.get("requestPolicy").filter(|p| !p.is_null()) else { continue };
        let value = units(cap["value"].as_str()?)?;
        let asked = match name.as_str() {
            "memory" => ask.memory,
            "compute" => ask.compute,
            _ => None,
        };
        let mut amount = match asked {
            Some(a) => units(a)?,
            None => policy["default"].as_str().and_then(units).unwrap_or(value),
        };
        if let Some(range) = policy.get("validRange") {
            let min = range["min"].as_str().and_then(units).unwrap_or(0);
            amount = amount.max(min);
            if let Some(step) = range["step"].as_str().and_then(units).filter(|s| *s > 0) {
                amount = min + (amount - min + step - 1).div_euclid(step) * step;
            }
            if range["max"].as_str().and_then(units).is_some_and(|max| amount > max) {
                return None;
            }
        }
        if already.get(name).copied().unwrap_or(0) + amount > value {
            return None;
        }
        out.insert(name.clone(), amount);
    }
    Some(out)
}

/// Allocates one device of `pool` to the claim `namespace/name` (UID `uid`) as the
/// scheduler would, and stores the allocated claim in the stub: the device, or why none.
pub fn allocate(api: &StubApi, pool: &str, namespace: &str, name: &str, uid: &str, ask: &Ask) -> Result<String, String> {
    let (slices, claims) = {
        let s = api.state.lock().unwrap();
        (s.slices.clone(), s.claims.values().cloned().collect::<Vec<Value>>())
    };
    let slices = whole_pool(&slices, pool)?;
    let held = held(&claims, pool);
    // Each counter set, less what the allocated devices consume, once each.
    let mut left: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
    for s in &slices {
        for set in s.pointer("/spec/sharedCounters").and_then(Value::as_array).into_iter().flatten() {
            left.insert(set["name"].as_str().unwrap_or("").to_string(), counters(&set["counters"]));
        }
    }
    let devices: Vec<&Value> = slices.iter().flat_map(|s| s.pointer("/spec/devices").and_then(Value::as_array).into_iter().flatten()).collect();
    for d in devices.iter().filter(|d| held.contains_key(d["name"].as_str().unwrap_or(""))) {
        for c in d.get("consumesCounters").and_then(Value::as_array).into_iter().flatten() {
            let set = left.entry(c["counterSet"].as_str().unwrap_or("").to_string()).or_default();
            for (k, v) in counters(&c["counters"]) {
                *set.entry(k).or_default() -= v;
            }
        }
    }
    let mut refusals = Vec::new();
    for d in devices.iter().filter(|d| matches(d, ask)) {
        let device = d["name"].as_str().unwrap_or("");
        let h = held.get(device);
        let multiple = d["allowMultipleAllocations"] == true;
        if h.is_some_and(|h| h.exclusive) || (!multiple && h.is_some()) {
            refusals.push(format!("{device}: in use"));
            continue;
        }
        let first = h.is_none();
        if first {
            let short = d.get("consumesCounters").and_then(Value::as_array).into_iter().flatten().find_map(|c| {
                let set = left.get(c["counterSet"].as_str().unwrap_or(""))?;
                counters(&c["counters"]).into_iter().find(|(k, v)| set.get(k).copied().unwrap_or(0) < *v).map(|(k, _)| k)
            });
            if let Some(counter) = short {
                refusals.push(format!("{device}: insufficient counter {counter}"));
                continue;
            }
        }
        let alloc = if multiple {
            let already = h.and_then(|h| h.shared.clone()).unwrap_or_default();
            let Some(take) = consumed(d, ask, &already) else {
                refusals.push(format!("{device}: insufficient capacity"));
                continue;
            };
            Some((take.get("memory").map(i128::to_string), take.get("compute").map(i128::to_string)))
        } else {
            None
        };
        let (memory, compute) = alloc.unwrap_or((None, None));
        let a = Alloc::new(pool, device, memory.as_deref(), compute.as_deref());
        api.add_claim(claim_json(namespace, name, uid, Some(&[a]), &["pod"]));
        return Ok(device.to_string());
    }
    Err(format!("cannot allocate claim {namespace}/{name}: {}", if refusals.is_empty() { "no device matches".to_string() } else { refusals.join("; ") }))
}
