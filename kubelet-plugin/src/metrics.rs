//! The plugin's Prometheus metrics (`--metrics-address`; served by [`crate::metrics_http`]),
//! named and labelled as `fgpu exporter`'s (docs/cli.md): the `fgpu_` prefix (here
//! `fgpu_dra_`), base units in the name (`_bytes`, `_seconds`, `_ratio` for a part of the
//! GPU's time, 0 to 1), `_total` on counters, and per GPU the labels `gpu` (its index, as
//! nvidia-smi numbers GPUs), `UUID` (as NVIDIA's DCGM exporter names it, so series join
//! DCGM's) and `device` (the device name in the ResourceSlice, `gpu-<index>`).
//!
//! Counters and histograms of the calls live as long as the plugin; the per-GPU gauges are
//! read at each scrape from what the plugin holds: its GPUs, what it publishes, the claims
//! prepared (the node's own account, [`crate::capacity`]) and the GPUs' health.

use crate::health::{GpuHealth, Health};
use crate::inventory::GpuInfo;
use crate::slices::{device_name, MemoryPolicy};
use crate::status::Snapshot;
use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The buckets of the call durations, in seconds: a prepare takes a few milliseconds when
/// the API server answers at once, and kubelet gives each call 45 s.
const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 45.0];

/// What the plugin counts as it goes.
pub struct Metrics {
    prepares: Counter,
    prepare_errors: Counter,
    prepare_seconds: Histogram,
    unprepares: Counter,
    unprepare_errors: Counter,
    unprepare_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            prepares: Counter::default(),
            prepare_errors: Counter::default(),
            prepare_seconds: Histogram::new(BUCKETS),
            unprepares: Counter::default(),
            unprepare_errors: Counter::default(),
            unprepare_seconds: Histogram::new(BUCKETS),
        }
    }
}

/// What a scrape reads from the plugin.
pub struct View {
    pub gpus: Vec<GpuInfo>,
    pub status: Snapshot,
    pub policy: MemoryPolicy,
    pub health: Vec<GpuHealth>,
    /// XIDs seen per GPU index, with their counts.
    pub xids: BTreeMap<u32, BTreeMap<u64, u64>>,
}

fn gpu_labels(g: &GpuInfo) -> Labels {
    vec![("device".into(), device_name(g.index)), ("gpu".into(), g.index.to_string()), ("UUID".into(), g.uuid.clone())]
}

fn with(mut labels: Labels, key: &str, value: impl Into<String>) -> Labels {
    labels.push((key.into(), value.into()));
    labels
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// One claim prepared (`ok`) or refused, in `took`.
    pub fn prepared(&self, took: Duration, ok: bool) {
        self.prepares.inc();
        if !ok {
            self.prepare_errors.inc();
        }
        self.prepare_seconds.observe(took.as_secs_f64());
    }

    /// One claim unprepared (`ok`) or not, in `took`.
    pub fn unprepared(&self, took: Duration, ok: bool) {
        self.unprepares.inc();
        if !ok {
            self.unprepare_errors.inc();
        }
        self.unprepare_seconds.observe(took.as_secs_f64());
    }

    /// The registry of one scrape.
    pub fn registry(&self, view: &View) -> Registry {
        let mut r = Registry::default();
        r.register(
            "fgpu_dra_prepares",
            "ResourceClaims kubelet asked this plugin to prepare (NodePrepareResources), each claim once per call",
            self.prepares.clone(),
        );
        r.register("fgpu_dra_prepare_errors", "ResourceClaims this plugin could not prepare (the error went back to kubelet)", self.prepare_errors.clone());
        r.register_with_unit("fgpu_dra_prepare_duration", "Time to prepare one ResourceClaim, errors included", Unit::Seconds, self.prepare_seconds.clone());
        r.register("fgpu_dra_unprepares", "ResourceClaims kubelet asked this plugin to unprepare (NodeUnprepareResources)", self.unprepares.clone());
        r.register("fgpu_dra_unprepare_errors", "ResourceClaims this plugin could not unprepare", self.unprepare_errors.clone());
        r.register_with_unit(
            "fgpu_dra_unprepare_duration",
            "Time to unprepare one ResourceClaim, errors included",
            Unit::Seconds,
            self.unprepare_seconds.clone(),
        );
        let writes: Counter = Counter::default();
        writes.inc_by(view.status.slice_writes);
        r.register("fgpu_dra_slice_writes", "ResourceSlice writes (create, replace, delete) since the plugin started", writes);
        let registered = Gauge::<i64>::default();
        registered.set(i64::from(view.status.registered == Some(true)));
        r.register("fgpu_dra_registered", "1 once kubelet registered the plugin (its last NotifyRegistrationStatus said so), else 0", registered);
        let consumable = Gauge::<i64>::default();
        consumable.set(i64::from(view.status.consumable_capacity == "on"));
        r.register(
            "fgpu_dra_consumable_capacity",
            "1 when GPUs are published shareable by memory and compute (the cluster keeps DRAConsumableCapacity's fields), 0 when whole or not known yet",
            consumable,
        );

        let total = Family::<Labels, Gauge>::default();
        let published = Family::<Labels, Gauge>::default();
        let memory_capacity = Family::<Labels, Gauge>::default();
        let memory_consumed = Family::<Labels, Gauge>::default();
        let compute_capacity = Family::<Labels, FloatGauge>::default();
        let compute_consumed = Family::<Labels, FloatGauge>::default();
        let claims = Family::<Labels, Gauge>::default();
        let exclusive = Family::<Labels, Gauge>::default();
        let health = Family::<Labels, Gauge>::default();
        let xids = Family::<Labels, Counter>::default();
        for g in &view.gpus {
            let labels = gpu_labels(g);
            let name = device_name(g.index);
            let is_published = view.status.published.contains(&name);
            total.get_or_create(&labels).set(as_i64(g.total));
            published.get_or_create(&labels).set(i64::from(is_published));
            if is_published {
                memory_capacity.get_or_create(&labels).set(as_i64(view.policy.capacity(g.total)));
                compute_capacity.get_or_create(&labels).set(1.0);
            }
            let used = view.status.gpus.iter().find(|u| u.uuid == g.uuid);
            memory_consumed.get_or_create(&labels).set(as_i64(used.map_or(0, |u| u.memory_used)));
            compute_consumed.get_or_create(&labels).set(used.map_or(0.0, |u| u.compute_used_millipercent as f64 / 100_000.0));
            claims.get_or_create(&labels).set(used.map_or(0, |u| u.claims.len() as i64));
            exclusive.get_or_create(&labels).set(i64::from(used.is_some_and(|u| u.exclusive)));
            let state = view.health.iter().find(|h| h.index == g.index).map_or(Health::Unknown, |h| h.health);
            for s in [Health::Healthy, Health::Unhealthy, Health::Unknown] {
                health.get_or_create(&with(labels.clone(), "health", s.name())).set(i64::from(s == state));
            }
            for (xid, count) in view.xids.get(&g.index).into_iter().flatten() {
                xids.get_or_create(&with(labels.clone(), "xid", xid.to_string())).inc_by(*count);
            }
        }
        r.register_with_unit("fgpu_dra_memory_total", "Physical memory of the GPU", Unit::Bytes, total);
        r.register("fgpu_dra_published", "1 when the GPU is published in the node's ResourceSlices, 0 when left out (the plugin's status says why)", published);
        r.register_with_unit(
            "fgpu_dra_memory_capacity",
            "The GPU's published memory capacity (its memory less --memory-reserve, in --memory-step steps)",
            Unit::Bytes,
            memory_capacity,
        );
        r.register_with_unit(
            "fgpu_dra_memory_consumed",
            "Memory the ResourceClaims prepared on the GPU consume (their caps; admin access not counted)",
            Unit::Bytes,
            memory_consumed,
        );
        r.register("fgpu_dra_compute_capacity_ratio", "The GPU's published compute capacity, as a part of its time (1: all of it)", compute_capacity);
        r.register("fgpu_dra_compute_consumed_ratio", "The part of the GPU's time the ResourceClaims prepared on it consume (0 to 1)", compute_consumed);
        r.register("fgpu_dra_claims", "ResourceClaims prepared on the GPU (admin access not counted; a claim of several pods counts once)", claims);
        r.register("fgpu_dra_exclusive", "1 when one ResourceClaim holds the GPU whole (allocated with no consumed capacity)", exclusive);
        r.register("fgpu_dra_health", "1 for the GPU's health as reported to kubelet (healthy, unhealthy, unknown), 0 for the others", health);
        r.register("fgpu_dra_xid_errors", "XID errors the GPU reported since the plugin started, by XID (those that do not count included)", xids);
        r
    }
}

/// The body of one scrape, in OpenMetrics or the Prometheus text format.
pub fn encode(registry: &Registry, openmetrics: bool) -> String {
    let mut out = String::new();
    if openmetrics {
        text::encode(&mut out, registry).expect("writing to a String cannot fail");
    } else {
        prometheus_text::encode(&mut out, registry).expect("writing to a String cannot fail");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::GpuUse;

    #[test]
    fn a_scrape_shows_each_gpu_and_the_calls() {
        let m = Metrics::default();
        m.prepared(Duration::from_millis(3), true);
        m.prepared(Duration::from_millis(30), false);
        m.unprepared(Duration::from_millis(1), true);
        let gpus = vec![GpuInfo { index: 0, uuid: "GPU-a".into(), product: "x".into(), total: 80 << 30 }];
        let status = Snapshot {
            published: vec!["gpu-0".into()],
            gpus: vec![GpuUse {
                device: "gpu-0".into(),
                uuid: "GPU-a".into(),
                memory_used: 12 << 30,
                compute_used_millipercent: 40_000,
                claims: vec!["ml/a".into(), "ml/b".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let view = View {
            gpus,
            status,
            policy: MemoryPolicy { reserve: 512 << 20, step: 256 << 20 },
            health: vec![GpuHealth { index: 0, health: Health::Unhealthy, message: String::new() }],
            xids: BTreeMap::from([(0, BTreeMap::from([(79, 2)]))]),
        };
        let text = encode(&m.registry(&view), false);
        let labels = "device=\"gpu-0\",gpu=\"0\",UUID=\"GPU-a\"";
        for line in [
            "fgpu_dra_prepares_total 2".to_string(),
            "fgpu_dra_prepare_errors_total 1".into(),
            "fgpu_dra_prepare_duration_seconds_count 2".into(),
            "fgpu_dra_unprepares_total 1".into(),
            format!("fgpu_dra_memory_capacity_bytes{{{labels}}} {}", (80u64 << 30) - (512 << 20)),
            format!("fgpu_dra_memory_consumed_bytes{{{labels}}} {}", 12u64 << 30),
            format!("fgpu_dra_compute_consumed_ratio{{{labels}}} 0.4"),
            format!("fgpu_dra_claims{{{labels}}} 2"),
            format!("fgpu_dra_health{{{labels},health=\"unhealthy\"}} 1"),
            format!("fgpu_dra_xid_errors_total{{{labels},xid=\"79\"}} 2"),
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        assert!(encode(&m.registry(&view), true).ends_with("# EOF\n"));
    }
}
