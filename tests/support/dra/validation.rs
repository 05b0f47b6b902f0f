//! What the Kubernetes API server does to a ResourceSlice before it stores it, for the
//! stub: the fields of disabled feature gates are dropped (pkg/registry/resource/
//! resourceslice/strategy.go, `dropDisabled...Fields`: dropped unless the stored slice
//! already uses them), then the slice is validated (pkg/apis/resource/validation,
//! `ValidateResourceSlice`, `ValidateResourceSliceUpdate`): one wrong device refuses the
//! whole slice. Written from the API server's rules, not from the driver's code.

use serde_json::{Map, Value};

/// The feature gates of the API server that bear on a ResourceSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gates {
    /// DRAConsumableCapacity: `allowMultipleAllocations`, `capacity.*.requestPolicy`
    /// (alpha in 1.34 and 1.35, off by default; beta and on from 1.36).
    pub consumable_capacity: bool,
    /// DRAPartitionableDevices: `sharedCounters`, `perDeviceNodeSelection`, a device's
    /// `consumesCounters`, `nodeName`, `nodeSelector`, `allNodes`.
    pub partitionable_devices: bool,
    /// DRADeviceTaints: a device's `taints`.
    pub device_taints: bool,
}

impl Gates {
    /// Kubernetes 1.34's defaults: every one of these gates is alpha, off.
    pub const V1_34: Gates = Gates { consumable_capacity: false, partitionable_devices: false, device_taints: false };
    /// Every gate on.
    pub const ALL: Gates = Gates { consumable_capacity: true, partitionable_devices: true, device_taints: true };
}

fn devices(slice: &Value) -> impl Iterator<Item = &Value> {
    slice.pointer("/spec/devices").and_then(Value::as_array).into_iter().flatten()
}

fn uses_consumable_capacity(slice: &Value) -> bool {
    devices(slice).any(|d| {
        d.get("allowMultipleAllocations").is_some_and(|v| !v.is_null())
            || d["capacity"].as_object().into_iter().flatten().any(|(_, c)| c.get("requestPolicy").is_some_and(|p| !p.is_null()))
    })
}

fn uses_partitionable_devices(slice: &Value) -> bool {
    let spec = &slice["spec"];
    spec.get("sharedCounters").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        || spec.get("perDeviceNodeSelection").is_some_and(|v| !v.is_null())
        || devices(slice).any(|d| {
            d.get("consumesCounters").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
                || ["nodeName", "nodeSelector", "allNodes"].iter().any(|k| d.get(*k).is_some_and(|v| !v.is_null()))
        })
}

fn uses_taints(slice: &Value) -> bool {
    devices(slice).any(|d| d.get("taints").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())))
}

fn for_each_device(slice: &mut Value, mut f: impl FnMut(&mut Map<String, Value>)) {
    if let Some(list) = slice.pointer_mut("/spec/devices").and_then(Value::as_array_mut) {
        for d in list.iter_mut().filter_map(Value::as_object_mut) {
            f(d);
        }
    }
}

/// Drops what a disabled gate does not allow, unless `old` (the stored slice, on an update)
/// uses it already.
pub fn drop_disabled(slice: &mut Value, old: Option<&Value>, gates: Gates) {
    if !gates.consumable_capacity && !old.is_some_and(uses_consumable_capacity) {
        for_each_device(slice, |d| {
            d.remove("allowMultipleAllocations");
            if let Some(caps) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                for c in caps.values_mut().filter_map(Value::as_object_mut) {
                    c.remove("requestPolicy");
                }
            }
        });
    }
    if !gates.partitionable_devices && !old.is_some_and(uses_partitionable_devices) {
        if let Some(spec) = slice.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("sharedCounters");
            spec.remove("perDeviceNodeSelection");
        }
        for_each_device(slice, |d| {
            for k in ["consumesCounters", "nodeName", "nodeSelector", "allNodes"] {
                d.remove(k);
            }
        });
    }
    if !gates.device_taints && !old.is_some_and(uses_taints) {
        for_each_device(slice, |d| {
            d.remove("taints");
        });
    }
}

/// A Kubernetes quantity in billionths (`1n`), as the API server parses it: an optional
/// sign, a decimal number, and a binary (Ki..Ei), decimal (n u m k M G T P E) or exponent
/// (e3) suffix.
pub fn quantity(text: &str) -> Option<i128> {
    let (sign, rest) = match text.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(end);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let (mul, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        s => (1, s.strip_prefix(['e', 'E'])?.parse().ok()?),
    };
    let digits: i128 = format!("{whole}{frac}").parse().ok()?;
    let power = exp10 + 9 - frac.len() as i32;
    let scaled = digits.checked_mul(mul)?;
    let nanos = if power >= 0 {
        scaled.checked_mul(10i128.checked_pow(power as u32)?)?
    } else {
        (scaled + 10i128.pow((-power) as u32) - 1) / 10i128.pow((-power) as u32)
    };
    Some(sign * nanos)
}

/// `Quantity.Value()`: whole units, rounded up.
fn units(nanos: i128) -> i128 {
    (nanos + 999_999_999).div_euclid(1_000_000_000)
}

fn dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !s.starts_with('-') && !s.ends_with('-')
}

fn dns_subdomain(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.split('.').all(dns_label)
}

fn c_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        None => c_identifier(s),
        Some((domain, name)) => dns_subdomain(domain, 63) && c_identifier(name),
    }
}

fn semver(s: &str) -> bool {
    let core = s.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p.len() == 1 || !p.starts_with('0'))) && s.len() <= 64
}

fn request_policy(path: &str, value: i128, policy: &Value) -> Result<(), String> {
    let q = |v: &Value, what: &str| v.as_str().and_then(quantity).ok_or_else(|| format!("{path}.{what}: Invalid value: not a quantity"));
    let default = policy.get("default").filter(|d| !d.is_null());
    let values = policy.get("validValues").and_then(Value::as_array).filter(|v| !v.is_empty());
    let range = policy.get("validRange").filter(|r| !r.is_null());
    match (values, range) {
        (Some(_), Some(_)) => {
            Err(format!("{path}: Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time"))
        }
        (Some(options), None) => {
            let default = q(default.ok_or_else(|| format!("{path}.default: Required value: required when validValues is defined"))?, "default")?;
            let options: Vec<i128> = options.iter().map(|o| q(o, "validValues")).collect::<Result<_, _>>()?;
            if options.windows(2).any(|w| w[0] > w[1]) {
                return Err(format!("{path}.validValues: Invalid value: values must be sorted in ascending order"));
            }
            if options.iter().any(|&o| o > value) {
                return Err(format!("{path}.validValues: Invalid value: option is larger than capacity value"));
            }
            if !options.contains(&default) {
                return Err(format!("{path}.validValues: Invalid value: default value is not valid according to the requestPolicy"));
            }
            Ok(())
        }
        (None, Some(range)) => {
            let default = q(default.ok_or_else(|| format!("{path}.default: Required value: required when validRange is defined"))?, "default")?;
            let min = q(
                range
                    .get("min")
                    .filter(|m| !m.is_null())
                    .ok_or_else(|| format!("{path}.validRange.min: Required value: required when validRange is defined"))?,
                "validRange.min",
            )?;
            if min > value {
                return Err(format!("{path}.validRange.min: Invalid value: min is larger than capacity value"));
            }
            if default < min {
                return Err(format!("{path}.validRange.min: Invalid value: default is less than min"));
            }
            let max = range.get("max").filter(|m| !m.is_null()).map(|m| q(m, "validRange.max")).transpose()?;
            if let Some(max) = max {
                if min > max {
                    return Err(format!("{path}.validRange.max: Invalid value: min is larger than max"));
                }
                if max > value {
                    return Err(format!("{path}.validRange.max: Invalid value: max is larger than capacity value"));
                }
                if default > max {
                    return Err(format!("{path}.validRange.max: Invalid value: default is more than max"));
                }
            }
            if let Some(step) = range.get("step").filter(|s| !s.is_null()).map(|s| q(s, "validRange.step")).transpose()? {
                if min + step > value {
                    return Err(format!("{path}.validRange.step: Invalid value: one step is larger than capacity value"));
                }
                let step_units = units(step);
                for (what, v) in std::iter::once(("default", default)).chain(max.map(|m| ("max", m))) {
                    if step_units == 0 || (units(v) - units(min)) % step_units != 0 {
                        return Err(format!("{path}.validRange.step: Invalid value: {what} is not a multiple of a given step from min"));
                    }
                }
            }
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

fn device(i: usize, d: &Value) -> Result<(), String> {
    let path = format!("spec.devices[{i}]");
    let name = d["name"].as_str().unwrap_or("");
    if !dns_label(name) {
        return Err(format!("{path}.name: Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"));
    }
    let attributes = d["attributes"].as_object().cloned().unwrap_or_default();
    let capacity = d["capacity"].as_object().cloned().unwrap_or_default();
    if attributes.len() + capacity.len() > 32 {
        return Err(format!("{path}: Invalid value: the total number of attributes and capacities must not exceed 32"));
    }
    for (key, a) in &attributes {
        if !qualified_name(key) {
            return Err(format!("{path}.attributes[{key}]: Invalid value: not a qualified name"));
        }
        let set: Vec<&str> = ["bool", "int", "string", "version"].into_iter().filter(|t| a.get(*t).is_some_and(|v| !v.is_null())).collect();
        if set.len() != 1 {
            return Err(format!("{path}.attributes[{key}]: Invalid value: exactly one value must be specified"));
        }
        if a["string"].as_str().is_some_and(|s| s.len() > 64) {
            return Err(format!("{path}.attributes[{key}].string: Too long: may not be more than 64 bytes"));
        }
        if let Some(v) = a["version"].as_str() {
            if !semver(v) {
                return Err(format!("{path}.attributes[{key}].version: Invalid value: {v:?}: must be a string compatible with semver.org spec 2.0.0"));
            }
        }
    }
    let multiple = d["allowMultipleAllocations"] == Value::Bool(true);
    for (key, c) in &capacity {
        if !qualified_name(key) {
            return Err(format!("{path}.capacity[{key}]: Invalid value: not a qualified name"));
        }
        let value = c["value"].as_str().and_then(quantity).ok_or_else(|| format!("{path}.capacity[{key}].value: Required value"))?;
        let Some(policy) = c.get("requestPolicy").filter(|p| !p.is_null()) else { continue };
        if !multiple {
            return Err(format!("{path}.capacity[{key}].requestPolicy: Forbidden: allowMultipleAllocations must be true"));
        }
        request_policy(&format!("{path}.capacity[{key}].requestPolicy"), value, policy)?;
    }
    Ok(())
}

fn counters_of(v: &Value) -> Vec<(&String, &Value)> {
    v["counters"].as_object().into_iter().flatten().collect()
}

/// The counter sets of a slice and the devices' consumption of them, as the server of
/// Kubernetes 1.`minor` validates them (k8s.io/api resource/v1 types.go's limits; the
/// counter sets' rules changed in 1.35, when they moved to slices of their own):
///
/// - 1.34: the counter sets may sit beside devices and hold at most 32 counters together;
///   a device consumes at most 32 counters, and the devices of a slice at most 1024; a
///   consumption names a set of the same slice and counters that set has.
/// - 1.35 and later: a slice holds counter sets or devices, never both; at most 8 sets of
///   at most 32 counters; a device has at most 2 consumptions of at most 32 counters each.
fn counter_sets(spec: &Value, minor: u32) -> Result<(), String> {
    let sets: Vec<&Value> = spec.get("sharedCounters").and_then(Value::as_array).into_iter().flatten().collect();
    let mut names = std::collections::HashSet::new();
    for (i, set) in sets.iter().enumerate() {
        let name = set["name"].as_str().unwrap_or("");
        if !dns_label(name) {
            return Err(format!("spec.sharedCounters[{i}].name: Invalid value: {name:?}: a lowercase RFC 1123 label"));
        }
        if !names.insert(name) {
            return Err(format!("spec.sharedCounters[{i}].name: Duplicate value: {name:?}"));
        }
        let counters = counters_of(set);
        if counters.is_empty() {
            return Err(format!("spec.sharedCounters[{i}].counters: Required value"));
        }
        if minor >= 35 && counters.len() > 32 {
            return Err(format!("spec.sharedCounters[{i}].counters: Too many: {}: must have at most 32 items", counters.len()));
        }
        for (key, c) in counters {
            if !dns_label(key) || c["value"].as_str().and_then(quantity).is_none() {
                return Err(format!("spec.sharedCounters[{i}].counters[{key}]: Invalid value"));
            }
        }
    }
    if minor <= 34 {
        let total: usize = sets.iter().map(|s| counters_of(s).len()).sum();
        if total > 32 {
            return Err(format!("spec.sharedCounters: Too many: {total}: the total number of counters must not exceed 32"));
        }
    } else if sets.len() > 8 {
        return Err(format!("spec.sharedCounters: Too many: {}: must have at most 8 items", sets.len()));
    }
    let mut consumed = 0;
    for (i, d) in spec.get("devices").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let list: Vec<&Value> = d.get("consumesCounters").and_then(Value::as_array).into_iter().flatten().collect();
        if minor >= 35 && list.len() > 2 {
            return Err(format!("spec.devices[{i}].consumesCounters: Too many: {}: must have at most 2 items", list.len()));
        }
        let mut per_device = 0;
        for (j, c) in list.iter().enumerate() {
            let path = format!("spec.devices[{i}].consumesCounters[{j}]");
            let counters = counters_of(c);
            if counters.is_empty() || counters.len() > 32 {
                return Err(format!("{path}.counters: Invalid value: must have 1 to 32 items"));
            }
            per_device += counters.len();
            if minor <= 34 {
                let name = c["counterSet"].as_str().unwrap_or("");
                let Some(set) = sets.iter().find(|s| s["name"] == name) else {
                    return Err(format!(
                        "{path}.counterSet: Invalid value: {name:?}: must reference a counter set defined in the ResourceSlice sharedCounters"
                    ));
                };
                if let Some((key, _)) = counters.iter().find(|(k, _)| set["counters"].get(k.as_str()).is_none()) {
                    return Err(format!("{path}.counters: Invalid value: {key:?}: must reference a counter defined in the ResourceSlice sharedCounters"));
                }
            }
        }
        if minor <= 34 && per_device > 32 {
            return Err(format!("spec.devices[{i}].consumesCounters: Invalid value: {per_device}: the total number of counters must not exceed 32"));
        }
        consumed += per_device;
    }
    if minor <= 34 && consumed > 1024 {
        return Err(format!("spec.devices: Invalid value: {consumed}: the total number of counters in devices must not exceed 1024"));
    }
    Ok(())
}

/// ValidateResourceSlice (and, with `old`, ValidateResourceSliceUpdate) of the server of
/// Kubernetes 1.`minor`: the first error, as the API server words it.
pub fn validate(slice: &Value, old: Option<&Value>, minor: u32) -> Result<(), String> {
    let name = slice.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if !dns_subdomain(name, 253) {
        return Err(format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain"));
    }
    for (i, o) in slice.pointer("/metadata/ownerReferences").and_then(Value::as_array).into_iter().flatten().enumerate() {
        if ["apiVersion", "kind", "name", "uid"].iter().any(|k| o[*k].as_str().is_none_or(str::is_empty)) {
            return Err(format!("metadata.ownerReferences[{i}]: Invalid value: apiVersion, kind, name and uid must not be empty"));
        }
    }
    let spec = &slice["spec"];
    let driver = spec["driver"].as_str().unwrap_or("");
    if !dns_subdomain(driver, 63) {
        return Err(format!("spec.driver: Invalid value: {driver:?}"));
    }
    let pool = &spec["pool"];
    if pool["name"].as_str().is_none_or(|n| n.is_empty() || n.len() > 253) {
        return Err("spec.pool.name: Required value".into());
    }
    if pool["resourceSliceCount"].as_i64().is_none_or(|c| c <= 0) {
        return Err("spec.pool.resourceSliceCount: Invalid value: must be greater than zero".into());
    }
    if pool["generation"].as_i64().is_none_or(|g| g < 0) {
        return Err("spec.pool.generation: Invalid value: must be greater than or equal to zero".into());
    }
    let placements = ["nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"].iter().filter(|k| spec.get(**k).is_some_and(|v| !v.is_null())).count();
    if placements != 1 {
        return Err("spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required".into());
    }
    if spec.get("nodeName").is_some_and(|n| n.as_str().is_none_or(|n| !dns_subdomain(n, 253))) {
        return Err("spec.nodeName: Invalid value".into());
    }
    let has_devices = spec.get("devices").is_some_and(|d| !d.is_null());
    if minor >= 35 && spec.get("sharedCounters").is_some_and(|c| !c.is_null()) && has_devices {
        return Err("spec: Invalid value: only one of `sharedCounters` or `devices` is allowed".into());
    }
    counter_sets(spec, minor)?;
    let list: Vec<&Value> = devices(slice).collect();
    let counted = list.iter().any(|d| {
        d.get("taints").and_then(Value::as_array).is_some_and(|t| !t.is_empty())
            || d.get("consumesCounters").and_then(Value::as_array).is_some_and(|c| !c.is_empty())
    });
    let max = if counted { 64 } else { 128 };
    if list.len() > max {
        return Err(format!("spec.devices: Too many: {}: must have at most {max} items", list.len()));
    }
    let mut names = std::collections::HashSet::new();
    for (i, d) in list.iter().enumerate() {
        device(i, d)?;
        if !names.insert(d["name"].as_str().unwrap_or("")) {
            return Err(format!("spec.devices[{i}].name: Duplicate value"));
        }
    }
    if let Some(old) = old {
        for (field, pointer) in [("spec.pool.name", "/spec/pool/name"), ("spec.driver", "/spec/driver"), ("spec.nodeName", "/spec/nodeName")] {
            if slice.pointer(pointer) != old.pointer(pointer) {
                return Err(format!("{field}: Invalid value: field is immutable"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(capacity: Value, multiple: bool) -> Value {
        let mut d = json!({"name": "gpu-0", "capacity": capacity});
        if multiple {
            d["allowMultipleAllocations"] = true.into();
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "n-gpu.fgpu.io-0"},
            "spec": {"driver": "gpu.fgpu.io", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}, "devices": [d]}})
    }

    fn memory(value: &str, default: &str, min: &str, step: &str) -> Value {
        json!({"memory": {"value": value, "requestPolicy": {"default": default, "validRange": {"min": min, "step": step}}}})
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("256Mi"), Some((256i128 << 20) * 1_000_000_000));
        assert_eq!(quantity("1"), Some(1_000_000_000));
        assert_eq!(quantity("500m"), Some(500_000_000));
        assert_eq!(quantity("1e3"), Some(1_000_000_000_000));
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn a_request_policy_whose_min_plus_step_is_above_the_capacity_refuses_the_slice() {
        assert!(validate(&slice(memory("512Mi", "512Mi", "256Mi", "256Mi"), true), None, 35).is_ok());
        let err = validate(&slice(memory("256Mi", "256Mi", "256Mi", "256Mi"), true), None, 35).unwrap_err();
        assert!(err.contains("one step is larger than capacity value"), "{err}");
        let err = validate(&slice(memory("768Mi", "700Mi", "256Mi", "256Mi"), true), None, 35).unwrap_err();
        assert!(err.contains("not a multiple of a given step"), "{err}");
        let err = validate(&slice(memory("1Gi", "1Gi", "256Mi", "256Mi"), false), None, 35).unwrap_err();
        assert!(err.contains("allowMultipleAllocations must be true"), "{err}");
    }

    #[test]
    fn a_disabled_gate_drops_its_fields_unless_the_stored_slice_uses_them() {
        let full = slice(memory("1Gi", "1Gi", "256Mi", "256Mi"), true);
        let mut dropped = full.clone();
        drop_disabled(&mut dropped, None, Gates::V1_34);
        assert!(dropped["spec"]["devices"][0].get("allowMultipleAllocations").is_none());
        assert!(dropped["spec"]["devices"][0]["capacity"]["memory"].get("requestPolicy").is_none());
        assert!(validate(&dropped, None, 35).is_ok());
        let mut kept = full.clone();
        drop_disabled(&mut kept, Some(&full), Gates::V1_34);
        assert_eq!(kept, full);
    }

    #[test]
    fn counter_sets_follow_the_servers_version() {
        let counters = |n: usize| Value::Object((0..n).map(|i| (format!("c-{i}"), json!({"value": "1"}))).collect());
        let mut s = slice(json!({}), false);
        s["spec"]["sharedCounters"] = json!([{"name": "gpu-0", "counters": counters(2)}]);
        s["spec"]["devices"][0]["consumesCounters"] = json!([{"counterSet": "gpu-0", "counters": counters(1)}]);
        assert!(validate(&s, None, 34).is_ok(), "1.34: counters beside their devices");
        assert!(validate(&s, None, 35).unwrap_err().contains("only one of `sharedCounters` or `devices`"));
        s["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] = "gpu-1".into();
        assert!(validate(&s, None, 34).unwrap_err().contains("must reference a counter set defined in the ResourceSlice"));
        let mut sets = slice(json!({}), false);
        sets["spec"].as_object_mut().unwrap().remove("devices");
        sets["spec"]["sharedCounters"] = Value::Array((0..9).map(|i| json!({"name": format!("gpu-{i}"), "counters": counters(4)})).collect());
        assert!(validate(&sets, None, 35).unwrap_err().contains("must have at most 8 items"));
        assert!(validate(&sets, None, 34).unwrap_err().contains("the total number of counters must not exceed 32"));
        sets["spec"]["sharedCounters"] = json!([{"name": "gpu-0", "counters": counters(33)}]);
        assert!(validate(&sets, None, 36).unwrap_err().contains("must have at most 32 items"));
        sets["spec"]["sharedCounters"] = json!([{"name": "gpu-0", "counters": counters(32)}]);
        assert!(validate(&sets, None, 36).is_ok());
    }
}
