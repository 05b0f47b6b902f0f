//! `fgpu exporter`: Prometheus metrics of the ledgers `fgpu status` would show.
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

use crate::cli::ExporterArgs;
use crate::ledgers;
use crate::report::{self, LedgerState, StatusReport};
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
    let up = gauge(&mut r, "fgpu_ledger_up", "1 if the ledger was read, 0 if it does not exist yet or cannot be read (fgpu status says why)", None);
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
    let compute_share = float_gauge(&mut r, "fgpu_compute_share_ratio", "The ledger's compute share: the most of the GPU's time its kernels may occupy (0-1); absent when it has none", None);
    let compute_used = float_gauge(&mut r, "fgpu_compute_used_ratio", "The part of the GPU's time the ledger's kernels took over the last 2 s, as its processes measured it (0-1)", None);
    let compute_seconds = float_counter(&mut r, "fgpu_compute_used", "GPU time the ledger's kernels took, as measured", Unit::Seconds);
    let compute_waited = float_counter(&mut r, "fgpu_compute_throttled", "Time launches of the ledger's processes waited for the compute share, all threads together", Unit::Seconds);

    for (ledger, label) in report.ledgers.iter().zip(ledger_labels(report)) {
        let base: Labels = vec![("ledger".into(), label.clone())];
        up.get_or_create(&base).set(i64::from(ledger.state == LedgerState::Ok));
        let count = state.reclaimed.entry(label.clone()).or_insert(0);
        *count += ledger.reclaimed.len() as u64;
        reclaimed.get_or_create(&base).inc_by(*count);
        if ledger.state != LedgerState::Ok {
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
                    labels.push(("host_pid".into(), p.host_pid.map(|h| h.to_string()).unwrap_or_default()));
                    labels.push(("name".into(), p.name.clone()));
                    process_used.get_or_create(&labels).set(as_i64(pd.used_bytes));
                    process_context.get_or_create(&labels).set(as_i64(pd.context_bytes));
                }
            }
        }
    }
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

const INDEX: &str = "<html><head><title>fgpu exporter</title></head><body><h1>fgpu exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

pub fn exporter(args: &ExporterArgs) -> i32 {
    let server = match tiny_http::Server::http(args.listen) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fgpu exporter: cannot listen on --listen {}: {e}", args.listen);
            return 1;
        }
    };
    let what = if args.select.all {
        "every ledger on this machine".to_string()
    } else {
        let resolved = ledgers::resolve(&args.select);
        resolved.targets.first().map(|t| format!("ledger {}", t.path.display())).unwrap_or_default()
    };
    let bound = server.server_addr().to_ip().unwrap_or(args.listen);
    eprintln!("fgpu exporter: serving metrics of {what} at http://{bound}/metrics");
    let mut state = ExporterState::default();
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let header = |body: &str, kind: &str| {
            tiny_http::Response::from_string(body).with_header(tiny_http::Header::from_bytes("Content-Type", kind).expect("valid header"))
        };
        let response = match (request.method(), path.as_str()) {
            (tiny_http::Method::Get | tiny_http::Method::Head, "/metrics") => {
                let accept = request.headers().iter().find(|h| h.field.equiv("Accept")).map(|h| h.value.as_str().to_string());
                let openmetrics = wants_openmetrics(accept.as_deref());
                let report = report::collect(ledgers::resolve(&args.select));
                let body = encode(&registry(&report, &mut state), openmetrics);
                header(&body, if openmetrics { OPENMETRICS_CONTENT_TYPE } else { prometheus_text::CONTENT_TYPE })
            }
            (tiny_http::Method::Get | tiny_http::Method::Head, "/") => header(INDEX, "text/html; charset=utf-8"),
            _ => header("not found; metrics are at /metrics\n", "text/plain; charset=utf-8").with_status_code(404),
        };
        let _ = request.respond(response);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{DeviceReport, LedgerReport, ProcessDevice, ProcessReport};

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
                name: "py\"thon".into(),
                started_unix_ms: 0,
                used_bytes: 3 << 30,
                context_bytes: 300 << 20,
                devices: vec![ProcessDevice { index: 0, used_bytes: 3 << 30, context_bytes: 300 << 20 }],
            }],
            reclaimed: vec![],
        }
    }

    #[test]
    fn metrics_follow_the_naming_conventions_and_carry_the_numbers() {
        let report = StatusReport { schema: 1, ledgers: vec![ledger("/tmp/.fgpu-ledger", "8:1:10"), ledger("/tmp/.fgpu-ledger", "8:1:11")], notes: vec![] };
        let mut state = ExporterState::default();
        let body = encode(&registry(&report, &mut state), false);
        assert!(body.contains("# TYPE fgpu_memory_cap_bytes gauge"), "{body}");
        assert!(body.contains("# TYPE fgpu_allocation_refusals_total counter"), "{body}");
        assert!(body.contains(r#"fgpu_memory_used_bytes{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 3221225472"#), "{body}");
        assert!(body.contains(r#"fgpu_allocation_refusals_total{ledger="/tmp/.fgpu-ledger (8:1:11)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 4"#), "{body}");
        assert!(body.contains(r#"pid="42",host_pid="",name="py\"thon"} 3221225472"#), "{body}");
        assert!(body.contains(r#"fgpu_compute_share_ratio{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 0.3"#), "{body}");
        assert!(body.contains(r#"fgpu_compute_used_ratio{ledger="/tmp/.fgpu-ledger (8:1:10)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 0.295"#), "{body}");
        assert!(body.contains("# TYPE fgpu_compute_used_seconds_total counter"), "{body}");
        assert!(body.contains(r#"fgpu_compute_throttled_seconds_total{ledger="/tmp/.fgpu-ledger (8:1:11)",gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555"} 40.25"#), "{body}");
        let om = encode(&registry(&report, &mut state), true);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("# UNIT fgpu_memory_cap_bytes bytes"), "{om}");
    }

    #[test]
    fn reclaimed_counter_accumulates_across_scrapes() {
        let mut l = ledger("/l", "1:1:1");
        l.reclaimed = l.processes.clone();
        let report = StatusReport { schema: 1, ledgers: vec![l], notes: vec![] };
        let mut state = ExporterState::default();
        registry(&report, &mut state);
        let body = encode(&registry(&report, &mut state), false);
        assert!(body.contains(r#"fgpu_reclaimed_processes_total{ledger="/l"} 2"#), "{body}");
    }

    #[test]
    fn content_negotiation() {
        assert!(wants_openmetrics(Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
