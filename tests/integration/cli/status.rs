//! `fgpu status`: JSON against the simulated driver's own figures, dead processes, missing
//! and broken ledgers, `--all` across namespaces; a compute share as status and the exporter
//! show it.

use super::*;

fn processes_by_pid(ledger: &Value) -> std::collections::HashMap<u64, Value> {
    ledger["processes"].as_array().unwrap().iter().map(|p| (p["pid"].as_u64().unwrap(), p.clone())).collect()
}

#[test]
fn status_json_matches_the_simulated_gpu_and_reports_the_dead_as_reclaimed() {
    let env = Env::new("cli-status").context_overhead("100M");
    let mut a = env.client(&["init", "primary", "alloc", "512M", "hold"]).shim().limit("4G").spawn();
    a.wait_for("holding");
    let mut b = env.client(&["init", "primary", "alloc", "256M", "alloc", "256M", "hold"]).shim().limit("4G").spawn();
    b.wait_for("holding");

    let run = fgpu(&env).args(["status", "--json"]).success();
    let report = json(&run);
    assert_eq!(report["schema"], 2);
    let ledger = &report["ledgers"][0];
    assert_eq!(ledger["path"], env.ledger.display().to_string());
    assert_eq!(ledger["source"], "environment");
    assert_eq!(ledger["state"], "ok");
    // The truth is the simulated driver's: what it holds for each process, not the ledger.
    let sim = env.sim();
    let truth = sim_processes(&env);
    assert_eq!(truth.len(), 2, "{truth:?}");
    let device = &ledger["devices"][0];
    assert_eq!(device["uuid"], sim.device_uuid_string(0));
    assert_eq!(device["cap_bytes"], 4 * GIB);
    assert_eq!(device["used_bytes"], sim.device_used(0), "{run}");
    assert_eq!(device["processes"], 2);
    let procs = processes_by_pid(ledger);
    assert_eq!(procs.len(), 2, "{run}");
    for (pid, (used, context)) in &truth {
        let shown = &procs[&(*pid as u64)];
        assert_eq!(shown["used_bytes"], *used, "what the driver holds for {pid}\n{run}");
        assert_eq!(shown["context_bytes"], *context, "its context memory\n{run}");
        assert_eq!(shown["name"], "cuclient");
        assert_eq!(shown["host_pid"], *pid, "in the host namespace the host PID is the PID");
    }
    assert_eq!(truth[&a.pid()].0, 512 * MIB + 100 * MIB);
    assert_eq!(truth[&b.pid()].0, 512 * MIB + 100 * MIB);
    let held_by_a = truth[&a.pid()].0;

    // Text: a bar, the cap, both PIDs.
    let text = fgpu(&env).args(["status"]).success();
    assert!(text.stdout().contains("of 4 GiB cap"), "{text}");
    assert!(text.stdout().contains(&a.pid().to_string()) && text.stdout().contains(&b.pid().to_string()), "{text}");

    // Kill one: it is shown as reclaimed with what the driver held for it, never as
    // holding, and the device shows what the driver holds for the survivor.
    a.kill(libc::SIGKILL);
    let run = fgpu(&env).args(["status", "--json"]).success();
    let ledger = &json(&run)["ledgers"][0];
    let procs = processes_by_pid(ledger);
    assert!(!procs.contains_key(&(a.pid() as u64)), "a dead process must not be shown holding memory\n{run}");
    let reclaimed = ledger["reclaimed"].as_array().unwrap();
    assert_eq!(reclaimed.len(), 1, "{run}");
    assert_eq!(reclaimed[0]["pid"], a.pid());
    assert_eq!(reclaimed[0]["used_bytes"], held_by_a, "{run}");
    let truth = sim_processes(&env);
    assert_eq!(truth.keys().copied().collect::<Vec<u32>>(), [b.pid()], "{truth:?}");
    assert_eq!(ledger["devices"][0]["used_bytes"], sim.device_used(0), "{run}");
    assert_eq!(procs[&(b.pid() as u64)]["used_bytes"], truth[&b.pid()].0, "{run}");
    b.finish();
}

#[test]
fn status_of_a_missing_or_broken_ledger() {
    let env = Env::new("cli-status-bad");
    let run = fgpu(&env).args(["status", "--json"]).success();
    assert_eq!(json(&run)["ledgers"][0]["state"], "missing", "a ledger not created yet is not an error\n{run}");
    assert!(!env.ledger.exists(), "status never creates the ledger");
    // A file that names no live ledger (garbage, or left by processes long gone): not in use.
    std::fs::write(&env.ledger, b"definitely not a ledger").unwrap();
    let run = fgpu(&env).args(["status", "--json"]).success();
    assert_eq!(json(&run)["ledgers"][0]["state"], "missing", "{run}");
    // One that cannot be trusted is an error.
    std::fs::remove_file(&env.ledger).unwrap();
    std::os::unix::fs::symlink(env.dir.join("elsewhere"), &env.ledger).unwrap();
    let run = fgpu(&env).args(["status", "--json"]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    let ledger = &json(&run)["ledgers"][0];
    assert_eq!(ledger["state"], "error");
    assert!(ledger["error"].as_str().unwrap().contains("symbolic link"), "{run}");
    let run = fgpu(&env).args(["status", "--ledger", "/nonexistent/dir/ledger"]).success();
    assert!(run.stdout().contains("Not in use"), "{run}");
}

#[test]
fn status_all_finds_a_ledger_in_another_mount_and_pid_namespace() {
    if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1) to make mount and PID namespaces") {
        return;
    }
    let env = Env::new("cli-status-all").context_overhead("100M");
    let private = env.dir.join("private");
    std::fs::create_dir_all(&private).unwrap();
    let ledger = private.join("ledger");
    // In its own mount namespace the process keeps its ledger on a tmpfs nobody else sees,
    // in its own PID namespace it is PID 1's child, and in its own IPC namespace (as in any
    // container) the ledger's shared memory has an id only that namespace knows.
    let script = format!(
        "mount -t tmpfs fgpu-test {p} && FGPU_LEDGER={l} exec {c} init primary alloc 256M hold",
        p = private.display(),
        l = ledger.display(),
        c = cuclient()
    );
    let mut hidden =
        env.command("unshare").args(["--mount", "--pid", "--ipc", "--fork", "--mount-proc", "--kill-child", "sh", "-c", &script]).shim().limit("1G").spawn();
    hidden.wait_for("holding");
    assert!(!ledger.exists(), "the ledger must not be visible from the host's mount namespace");

    let run = fgpu(&env).args(["status", "--all", "--json"]).success();
    let report = json(&run);
    let found: Vec<&Value> = report["ledgers"].as_array().unwrap().iter().filter(|l| l["path"] == ledger.display().to_string()).collect();
    assert_eq!(found.len(), 1, "exactly one entry for the hidden ledger\n{run}");
    let l = found[0];
    assert_eq!(l["state"], "ok", "{run}");
    assert_eq!(l["source"], "scan");
    assert!(l["open_path"].as_str().unwrap().starts_with("/proc/"), "{run}");
    let procs = l["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{run}");
    let p = &procs[0];
    assert!(p["used_bytes"].as_u64().unwrap() >= 256 * MIB, "{run}");
    let host_pid = p["pid"].as_u64().unwrap();
    assert_ne!(p["pid_in_namespace"].as_u64().unwrap(), host_pid, "the PID inside the namespace differs\n{run}");
    assert_eq!(p["host_pid"].as_u64(), Some(host_pid), "{run}");
    assert!(l["mapped_by"].as_array().unwrap().iter().any(|m| m.as_u64() == Some(host_pid)), "{run}");
    assert!(l["id"].as_str().unwrap().starts_with("ipc:"), "{run}");
    let comm = std::fs::read_to_string(format!("/proc/{host_pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "cuclient", "the PID shown is the host's PID of the process");

    let text = fgpu(&env).args(["status", "--all"]).success();
    assert!(text.stdout().contains(&ledger.display().to_string()) && text.stdout().contains("NS PID"), "{text}");
    hidden.finish();
}

/// `fgpu run --compute` alone (no memory cap) holds the job to its share over a 10 s window
/// (the window docs/compute.md guarantees it over); `fgpu status` and the exporter show the
/// share and the use, which agree with the simulated GPU's timeline: the use over the last
/// seconds and in all, and the time launches waited while the GPU sat idle for the job.
#[test]
fn run_with_a_compute_share_alone_and_what_status_and_the_exporter_show() {
    let env = Env::new("cli-compute");
    let ledger = env.dir.join("job.ledger");
    let started = fgpu_sim_state::now_ns();
    let mut job = fgpu(&env).args(["run", "--compute", "30%", "--ledger"]).arg(&ledger).arg("--").arg(client("compute_load")).spawn();
    job.wait_for("ready");
    std::thread::sleep(Duration::from_secs(1));
    let from = fgpu_sim_state::now_ns();
    std::thread::sleep(Duration::from_secs(10));
    let sim = env.sim();
    let truth = sim.device_busy(0, from, fgpu_sim_state::now_ns()).device_share();
    println!("the job's share of the timeline over 10 s: {:.2} %", truth * 100.0);
    assert!((truth - 0.30).abs() <= 0.03, "fgpu run --compute 30% holds the job to 30 %: {truth}");

    // What the timeline says of the job (the only process on the GPU) as status is read:
    // its share over the last 4 s (status shows a 2 s window that NVML's figures reach a
    // period or two late), its GPU time in all, and the time the GPU sat idle for it.
    let timeline = || {
        let now = fgpu_sim_state::now_ns();
        let recent = sim.device_busy(0, now - 4_000_000_000, now).device_share();
        let all = sim.device_busy(0, started, now);
        assert!(all.complete, "{all:?}");
        (recent, all.device_busy_ns as f64 / 1e9, (all.len_ns() - all.device_busy_ns) as f64 / 1e9)
    };
    let (recent, busy, idle) = timeline();
    let status = fgpu(&env).args(["status", "--json", "--ledger"]).arg(&ledger).success();
    let value = json(&status);
    let device = &value["ledgers"][0]["devices"][0];
    assert_eq!(device["compute_share"], 0.3, "the share given to fgpu run\n{status}");
    let used = device["compute_used"].as_f64().unwrap_or_else(|| panic!("no use measured\n{status}"));
    assert!((used - recent).abs() <= 0.05, "status shows the use the timeline had lately: {used} against {recent:.3}\n{status}");
    let seconds = device["compute_seconds"].as_f64().unwrap();
    assert!((seconds - busy).abs() <= 0.1 * busy + 0.2, "status shows the GPU time the job took: {seconds} s against {busy:.3} s\n{status}");
    let waited = device["compute_wait_seconds"].as_f64().unwrap();
    println!("status: use {used} (timeline {recent:.3}), {seconds} s (timeline {busy:.3} s), waited {waited} s (idle {idle:.3} s)");
    // Its one thread waits for the share nearly all the time the GPU is idle for it, and
    // while its work in flight runs: never longer than it has lived.
    assert!(
        waited >= 0.5 * idle && waited <= busy + idle + 0.5,
        "launches waited while the GPU sat idle for the job: {waited} s, {idle:.3} s idle of {:.3} s\n{status}",
        busy + idle
    );
    assert_eq!(device["cap_bytes"], device["total_bytes"], "--compute alone sets no memory cap\n{status}");
    assert_eq!(device["total_bytes"], sim.device_total(0), "{status}");
    let text = fgpu(&env).args(["status", "--ledger"]).arg(&ledger).success();
    assert!(text.stdout().contains("compute share 30%: "), "{text}");

    let port = free_port();
    let _exporter = fgpu(&env).args(["exporter", "--listen", &format!("127.0.0.1:{port}"), "--ledger"]).arg(&ledger).spawn();
    eventually("the exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let (_, body) = http_get(port, "/metrics", "text/plain").unwrap();
    promtool_accepts(&body);
    let (recent, busy, idle) = timeline();
    let labels = vec![("gpu", "0".to_string())];
    assert_eq!(sample(&body, "fgpu_compute_share_ratio", &labels), Some(0.3), "{body}");
    let used = sample(&body, "fgpu_compute_used_ratio", &labels).unwrap_or_else(|| panic!("no fgpu_compute_used_ratio\n{body}"));
    assert!((used - recent).abs() <= 0.05, "the use the timeline had lately: {used} against {recent:.3}\n{body}");
    let seconds = sample(&body, "fgpu_compute_used_seconds_total", &labels).unwrap();
    assert!((seconds - busy).abs() <= 0.1 * busy + 0.2, "the GPU time the job took: {seconds} s against {busy:.3} s\n{body}");
    let waited = sample(&body, "fgpu_compute_throttled_seconds_total", &labels).unwrap_or_else(|| panic!("no fgpu_compute_throttled_seconds_total\n{body}"));
    println!("exporter: use {used} (timeline {recent:.3}), {seconds} s (timeline {busy:.3} s), waited {waited} s (idle {idle:.3} s)");
    assert!(waited >= 0.5 * idle && waited <= busy + idle + 0.5, "{waited} s, {idle:.3} s idle of {:.3} s\n{body}", busy + idle);
    drop(job);
}

#[test]
fn a_closed_pipe_ends_status_and_mig_list_quietly_not_with_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new("cli-status-pipe");
    for args in [&["status"][..], &["status", "--json"], &["mig", "list", "--json"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader); // `fgpu ... | head -0`, head already gone
        let mut cmd = fgpu(&env).args(args);
        let described = cmd.describe();
        let out = cmd.0.stdout(writer).stderr(std::process::Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{described}: {stderr}");
        // Whatever it found (a MIG listing may fail on a GPU without MIG), its first write
        // to stdout meets the closed pipe: SIGPIPE ends it, as it ends other tools.
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{described}: {:?}\n{stderr}", out.status);
    }
}
