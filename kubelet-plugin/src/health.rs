//! Each GPU's health, from what `fgpu __nvml-events` prints ([`crate::health_watch`] runs
//! it), for kubelet's device health stream ([`crate::health_service`]), the status and the
//! metrics.
//!
//! - **Unhealthy**: the GPU fell off the bus (NVML answers `NVML_ERROR_GPU_IS_LOST`), or it
//!   reported an XID that counts ([`crate::xid`]) since the plugin started or the GPU was
//!   last reset. An XID error leaves the GPU unhealthy until it is reset: NVML tells no
//!   "recovered" event, and the GPUs that report such XIDs need a reset (or more). A reset
//!   is seen as the GPU being lost and then answering again; the plugin's restart forgets
//!   too.
//! - **Healthy**: it answers, XIDs are watched on it, and none that counts came.
//! - **Unknown**: its health is not watched: the helper is not running (for longer than
//!   [`HELPER_GRACE`], as when it cannot start), has not reported the GPU yet, or the GPU
//!   does not report XID events.

use crate::xid::{self, XidPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long the helper may be down (restarting) before the GPUs' health is Unknown.
pub const HELPER_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Healthy,
    Unhealthy,
    Unknown,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
            Health::Unknown => "unknown",
        }
    }
}

/// One GPU's health, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub health: Health,
    /// Why, in words (empty when healthy).
    pub message: String,
}

/// What the helper said of one GPU.
#[derive(Debug, Clone, Default)]
struct Watched {
    uuid: Option<String>,
    monitored: bool,
    unmonitored: Option<String>,
    lost: bool,
    /// The last XID that counts, and when (seconds since the epoch).
    critical: Option<(u64, u64)>,
    /// XIDs seen, each with its count (ignored ones too).
    xids: BTreeMap<u64, u64>,
}

/// The helper, as the plugin runs it.
#[derive(Debug, Clone)]
enum Helper {
    Running { pid: u32 },
    Down { since: Instant, why: String },
}

struct Tracker {
    gpus: BTreeMap<u32, Watched>,
    helper: Helper,
    restarts: u64,
}

/// The GPUs' health, shared by the helper's reader, the health streams, the status and the
/// metrics.
pub struct HealthMonitor {
    policy: XidPolicy,
    tracker: Mutex<Tracker>,
    changed: watch::Sender<u64>,
}

/// The helper's state for the status (`fgpu-kubelet-plugin status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchStatus {
    /// `running` or `down`.
    pub state: String,
    pub pid: Option<u32>,
    pub restarts: u64,
    pub reason: Option<String>,
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `2025-01-31T12:00:00Z` (RFC 3339, as the API's times).
pub fn utc(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    k8s_openapi::jiff::Timestamp::from_second(secs).map_or_else(|_| format!("{secs} s after the epoch"), |t| t.to_string())
}

impl HealthMonitor {
    pub fn new(policy: XidPolicy) -> HealthMonitor {
        let tracker = Tracker { gpus: BTreeMap::new(), helper: Helper::Down { since: Instant::now(), why: "not started yet".into() }, restarts: 0 };
        HealthMonitor { policy, tracker: Mutex::new(tracker), changed: watch::channel(0).0 }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that sees every change of the health.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The helper started as process `pid`.
    pub fn helper_started(&self, pid: u32) {
        let mut t = self.lock();
        if matches!(t.helper, Helper::Down { ref why, .. } if why != "not started yet") {
            t.restarts += 1;
        }
        t.helper = Helper::Running { pid };
        drop(t);
        self.bump();
    }

    /// The helper stopped (or could not start), for `why`.
    pub fn helper_stopped(&self, why: &str) {
        let mut t = self.lock();
        let since = match &t.helper {
            Helper::Down { since, .. } => *since,
            Helper::Running { .. } => Instant::now(),
        };
        t.helper = Helper::Down { since, why: why.to_string() };
        drop(t);
        self.bump();
    }

    /// Takes in one line of the helper; what to log, if anything.
    pub fn apply(&self, line: &Value, now: u64) -> Option<String> {
        let index = line.get("index").and_then(Value::as_u64).map(|i| i as u32);
        let uuid = line.get("uuid").and_then(Value::as_str).map(str::to_string);
        let mut t = self.lock();
        let said = match (line.get("event").and_then(Value::as_str)?, index) {
            ("gpu", Some(i)) => {
                let g = t.gpus.entry(i).or_default();
                g.uuid = uuid.or(g.uuid.take());
                g.monitored = line.get("monitored").and_then(Value::as_bool).unwrap_or(false);
                g.unmonitored = line.get("reason").and_then(Value::as_str).map(str::to_string);
                (!g.monitored).then(|| format!("GPU {i}: XID errors are not watched: {}", g.unmonitored.clone().unwrap_or_default()))
            }
            ("xid", Some(i)) => {
                let xid = line.get("xid").and_then(Value::as_u64)?;
                let g = t.gpus.entry(i).or_default();
                *g.xids.entry(xid).or_default() += 1;
                if self.policy.counts(xid) {
                    g.critical = Some((xid, now));
                    Some(format!("GPU {i}: {}: the GPU is unhealthy until it is reset", xid::describe(xid)))
                } else {
                    Some(format!("GPU {i}: {}, an application's error: the GPU stays healthy", xid::describe(xid)))
                }
            }
            ("lost", Some(i)) => {
                t.gpus.entry(i).or_default().lost = true;
                Some(format!("GPU {i} fell off the bus (NVML answers NVML_ERROR_GPU_IS_LOST): it is unhealthy until it answers again"))
            }
            ("back", Some(i)) => {
                let g = t.gpus.entry(i).or_default();
                g.lost = false;
                g.uuid = uuid.or(g.uuid.take());
                g.monitored = line.get("monitored").and_then(Value::as_bool).unwrap_or(g.monitored);
                // A GPU that answers again was reset or attached again: its XIDs are past.
                let forgot = g.critical.take().map(|(x, _)| format!(" ({} forgotten)", xid::describe(x))).unwrap_or_default();
                Some(format!("GPU {i} answers again{forgot}"))
            }
            ("error", _) => Some(format!("NVML's event watch: {}", line.get("message").and_then(Value::as_str).unwrap_or("an error"))),
            _ => None,
        };
        drop(t);
        if said.is_some() {
            self.bump();
        }
        said
    }

    /// The health of GPUs `indices`.
    pub fn report(&self, indices: &[u32]) -> Vec<GpuHealth> {
        let t = self.lock();
        let down = match &t.helper {
            Helper::Down { since, why } if since.elapsed() >= HELPER_GRACE => Some(why.clone()),
            _ => None,
        };
        indices
            .iter()
            .map(|&index| {
                let (health, message) = match (t.gpus.get(&index), &down) {
                    (Some(g), _) if g.lost => (Health::Unhealthy, "the GPU fell off the bus: NVML answers NVML_ERROR_GPU_IS_LOST".to_string()),
                    (Some(Watched { critical: Some((x, at)), .. }), _) => {
                        (Health::Unhealthy, format!("{} at {}: the GPU needs a reset", xid::describe(*x), utc(*at)))
                    }
                    (_, Some(why)) => (Health::Unknown, format!("the GPU's health is not watched: fgpu __nvml-events is not running ({why})")),
                    (None, None) => (Health::Unknown, "the GPU's health is not watched yet".to_string()),
                    (Some(g), None) if !g.monitored => (
                        Health::Unknown,
                        format!("XID errors are not watched on this GPU: {}", g.unmonitored.clone().unwrap_or_else(|| "NVML did not register them".into())),
                    ),
                    (Some(_), None) => (Health::Healthy, String::new()),
                };
                GpuHealth { index, health, message }
            })
            .collect()
    }

    /// XIDs seen per GPU index, with their counts.
    pub fn xids(&self) -> BTreeMap<u32, BTreeMap<u64, u64>> {
        self.lock().gpus.iter().map(|(i, g)| (*i, g.xids.clone())).collect()
    }

    /// The helper's state.
    pub fn watch_status(&self) -> WatchStatus {
        let t = self.lock();
        match &t.helper {
            Helper::Running { pid } => WatchStatus { state: "running".into(), pid: Some(*pid), restarts: t.restarts, reason: None },
            Helper::Down { why, .. } => WatchStatus { state: "down".into(), pid: None, restarts: t.restarts, reason: Some(why.clone()) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn monitor() -> HealthMonitor {
        let m = HealthMonitor::new(XidPolicy::new(&[]));
        m.helper_started(42);
        m.apply(&json!({"event": "gpu", "index": 0, "uuid": "GPU-a", "monitored": true}), 0);
        m.apply(&json!({"event": "gpu", "index": 1, "uuid": "GPU-b", "monitored": false, "reason": "the GPU does not report XID events"}), 0);
        m
    }

    fn health(m: &HealthMonitor, i: u32) -> (Health, String) {
        let r = m.report(&[i]).remove(0);
        (r.health, r.message)
    }

    #[test]
    fn a_critical_xid_makes_a_gpu_unhealthy_until_it_is_reset() {
        let m = monitor();
        let changes = m.subscribe();
        assert_eq!(health(&m, 0), (Health::Healthy, String::new()));
        assert!(m.apply(&json!({"event": "xid", "index": 0, "xid": 31}), 10).unwrap().contains("stays healthy"));
        assert_eq!(health(&m, 0).0, Health::Healthy, "XID 31 is an application's error");
        m.apply(&json!({"event": "xid", "index": 0, "xid": 48}), 1_700_000_000);
        assert!(changes.has_changed().unwrap());
        assert_eq!(health(&m, 0), (Health::Unhealthy, "XID 48 (double-bit ECC error) at 2023-11-14T22:13:20Z: the GPU needs a reset".into()));
        m.apply(&json!({"event": "alive"}), 0);
        assert_eq!(health(&m, 0).0, Health::Unhealthy, "no event clears an XID");
        m.apply(&json!({"event": "lost", "index": 0, "code": 15}), 0);
        assert!(health(&m, 0).1.contains("fell off the bus"));
        assert!(m.apply(&json!({"event": "back", "index": 0, "monitored": true}), 0).unwrap().contains("XID 48 (double-bit ECC error) forgotten"));
        assert_eq!(health(&m, 0).0, Health::Healthy, "a GPU back on the bus was reset");
        assert_eq!(m.xids()[&0], BTreeMap::from([(31, 1), (48, 1)]));
    }

    #[test]
    fn unwatched_gpus_are_unknown() {
        let m = monitor();
        assert_eq!(health(&m, 1).0, Health::Unknown);
        assert!(health(&m, 1).1.contains("does not report XID events"));
        assert_eq!(health(&m, 2).0, Health::Unknown, "not reported by the helper yet");
        m.helper_stopped("it exited with status 1");
        assert_eq!(health(&m, 0).0, Health::Healthy, "a restart within the grace keeps what was known");
        let status = m.watch_status();
        assert_eq!((status.state.as_str(), status.restarts), ("down", 0));
        m.helper_started(43);
        assert_eq!(m.watch_status().restarts, 1);
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
