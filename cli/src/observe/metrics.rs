//! `fgpu exporter`'s metrics: the registry built from a [`StatusReport`], and its encoding.
//!
//! Every scrape looks at the ledgers afresh (with `--all`, rescans the machine), reclaims
//! dead processes first, and encodes with the `prometheus-client` crate: the Prometheus
//! text format 0.0.4 by default, OpenMetrics when the scraper asks for it.
//!
//! Labels: `ledger` (the ledger's path; when two ledgers in one scrape share a path, as
//! two containers' `/tmp/fgpu-0/ledger` do, `PATH (ipc:NS:shm:ID)`), `gpu` (the device's
//! index in the ledger, not an NVML index), `UUID` (the GPU UUID, named and spelled as the
//! DCGM exporter labels it: join the two on `UUID`), and per process `pid` (as seen where
//! the exporter runs), `host_pid` (empty while unknown) and `name`.

use crate::observe::report::{LedgerState, StatusReport};
use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the exporter remembers between scrapes.
#[derive(Default)]
pub struct ExporterState {
    /// Dead processes reclaimed by this exporter, per ledger label.
    pub reclaimed: HashMap<String, u64>,
    /// The cap and share its own configuration gives each GPU, for the ledger in effect
    /// (exported while no process uses that ledger, so a dashboard has a cap line).
    pub configured: Vec<ConfiguredGpu>,
}

/// The cap and compute share the exporter's own configuration gives one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfiguredGpu {
    /// The ledger's path (the in-effect ledger's `ledger` label).
    pub ledger: String,
    pub uuid: String,
    pub cap_bytes: Option<u64>,
    pub share: Option<f64>,
}

/// What the configuration here gives each GPU the driver lists (`fgpu __driver-probe`).
pub fn configured_gpus(ledger: &str) -> Vec<ConfiguredGpu> {
    let Ok(config) = fgpu_core::config::Config::from_sources(&fgpu_core::config::OsSources) else { return Vec::new() };
    if !config.is_active() {
        return Vec::new();
    }
    let Ok(probe) = crate::driver::probe::probe_driver() else { return Vec::new() };
    probe
        .devices
        .iter()
        .map(|d| ConfiguredGpu {
            ledger: ledger.to_string(),
            uuid: d.uuid.clone(),
            cap_bytes: config.cap_for(&d.uuid, d.total_bytes).map(|c| c.min(d.total_bytes)),
            share: config.share_for(&d.uuid).map(|ppm| ppm as f64 / fgpu_core::compute::PPM as f64),
        })
        .collect()
}

/// The `ledger` label of each ledger of the report, unique within it.
pub fn ledger_labels(report: &StatusReport) -> Vec<String> {
    report
        .ledgers
        .iter()
        .map(|l| {
            let shared = report.ledgers.iter().filter(|o| o.path == l.path).count() > 1;
            match (&l.id, shared) {
                (Some(id), true) => format!("{} ({id})", l.path),
                _ => l.path.clone(),
            }
        })
        .collect()
}

fn gauge(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
        None => registry.register(name, help, family.clone()),
    }
    family
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

fn float_gauge(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, FloatGauge> {
    let family = Family::<Labels, FloatGauge>::default();
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
        None => registry.register(name, help, family.clone()),
    }
    family
}

fn float_counter(registry: &mut Registry, name: &str, help: &str, unit: Unit) -> Family<Labels, FloatCounter> {
    let family = Family::<Labels, FloatCounter>::default();
    registry.register_with_unit(name, help, unit, family.clone());
    family
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Builds the registry for one scrape. Updates `state` with what this scrape reclaimed.
pub fn registry(report: &StatusReport, state: &mut ExporterState) -> Registry {
    let mut r = Registry::default();
    let up = gauge(
        &mut r,
        "fgpu_ledger_up",
        "1 if the ledger was read and verified, 0 if it does not exist yet, cannot be read, was not read in time, or is not verified (fgpu status says why)",
        None,
    );
    let ledger_state = gauge(&mut r, "fgpu_ledger_state", "1 for the ledger's state (ok, unverified, missing, error, timeout), 0 for the others", None);
    let ledger_processes = gauge(&mut r, "fgpu_ledger_processes", "Live processes in the ledger, holding memory or not", None);
    let reclaimed = counter(&mut r, "fgpu_reclaimed_processes", "Dead processes whose memory this exporter returned to the cap");
    let cap = gauge(&mut r, "fgpu_memory_cap", "The ledger's cap on the GPU", Some(Unit::Bytes));
    let used = gauge(&mut r, "fgpu_memory_used", "Memory held on the GPU by the ledger's processes, CUDA contexts included", Some(Unit::Bytes));
    let peak = gauge(&mut r, "fgpu_memory_peak", "Most memory held at once on the GPU since the ledger was created", Some(Unit::Bytes));
    let total = gauge(&mut r, "fgpu_memory_total", "Physical memory of the GPU", Some(Unit::Bytes));
    let refusals = counter(&mut r, "fgpu_allocation_refusals", "Allocations refused because they would pass the cap");
    let processes = gauge(&mut r, "fgpu_processes", "Live processes holding memory on the GPU", None);
    let process_used = gauge(&mut r, "fgpu_process_memory_used", "Memory one process holds on the GPU, its CUDA context included", Some(Unit::Bytes));
    let process_context = gauge(&mut r, "fgpu_process_context_memory", "The part of a process's memory that is its CUDA context", Some(Unit::Bytes));
    let compute_share = float_gauge(
        &mut r,
        "fgpu_compute_share_ratio",
        "The ledger's compute share: the most of the GPU's time its kernels may occupy (0-1); absent when it has none",
        None,
    );
    let compute_used = float_gauge(
        &mut r,
        "fgpu_compute_used_ratio",
        "The part of the GPU's time the ledger's kernels took over the last 2 s, as its processes measured it (0-1)",
        None,
    );
    let compute_seconds = float_counter(&mut r, "fgpu_compute_used", "GPU time the ledger's kernels took, as measured", Unit::Seconds);
    let compute_waited = float_counter(
        &mut r,
        "fgpu_compute_throttled",
        "Time launches of the ledger's processes waited for the compute share, all threads together",
        Unit::Seconds,
    );

    for (ledger, label) in report.ledgers.iter().zip(ledger_labels(report)) {
        let base: Labels = vec![("ledger".into(), label.clone())];
        up.get_or_create(&base).set(i64::from(ledger.state == LedgerState::Ok));
        for (value, name) in [
            (LedgerState::Ok, "ok"),
            (LedgerState::Unverified, "unverified"),
            (LedgerState::Missing, "missing"),
            (LedgerState::Error, "error"),
            (LedgerState::Timeout, "timeout"),
        ] {
            let mut labels = base.clone();
            labels.push(("state".into(), name.into()));
            ledger_state.get_or_create(&labels).set(i64::from(ledger.state == value));
        }
        let count = state.reclaimed.entry(label.clone()).or_insert(0);
        *count += ledger.reclaimed.len() as u64;
        reclaimed.get_or_create(&base).inc_by(*count);
        // No process uses the ledger in effect yet: the cap and share this configuration
        // gives, labelled as configured, so a dashboard has its cap line from the start.
        if ledger.state == LedgerState::Missing {
            for c in state.configured.iter().filter(|c| c.ledger == ledger.path) {
                let labels: Labels = vec![
                    ("ledger".into(), label.clone()),
                    ("gpu".into(), String::new()),
                    ("UUID".into(), c.uuid.clone()),
                    ("source".into(), "configured".into()),
                ];
                if let Some(bytes) = c.cap_bytes {
                    cap.get_or_create(&labels).set(as_i64(bytes));
                }
                if let Some(share) = c.share {
                    compute_share.get_or_create(&labels).set(share);
                }
            }
        }
        // An unverified ledger is shown as its processes wrote it (fgpu_ledger_up says 0).
        if !matches!(ledger.state, LedgerState::Ok | LedgerState::Unverified) {
            continue;
        }
        ledger_processes.get_or_create(&base).set(ledger.processes.len() as i64);
        for d in &ledger.devices {
            let labels: Labels = vec![("ledger".into(), label.clone()), ("gpu".into(), d.index.to_string()), ("UUID".into(), d.uuid.clone())];
            cap.get_or_create(&labels).set(as_i64(d.cap_bytes));
            used.get_or_create(&labels).set(as_i64(d.used_bytes));
            peak.get_or_create(&labels).set(as_i64(d.peak_bytes));
            total.get_or_create(&labels).set(as_i64(d.total_bytes));
            refusals.get_or_create(&labels).inc_by(d.refusals);
            processes.get_or_create(&labels).set(d.processes as i64);
            if let Some(share) = d.compute_share {
                compute_share.get_or_create(&labels).set(share);
                compute_seconds.get_or_create(&labels).inc_by(d.compute_seconds);
                compute_waited.get_or_create(&labels).inc_by(d.compute_wait_seconds);
                if let Some(used) = d.compute_used {
                    compute_used.get_or_create(&labels).set(used);
                }
            }
            for p in &ledger.processes {
                for pd in p.devices.iter().filter(|pd| pd.index == d.index) {
                    let mut labels = labels.clone();
                    labels.push(("pid".into(), p.pid.unwrap_or(p.pid_in_namespace).to_string()));
                    // The kernel's word apart from the ledger's: a host PID is in `host_pid` only
                    // when the exporter saw that process hold the slot from the host's PID
                    // namespace; what the ledger merely states is in `stated_host_pid`.
                    let (vouched, stated) = match (p.host_pid, p.host_pid_vouched) {
                        (Some(h), true) => (h.to_string(), String::new()),
                        (Some(h), false) => (String::new(), h.to_string()),
                        (None, _) => (String::new(), String::new()),
                    };
                    labels.push(("host_pid".into(), vouched));
                    labels.push(("stated_host_pid".into(), stated));
                    labels.push(("name".into(), p.name.clone()));
                    process_used.get_or_create(&labels).set(as_i64(pd.used_bytes));
                    process_context.get_or_create(&labels).set(as_i64(pd.context_bytes));
                }
            }
        }
    }
    // Only ledgers of this scrape are remembered: what the exporter keeps does not grow with
    // every path a ledger ever named (a counter that comes back restarts, as counters may).
    let seen: std::collections::HashSet<String> = ledger_labels(report).into_iter().collect();
    state.reclaimed.retain(|label, _| seen.contains(label));
    r
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

/// Whether the scraper's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.split(',').any(|part| part.trim().starts_with("application/openmetrics-text")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::report::{DeviceReport, LedgerReport, ProcessDevice, ProcessReport};

    fn ledger(path: &str, id: &str) -> LedgerReport {
        LedgerReport {
            path: path.into(),
            source: "scan",
            open_path: path.into(),
            mapped_by: vec![1],
            id: Some(id.into()),
            state: LedgerState::Ok,
            error: None,
            devices: vec![DeviceReport {
                index: 0,
                uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
                cap_bytes: 8 << 30,
                used_bytes: 3 << 30,
                peak_bytes: 5 << 30,
                total_bytes: 80 << 30,
                refusals: 4,
                processes: 1,
                compute_share: Some(0.3),
                compute_used: Some(0.295),
                compute_seconds: 12.5,
                compute_wait_seconds: 40.25,
            }],
            processes: vec![ProcessReport {
                pid: Some(42),
                pid_in_namespace: 7,
                host_pid: None,
                host_pid_vouched: false,
                name: "py\"thon".into(),
                started_unix_ms: 0,
                used_bytes: 3 << 30,
                context_bytes: 300 << 20,
                devices: vec![ProcessDevice { index: 0, used_bytes: 3 << 30, context_bytes: 300 << 20 }],
            }],
            reclaimed: vec![],
            dying: vec![],
            dead: vec![],
            own: false,
        }
    }

    #[test]
    fn metrics_follow_the_naming_conventions_and_carry_the_numbers() {
        let report = StatusReport {
            schema: 1,
            ledgers: vec![ledger("/tmp/.fgpu-ledger", "8:1:10"), ledger("/tmp/.fgpu-ledger", "8:1:11")],
            notes: vec![],
            gpus: vec![],
        };
        let mut state = ExporterState::default();
        let body = encode(&registry(&report, &mut state), false);
        assert!(body.contains("# TYPE fgpu_memory_cap_bytes gauge"), "{body}");
        assert!(body.contains("# TYPE fgpu_allocation_refusals_total counter"), "{body}");
        assert!(
            body.contains(r#"fgpu_memory_used_bytes{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 3221225472"#),
            "{body}"
        );
        assert!(
            body.contains(r#"fgpu_allocation_refusals_total{ledger="/tmp/.fgpu-ledger (8:1:11)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 4"#),
            "{body}"
        );
        assert!(body.contains(r#"pid="42",host_pid="",stated_host_pid="",name="py\"thon"} 3221225472"#), "{body}");
        assert!(
            body.contains(r#"fgpu_compute_share_ratio{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 0.3"#),
            "{body}"
        );
        assert!(
            body.contains(r#"fgpu_compute_used_ratio{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 0.295"#),
            "{body}"
        );
        assert!(body.contains("# TYPE fgpu_compute_used_seconds_total counter"), "{body}");
        assert!(
            body.contains(
                r#"fgpu_compute_throttled_seconds_total{ledger="/tmp/.fgpu-ledger (8:1:11)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 40.25"#
            ),
            "{body}"
        );
        let om = encode(&registry(&report, &mut state), true);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("# UNIT fgpu_memory_cap_bytes bytes"), "{om}");
    }

    #[test]
    fn reclaimed_counter_accumulates_across_scrapes() {
        let mut l = ledger("/l", "1:1:1");
        l.reclaimed = l.processes.clone();
        let report = StatusReport { schema: 1, ledgers: vec![l], notes: vec![], gpus: vec![] };
        let mut state = ExporterState::default();
        registry(&report, &mut state);
        let body = encode(&registry(&report, &mut state), false);
        assert!(body.contains(r#"fgpu_reclaimed_processes_total{ledger="/l"} 2"#), "{body}");
    }

    #[test]
    fn what_the_exporter_remembers_is_only_what_it_still_sees() {
        let mut state = ExporterState::default();
        for i in 0..100 {
            let report = StatusReport { schema: 2, ledgers: vec![ledger(&format!("/invented/{i}"), "1:1:1")], notes: vec![], gpus: vec![] };
            registry(&report, &mut state);
        }
        assert_eq!(state.reclaimed.len(), 1, "one entry per ledger of the last scrape");
    }

    #[test]
    fn states_and_vouched_host_pids() {
        let mut unverified = ledger("/u", "1:1:1");
        unverified.state = LedgerState::Unverified;
        unverified.processes[0].host_pid = Some(99);
        let mut vouched = ledger("/v", "1:1:2");
        vouched.processes[0].host_pid = Some(42);
        vouched.processes[0].host_pid_vouched = true;
        let report = StatusReport { schema: 2, ledgers: vec![unverified, vouched], notes: vec![], gpus: vec![] };
        let body = encode(&registry(&report, &mut ExporterState::default()), false);
        assert!(body.contains(r#"fgpu_ledger_up{ledger="/u"} 0"#), "{body}");
        assert!(body.contains(r#"fgpu_ledger_state{ledger="/u",state="unverified"} 1"#), "{body}");
        assert!(body.contains(r#"fgpu_ledger_state{ledger="/u",state="ok"} 0"#), "{body}");
        assert!(body.contains(r#"fgpu_ledger_up{ledger="/v"} 1"#), "{body}");
        assert!(body.contains(r#"host_pid="",stated_host_pid="99""#), "{body}");
        assert!(body.contains(r#"host_pid="42",stated_host_pid="""#), "{body}");
    }

    #[test]
    fn an_unused_ledger_shows_the_configured_cap() {
        let mut idle = ledger("/l", "1:1:1");
        idle.state = LedgerState::Missing;
        idle.id = None;
        let report = StatusReport { schema: 2, ledgers: vec![idle], notes: vec![], gpus: vec![] };
        let mut state = ExporterState {
            configured: vec![ConfiguredGpu { ledger: "/l".into(), uuid: "GPU-1".into(), cap_bytes: Some(8 << 30), share: Some(0.3) }],
            ..Default::default()
        };
        let body = encode(&registry(&report, &mut state), false);
        assert!(body.contains(r#"fgpu_memory_cap_bytes{ledger="/l",gpu="",UUID="GPU-1",source="configured"} 8589934592"#), "{body}");
        assert!(body.contains(r#"fgpu_compute_share_ratio{ledger="/l",gpu="",UUID="GPU-1",source="configured"} 0.3"#), "{body}");
        assert!(body.contains(r#"fgpu_ledger_up{ledger="/l"} 0"#), "{body}");
    }

    #[test]
    fn content_negotiation() {
        assert!(wants_openmetrics(Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
