//! `fgpu exporter`: promtool-valid metrics that match the simulated GPU, a refused address,
//! an idle exporter's configured cap.

use super::*;

#[test]
fn exporter_serves_valid_metrics_that_match_the_simulated_gpu() {
    let env = Env::new("cli-exporter").context_overhead("100M");
    let mut a = env.client(&["init", "primary", "alloc", "300M", "hold"]).shim().limit("1G").spawn();
    a.wait_for("holding");
    let mut b = env.client(&["init", "primary", "alloc", "200M", "hold"]).shim().limit("1G").spawn();
    b.wait_for("holding");
    let refused = env.client(&["init", "primary", "alloc", "900M"]).shim().limit("1G").success();
    assert_eq!(refused.rc("alloc"), 2, "{refused}");

    let port = free_port();
    let _exporter = fgpu(&env).args(["exporter", "--listen", &format!("127.0.0.1:{port}")]).spawn();
    eventually("the exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let (head, body) = http_get(port, "/metrics", "text/plain").unwrap();
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");

    promtool_accepts(&body);

    // The truth is the simulated driver's (what it holds for each process) and the test's
    // own count of what it made fgpu refuse, never the ledger the exporter reads.
    let sim = env.sim();
    let truth = sim_processes(&env);
    assert_eq!(truth.len(), 2, "{truth:?}");
    let ledger = env.ledger.display().to_string();
    let labels = vec![("ledger", ledger.clone()), ("gpu", "0".to_string()), ("UUID", sim.device_uuid_string(0))];
    assert_eq!(sample(&body, "fgpu_memory_cap_bytes", &labels), Some(GIB as f64), "{body}");
    assert_eq!(sample(&body, "fgpu_memory_used_bytes", &labels), Some(sim.device_used(0) as f64), "{body}");
    assert_eq!(sample(&body, "fgpu_memory_total_bytes", &labels), Some(sim.device_total(0) as f64), "{body}");
    assert_eq!(sample(&body, "fgpu_allocation_refusals_total", &labels), Some(1.0), "the one allocation refused above\n{body}");
    assert_eq!(sample(&body, "fgpu_processes", &labels), Some(2.0), "{body}");
    assert_eq!(sample(&body, "fgpu_ledger_up", &[("ledger", ledger.clone())]), Some(1.0), "{body}");
    for (pid, (used, context)) in &truth {
        let mut labels = labels.clone();
        labels.push(("pid", pid.to_string()));
        labels.push(("host_pid", pid.to_string()));
        labels.push(("name", "cuclient".to_string()));
        assert_eq!(sample(&body, "fgpu_process_memory_used_bytes", &labels), Some(*used as f64), "{body}");
        assert_eq!(sample(&body, "fgpu_process_context_memory_bytes", &labels), Some(*context as f64), "{body}");
    }

    // A killed process is reclaimed before the next scrape and counted.
    let reclaimed_before = sample(&body, "fgpu_reclaimed_processes_total", &[("ledger", ledger.clone())]).unwrap();
    a.kill(libc::SIGKILL);
    let (_, body) = http_get(port, "/metrics", "text/plain").unwrap();
    assert_eq!(sample(&body, "fgpu_memory_used_bytes", &labels), Some(sim.device_used(0) as f64), "{body}");
    assert_eq!(sim_processes(&env).len(), 1);
    assert_eq!(sample(&body, "fgpu_reclaimed_processes_total", &[("ledger", ledger.clone())]), Some(reclaimed_before + 1.0), "{body}");
    assert!(!body.contains(&format!("pid=\"{}\"", a.pid())), "a dead process has no series\n{body}");
    assert_eq!(sample(&body, "fgpu_processes", &labels), Some(1.0), "{body}");

    // OpenMetrics on request; other paths 404.
    let (head, body) = http_get(port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5").unwrap();
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let (head, _) = http_get(port, "/nope", "*/*").unwrap();
    assert!(head.starts_with("HTTP/1.1 404") || head.starts_with("HTTP/1.0 404"), "{head}");
    b.finish();
}

#[test]
fn exporter_refuses_an_address_it_cannot_bind() {
    let env = Env::new("cli-exporter-bind");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let run = fgpu(&env).args(["exporter", "--listen", &format!("127.0.0.1:{port}")]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert!(run.stderr().contains("--listen"), "{run}");
    let run = fgpu(&env).args(["exporter", "--listen", "localhost"]).run();
    assert_eq!(run.output.status.code(), Some(2), "{run}");
    assert!(run.stderr().contains("--listen"), "{run}");
}

/// An exporter for a ledger no process uses yet shows the cap and share its own
/// configuration gives each GPU, labelled as configured, so a dashboard has its cap line
/// from the start.
#[test]
fn an_idle_exporter_shows_the_configured_cap() {
    let env = Env::new("cli-exporter-idle");
    let port = free_port();
    let mut exporter = fgpu(&env).args(["exporter", "--listen", &format!("127.0.0.1:{port}")]).env("FGPU_LIMIT", "8G").env("FGPU_COMPUTE", "30%").spawn();
    eventually("the exporter listens", Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let (_, body) = http_get(port, "/metrics", "text/plain").unwrap();
    let uuid = env.sim().device_uuid_string(0);
    let labels = vec![("ledger", env.ledger.display().to_string()), ("UUID", uuid), ("source", "configured".to_string())];
    assert_eq!(sample(&body, "fgpu_memory_cap_bytes", &labels), Some(8.0 * GIB as f64), "{body}");
    assert_eq!(sample(&body, "fgpu_compute_share_ratio", &labels), Some(0.3), "{body}");
    assert_eq!(sample(&body, "fgpu_ledger_up", &[("ledger", env.ledger.display().to_string())]), Some(0.0), "{body}");
    exporter.kill(libc::SIGTERM);
}
