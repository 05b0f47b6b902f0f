//! The plugin's second day: each GPU's health on kubelet's device health stream, from XIDs
//! and lost GPUs injected into the simulated driver (whose NVML events `fgpu
//! __nvml-events` watches for the plugin), and its Prometheus endpoint, checked with
//! promtool and against what the test prepared and the slices the stub API server holds.

use super::{alloc, bytes_of, uid, Node, Plugin, NODE, RESERVE, STEP};
use fgpu_tests::dra::{claim_json, ClaimRef, Gates};
use fgpu_tests::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The health of `device` in one message of the fake kubelet's stream.
fn health_of(message: &Value, device: &str) -> Option<String> {
    message["devices"].as_array()?.iter().find(|d| d["device"] == device).and_then(|d| d["health"].as_str()).map(str::to_string)
}

/// Reads the stream until a message shows `device` as `health` (within `within`): that
/// message, and when it was read.
fn until(stream: &mut Background, plugin: &Plugin, device: &str, health: &str, within: Duration) -> (Value, Instant) {
    let deadline = Instant::now() + within;
    loop {
        let line = stream.wait_for("{");
        let message: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
        assert!(message.get("ended").is_none(), "the health stream ended: {message}\n{}", plugin.log());
        if health_of(&message, device).as_deref() == Some(health) {
            return (message, Instant::now());
        }
        assert!(Instant::now() < deadline, "kubelet did not hear {device} {health} in {within:?}: last {message}\n{}", plugin.log());
    }
}

/// The device of `device` in `message`.
fn device<'a>(message: &'a Value, device: &str) -> &'a Value {
    message["devices"].as_array().and_then(|d| d.iter().find(|d| d["device"] == device)).unwrap_or_else(|| panic!("no {device} in {message}"))
}

const SECONDS: Duration = Duration::from_secs(5);

/// An XID that counts reaches both versions of kubelet's stream as Unhealthy within
/// seconds; an application's XID (NVIDIA's list) leaves the GPU Healthy; a GPU off the bus
/// is Unhealthy, and Healthy once it answers again (a reset forgets its XIDs); the helper
/// that watches NVML is started again when it dies.
#[test]
fn dra_health_reaches_kubelet_from_injected_xids_and_lost_gpus() {
    let Some(node) = Node::new("dra-health", 2, Gates::ALL) else { return };
    node.nvidia_spec();
    let plugin = node.start(&[]);
    let info = node.kubelet.register(&node.registration()).unwrap();
    assert_eq!(info["supportedVersions"], json!(["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]), "{info}");

    // kubelet 1.36 picks v1 from the supported versions; 1.34 and 1.35 call v1alpha1.
    let mut v1 = node.kubelet.watch_health(&node.registration(), "1.36");
    let mut alpha = node.kubelet.watch_health(&node.registration(), "1.34");
    let mut beta = node.kubelet.watch_health(&node.registration(), "1.35");
    for (stream, service) in [(&mut v1, "v1.DRAResourceHealth"), (&mut alpha, "v1alpha1.DRAResourceHealth"), (&mut beta, "v1alpha1.DRAResourceHealth")] {
        let said: Value = serde_json::from_str(&stream.wait_for("{\"service\"")).unwrap();
        assert_eq!(said["service"], service, "{said}");
    }
    // Every GPU of the node, in the node's pool, Healthy once the helper watches them.
    for stream in [&mut v1, &mut alpha, &mut beta] {
        let (m, _) = until(stream, &plugin, "gpu-1", "HEALTHY", Duration::from_secs(30));
        assert_eq!(health_of(&m, "gpu-0").as_deref(), Some("HEALTHY"), "{m}");
        let d = device(&m, "gpu-0");
        assert_eq!(d["pool"], NODE, "{m}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let age = now.saturating_sub(d["lastUpdated"].as_u64().unwrap());
        assert!(age <= 15, "a report {age} s old: {m}");
    }
    drop(beta);
    let sim = node.env.sim();

    // XID 79 (the GPU fell off the bus, as the driver reports it): not in NVIDIA's list.
    let injected = Instant::now();
    sim.inject_xid(0, 79).unwrap();
    let (m, at) = until(&mut v1, &plugin, "gpu-0", "UNHEALTHY", SECONDS);
    let latency_v1 = at - injected;
    let (_, at) = until(&mut alpha, &plugin, "gpu-0", "UNHEALTHY", SECONDS);
    let latency_alpha = at - injected;
    let d = device(&m, "gpu-0");
    assert!(d["message"].as_str().unwrap().starts_with("XID 79 (the GPU has fallen off the bus) at "), "{m}");
    assert_eq!(d["timeout"], 30, "{m}");
    assert_eq!(health_of(&m, "gpu-1").as_deref(), Some("HEALTHY"), "GPU 1 is not affected: {m}");
    eprintln!(
        "an injected XID reached kubelet's stream as Unhealthy after {:.0} ms (v1) and {:.0} ms (v1alpha1)",
        latency_v1.as_secs_f64() * 1e3,
        latency_alpha.as_secs_f64() * 1e3
    );

    // XID 31 (a page fault: the application's error) on GPU 1 changes nothing.
    sim.inject_xid(1, 31).unwrap();
    eventually("the plugin takes in XID 31", SECONDS, || plugin.log().contains("GPU 1: XID 31 (GPU memory page fault), an application's error"));
    let (m, _) = until(&mut v1, &plugin, "gpu-1", "HEALTHY", SECONDS);
    assert_eq!(health_of(&m, "gpu-0").as_deref(), Some("UNHEALTHY"), "{m}");

    // GPU 1 falls off the bus, then answers again.
    let lost = Instant::now();
    sim.lose_gpu(1).unwrap();
    let (m, at) = until(&mut v1, &plugin, "gpu-1", "UNHEALTHY", SECONDS);
    assert!(device(&m, "gpu-1")["message"].as_str().unwrap().contains("fell off the bus"), "{m}");
    eprintln!("a lost GPU reached kubelet's stream as Unhealthy after {:.0} ms", (at - lost).as_secs_f64() * 1e3);
    until(&mut alpha, &plugin, "gpu-1", "UNHEALTHY", SECONDS);
    sim.recover_gpu(1).unwrap();
    let (m, _) = until(&mut v1, &plugin, "gpu-1", "HEALTHY", SECONDS);
    assert_eq!(device(&m, "gpu-1")["message"], "", "{m}");
    until(&mut alpha, &plugin, "gpu-1", "HEALTHY", SECONDS);

    // GPU 0 is reset (off the bus and back): its XID is past.
    sim.lose_gpu(0).unwrap();
    until(&mut v1, &plugin, "gpu-0", "UNHEALTHY", SECONDS);
    sim.recover_gpu(0).unwrap();
    let (m, _) = until(&mut v1, &plugin, "gpu-0", "HEALTHY", SECONDS);
    assert_eq!(health_of(&m, "gpu-1").as_deref(), Some("HEALTHY"), "{m}");
    until(&mut alpha, &plugin, "gpu-0", "HEALTHY", SECONDS);

    // The helper dies: it is started again, and the next XID is seen.
    let watch = node.status()["healthWatch"].clone();
    let pid = watch["pid"].as_u64().unwrap_or_else(|| panic!("no helper pid: {watch}")) as i32;
    // SAFETY: kill(2) on the helper the plugin this test started runs.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    eventually("the helper runs again", Duration::from_secs(15), || {
        let w = node.status()["healthWatch"].clone();
        w["state"] == "running" && w["restarts"] == 1 && w["pid"].as_u64().is_some_and(|p| p as i32 != pid)
    });
    eventually("the new helper is ready", SECONDS, || plugin.log().matches("watching the GPUs' health through NVML's events").count() == 2);
    // The helper prints `ready` once its set is registered; an XID before that is lost (NVML
    // records nothing for a set not yet registered), so inject until one is seen.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        sim.inject_xid(1, 48).unwrap();
        if plugin.log().contains("GPU 1: XID 48 (double-bit ECC error)") {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted helper saw no XID:\n{}", plugin.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    until(&mut v1, &plugin, "gpu-1", "UNHEALTHY", SECONDS);
    assert!(plugin.log().contains("fgpu __nvml-events stopped"), "{}", plugin.log());

    // The stream ends when the plugin stops, so its graceful stop is not held up.
    let (code, log) = plugin.terminate(Duration::from_secs(20));
    assert_eq!(code, Some(0), "{log}");
    let ended = v1.wait_for("{\"ended\"");
    assert!(ended.contains("OK") || ended.contains("UNAVAILABLE"), "{ended}");
}

/// Without --device-health the registration lists the DRA service alone, and a kubelet
/// 1.36 opens no health stream.
#[test]
fn dra_health_off_lists_no_health_service() {
    let Some(node) = Node::new("dra-health-off", 1, Gates::ALL) else { return };
    let _plugin = node.start(&["--device-health=false"]);
    let info = node.kubelet.register(&node.registration()).unwrap();
    assert_eq!(info["supportedVersions"], json!(["v1.DRAPlugin"]), "{info}");
    let mut stream = node.kubelet.watch_health(&node.registration(), "1.36");
    assert!(stream.wait_for("{\"service\"").starts_with("{\"service\": null"), "{:?}", stream.lines);
}

/// The value of the sample `name{...}` whose labels include all of `labels`.
fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines().filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        labels.iter().all(|(k, v)| series.contains(&format!("{k}=\"{v}\""))).then(|| value.parse().ok())?
    })
}

/// `promtool check metrics` on `body`: its output, after asserting it passed.
fn promtool(body: &str) -> String {
    let mut check = Command::new("promtool").args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    check.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check metrics failed:\n{said}\n--- metrics ---\n{body}");
    said
}

/// The metrics endpoint: valid for promtool, in both formats, and its figures are what the
/// test prepared, unprepared and was refused, and what the slices publish.
#[test]
fn dra_metrics_match_what_was_prepared() {
    let Some(node) = Node::new("dra-metrics", 2, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "a", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), Some("25"))]), &["a-0"]));
    node.api.add_claim(claim_json("ml", "b", &uid(2), Some(&[alloc("gpu-0", Some("4Gi"), Some("10"))]), &["b-0", "b-1"]));
    node.api.add_claim(claim_json("ml", "c", &uid(3), Some(&[alloc("gpu-1", Some("2Gi"), None)]), &["c-0"]));
    node.api.add_claim(claim_json("ml", "big", &uid(4), Some(&[alloc("gpu-1", Some("1Ti"), None)]), &["big-0"]));
    let port = free_port();
    let plugin = node.start(&["--metrics-address", &format!("127.0.0.1:{port}")]);
    let slice = node.slice(&plugin, "with two devices", |s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() == 2));
    let prepare =
        |name: &str, n: u32| node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", name, &uid(n))]).unwrap()[uid(n)]["error"].as_str().unwrap().to_string();
    for (name, n) in [("a", 1), ("b", 2), ("b", 2), ("c", 3)] {
        assert_eq!(prepare(name, n), "", "{}", plugin.log());
    }
    assert_ne!(prepare("big", 4), "", "1Ti does not fit on GPU 1");
    let gone = node.kubelet.unprepare(&node.dra(), &[ClaimRef::new("ml", "c", &uid(3))]).unwrap();
    assert_eq!(gone[uid(3)]["error"], "", "{gone}");

    let (head, body) = http_get(port, "/metrics", "text/plain").unwrap();
    assert!(head.starts_with("HTTP/1.0 200") && head.contains("text/plain; version=0.0.4"), "{head}");
    if prerequisite(tool("promtool"), "promtool is not installed (Debian package prometheus)") {
        let said = promtool(&body);
        eprintln!("promtool check metrics on the plugin's endpoint: passed ({} lines, promtool said {:?})", body.lines().count(), said.trim());
        let (head, open) = http_get(port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5").unwrap();
        assert!(head.contains("application/openmetrics-text") && open.ends_with("# EOF\n"), "{head}\n{open}");
    }

    // The calls: five prepares (b twice: kubelet prepares a claim once per pod), one refused.
    let total = |name: &str| sample(&body, name, &[]).unwrap_or_else(|| panic!("no {name} in\n{body}"));
    assert_eq!(total("fgpu_dra_prepares_total"), 5.0, "{body}");
    assert_eq!(total("fgpu_dra_prepare_errors_total"), 1.0, "{body}");
    assert_eq!(total("fgpu_dra_prepare_duration_seconds_count"), 5.0, "{body}");
    assert_eq!(sample(&body, "fgpu_dra_prepare_duration_seconds_bucket", &[("le", "+Inf")]), Some(5.0), "{body}");
    assert_eq!(total("fgpu_dra_unprepares_total"), 1.0, "{body}");
    assert_eq!(total("fgpu_dra_unprepare_errors_total"), 0.0, "{body}");
    assert_eq!(total("fgpu_dra_unprepare_duration_seconds_count"), 1.0, "{body}");
    let took = total("fgpu_dra_prepare_duration_seconds_sum");
    assert!(took > 0.0 && took < 45.0 * 5.0, "{body}");

    // Per GPU: the capacity the slice publishes, what a and b consume on GPU 0, nothing left
    // on GPU 1 (c unprepared, big refused).
    let sim = node.env.sim();
    for (i, d) in slice["spec"]["devices"].as_array().unwrap().iter().enumerate() {
        let (gpu, uuid) = (i.to_string(), sim.device_uuid_string(i));
        let labels = [("device", d["name"].as_str().unwrap()), ("gpu", gpu.as_str()), ("UUID", uuid.as_str())];
        let published = bytes_of(&d["capacity"]["memory"]["value"]);
        assert_eq!(published, (sim.device_total(i) - RESERVE) / STEP * STEP);
        assert_eq!(sample(&body, "fgpu_dra_memory_capacity_bytes", &labels), Some(published as f64), "{body}");
        assert_eq!(sample(&body, "fgpu_dra_memory_total_bytes", &labels), Some(sim.device_total(i) as f64), "{body}");
        assert_eq!(sample(&body, "fgpu_dra_compute_capacity_ratio", &labels), Some(1.0), "{body}");
        assert_eq!(sample(&body, "fgpu_dra_published", &labels), Some(1.0), "{body}");
        let (memory, compute, claims) = if i == 0 { (12 * GIB, 0.35, 2.0) } else { (0, 0.0, 0.0) };
        assert_eq!(sample(&body, "fgpu_dra_memory_consumed_bytes", &labels), Some(memory as f64), "{body}");
        assert_eq!(sample(&body, "fgpu_dra_compute_consumed_ratio", &labels), Some(compute), "{body}");
        assert_eq!(sample(&body, "fgpu_dra_claims", &labels), Some(claims), "{body}");
    }
    eprintln!(
        "metrics: {} prepares, {} refused, {:.1} ms in all; GPU 0 consumes {} of {} bytes",
        total("fgpu_dra_prepares_total"),
        total("fgpu_dra_prepare_errors_total"),
        took * 1e3,
        12 * GIB,
        bytes_of(&slice["spec"]["devices"][0]["capacity"]["memory"]["value"])
    );
    let (head, _) = http_get(port, "/nothing", "text/plain").unwrap();
    assert!(head.starts_with("HTTP/1.0 404"), "{head}");
}
