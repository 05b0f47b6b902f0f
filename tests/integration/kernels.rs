//! Kernels on the simulated GPU's device timeline, driven by real clients: NVIDIA's
//! cuda-bindings launches them, pynvml reads the utilisation samples, and the timeline's
//! ground truth (`SimState::device_busy`) judges. Shares are measured on the timeline over
//! seconds, never from the test's own sleeps, so a loaded CPU does not move them.

use fgpu_sim_state::{now_ns, SimState};
use fgpu_tests::*;
use std::path::PathBuf;
use std::time::Duration;

fn kernels_script() -> PathBuf {
    workspace().join("tests/python/cuda_bindings_kernels.py")
}

/// A worker launching `ms` ms kernels back to back (cuda-bindings), started and past its
/// first launch.
fn saturating_worker(env: &Env, python: &PathBuf, ms: u32, shim: bool) -> Background {
    let mut cmd = env.command(python).arg(kernels_script()).args(["saturate", "60", &ms.to_string()]);
    if shim {
        cmd = cmd.shim().limit("8G");
    }
    let mut worker = cmd.spawn();
    worker.wait_for("{\"ready\"");
    worker
}

/// A window of `periods` whole NVML sample periods starting after now; returns once it is
/// over (and its last period complete).
fn next_window(sim: &SimState, periods: u64) -> (u64, u64) {
    let p = sim.sample_period_ns();
    let t0 = (now_ns() / p + 1) * p;
    let t1 = t0 + periods * p;
    std::thread::sleep(Duration::from_nanos(t1 - now_ns()) + Duration::from_millis(20));
    (t0, t1)
}

fn share_pct(sim: &SimState, from: u64, to: u64, pid: u32) -> f64 {
    sim.device_busy(0, from, to).share_of_pid(pid) * 100.0
}

/// Two processes saturating the GPU with 2 ms kernels each get half of its time; pynvml's
/// per-process samples say the same; a process killed with work queued loses it.
fn two_processes_share_the_gpu(name: &str, shim: bool) {
    let Some(python) = python_with("cuda.bindings") else { return };
    let Some(_) = python_with("pynvml") else { return };
    let env = Env::new(name);
    let a = saturating_worker(&env, &python, 2, shim);
    let mut b = saturating_worker(&env, &python, 2, shim);
    let sim = env.sim();
    // 24 sample periods: 4 s at the simulated driver's default period.
    let periods = 24;
    let (t0, t1) = next_window(&sim, periods);
    let w = sim.device_busy(0, t0, t1);
    let (sa, sb) = (w.share_of_pid(a.pid()) * 100.0, w.share_of_pid(b.pid()) * 100.0);
    println!("{name}: shares over {} s: {sa:.2} % and {sb:.2} %, device {:.2} %", (t1 - t0) as f64 / 1e9, w.device_share() * 100.0);
    assert!(w.complete, "{w:?}");
    for s in [sa, sb] {
        assert!((45.0..=55.0).contains(&s), "each gets 50 +- 5 % of the timeline: {sa:.2} {sb:.2}\n{w:?}");
    }
    assert!(w.device_share() > 0.97, "the GPU stays busy: {w:?}");

    // pynvml over the same periods.
    let nvml = env
        .command(&python)
        .arg(workspace().join("tests/python/nvml_utilisation.py"))
        .args([sim.timestamp_us(t0).to_string(), sim.timestamp_us(t1).to_string(), periods.to_string()])
        .success();
    let out: serde_json::Value = serde_json::from_str(nvml.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{nvml}"));
    // One sample per running process (nvml.h), its utilisation over the periods asked for.
    assert_eq!(out["samples_per_pid"], 1, "one sample per process\n{nvml}");
    for pid in [a.pid(), b.pid()] {
        let sm = out["sm_mean"][pid.to_string()].as_f64().unwrap_or_else(|| panic!("no samples of {pid}\n{nvml}"));
        // The sample covers t0 to its stamp (later than t1 when the script started late).
        let stamp = out["stamp_of"][pid.to_string()].as_u64().unwrap();
        let truth = share_pct(&sim, t0, t0 + (stamp - sim.timestamp_us(t0)) * 1000, pid);
        let info = out["info_sm_mean"][pid.to_string()].as_f64().unwrap_or_else(|| panic!("r550 call: no samples of {pid}\n{nvml}"));
        println!("{name}: pid {pid}: timeline {truth:.2} %, pynvml smUtil mean {sm:.2} %, r550 {info:.2} %");
        assert!((sm - truth).abs() <= 5.0, "pynvml agrees with the timeline within 5 points: {sm} vs {truth}\n{nvml}");
        assert_eq!(sm, info, "both NVML calls give the same samples\n{nvml}");
    }
    assert_eq!(out["timestamps_increase"], true, "{nvml}");
    // NULL buffer and short buffer: NVML_ERROR_INSUFFICIENT_SIZE (7) with the count needed,
    // the number of processes running; nothing newer than the newest sample:
    // NVML_ERROR_NOT_FOUND (6).
    assert_eq!(out["null_rc"], 7, "{nvml}");
    assert_eq!(out["null_count"], 2, "{nvml}");
    assert_eq!(out["short_rc"], 7, "{nvml}");
    assert_eq!(out["short_count"], 2, "{nvml}");
    assert_eq!(out["after_newest_rc"], 6, "{nvml}");
    assert!(out["gpu_util"].as_u64().unwrap() >= 95, "nvmlDeviceGetUtilizationRates while saturated\n{nvml}");

    // Kill one with about 2 s of work queued: its work is dropped, the other gets the GPU.
    b.kill(libc::SIGKILL);
    let killed = now_ns();
    std::thread::sleep(Duration::from_millis(1500));
    let after = now_ns();
    // The dead process's last kernel ends when the timeline is next advanced (the survivor
    // does so at least every 10 ms); 100 ms leaves room for a stalled CPU.
    let from = killed + 100_000_000;
    let dead = share_pct(&sim, from, after, b.pid());
    let alive = share_pct(&sim, from, after, a.pid());
    println!("{name}: after the kill: dead {dead:.2} %, survivor {alive:.2} %");
    assert_eq!(dead, 0.0, "a dead process's queued work is dropped");
    assert!(alive > 95.0, "the survivor gets the GPU: {alive}");
    drop(a);
}

#[test]
fn two_processes_get_half_the_gpu_each_and_nvml_agrees() {
    two_processes_share_the_gpu("kernels-share", false);
}

#[test]
fn two_processes_get_half_the_gpu_each_under_the_shim() {
    two_processes_share_the_gpu("kernels-share-shim", true);
}

/// cuda-bindings times a kernel with events: the elapsed time is the kernel's duration on
/// the timeline; streams and events answer CUDA_ERROR_NOT_READY (600) while it runs.
#[test]
fn cuda_bindings_times_a_kernel_with_events() {
    let Some(python) = python_with("cuda.bindings") else { return };
    let env = Env::new("kernels-events");
    for shim in [false, true] {
        let mut cmd = env.command(&python).arg(kernels_script()).arg("events");
        if shim {
            cmd = cmd.shim().limit("8G");
        }
        let run = cmd.success();
        let out: serde_json::Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
        assert_eq!(out["stream_query_running"], 600, "{run}");
        assert_eq!(out["event_query_running"], 600, "{run}");
        assert_eq!(out["elapsed_running"], 600, "{run}");
        assert_eq!(out["event_query_done"], 0, "{run}");
        assert_eq!(out["stream_query_done"], 0, "{run}");
        let elapsed = out["elapsed_ms"].as_f64().unwrap();
        assert!((elapsed - 1000.0).abs() < 0.01, "a 1000-block kernel of 1 ms per block: {elapsed} ms\n{run}");
        // The host waited for the work queued before it (500 + 1000 ms from the launch).
        assert!(out["waited_ms"].as_f64().unwrap() > 900.0, "{run}");
    }
}

/// Launches captured into a graph run on the timeline when the graph is launched.
#[test]
fn cuda_bindings_captured_graph_runs_its_kernels() {
    let Some(python) = python_with("cuda.bindings") else { return };
    let env = Env::new("kernels-graph");
    let run = env.command(&python).arg(kernels_script()).args(["graph", "3", "40"]).shim().limit("8G").success();
    let out: serde_json::Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    assert_eq!(out["nodes"], 40, "{run}");
    assert_eq!(out["query_running"], 600, "{run}");
    let elapsed = out["elapsed_ms"].as_f64().unwrap();
    assert!((elapsed - 120.0).abs() < 0.01, "40 kernels of 3 ms: {elapsed} ms\n{run}");
    let w = env.sim().device_busy(0, 0, u64::MAX);
    assert_eq!(w.device_busy_ns, 300_000_000 + 120_000_000, "the first kernel and the graph's: {w:?}");
}

/// The kernel launches the C client times, each 50 ms on the timeline.
const TIMED_LAUNCHES: [&str; 9] = ["launch", "launch_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz", "library"];

/// Every launch entry point, found through cuGetProcAddress, dlsym on a handle and linked
/// symbols, runs its kernel for the time the module declares; with `shim` the calls go
/// through the shim's cuGetProcAddress and dlsym first.
fn launch_paths(name: &str, shim: bool) {
    let env = Env::new(name);
    let ways = [("procaddr", client("kernel_launcher")), ("dlsym", client("kernel_launcher")), ("linked", client_with("kernel_launcher", &["LINKED"]))];
    for (way, binary) in ways {
        let mut cmd = env.command(&binary);
        if way != "linked" {
            cmd = cmd.args(["--resolve", way]);
        }
        cmd = cmd.args(TIMED_LAUNCHES).arg("coop_too_large");
        if shim {
            cmd = cmd.shim().limit("8G");
        }
        let mut client = cmd.spawn();
        let pid = client.pid();
        let run = client.finish();
        assert!(run.output.status.success(), "{run}");
        assert_eq!(run.rc("setup"), 0, "{run}");
        for op in TIMED_LAUNCHES {
            assert_eq!(run.rc(&format!("{op} ")), 0, "{way}: {op}\n{run}");
            assert_eq!(run.field(&format!("{op} "), "ms"), "50.000", "{way}: {op} runs 50 blocks of 1 ms\n{run}");
        }
        assert_eq!(run.rc("coop_too_large"), 720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE\n{run}");
        // Ground truth: each timed launch came after a 200 ms kernel.
        let busy = env.sim().device_busy(0, 0, u64::MAX).busy_of_pid(pid);
        assert_eq!(busy, TIMED_LAUNCHES.len() as u64 * 250_000_000, "{way}\n{run}");
    }
}

#[test]
fn every_launch_path_runs_kernels_on_the_timeline() {
    launch_paths("kernels-paths", false);
}

#[test]
fn every_launch_path_runs_kernels_under_the_shim() {
    launch_paths("kernels-paths-shim", true);
}

/// A launch into a full queue (1024 pending) blocks until the oldest kernel completes.
#[test]
fn a_launch_into_a_full_queue_blocks() {
    let env = Env::new("kernels-queue");
    let run = env.command(client("kernel_launcher")).args(["burst", "1100"]).success();
    let wall: f64 = run.field("burst", "launch_ms").parse().unwrap();
    assert_eq!(run.rc("burst"), 0, "{run}");
    // 1100 one-ms kernels: the last 76 launches each wait for one to complete.
    assert!(wall >= 70.0, "launching 1100 kernels into a 1024-deep queue took {wall} ms\n{run}");
    assert_eq!(env.sim().device_busy(0, 0, u64::MAX).device_busy_ns, 1_100_000_000, "{run}");
}

/// A copy from the device to host memory returns once the work queued before it is done.
#[test]
fn a_copy_to_the_host_waits_for_the_kernels_before_it() {
    let env = Env::new("kernels-copy");
    for shim in [false, true] {
        let mut cmd = env.command(client("kernel_launcher")).arg("copy_waits");
        if shim {
            cmd = cmd.shim().limit("8G");
        }
        let run = cmd.success();
        assert_eq!(run.rc("copy_waits"), 0, "{run}");
        let wall: f64 = run.field("copy_waits", "wall_ms").parse().unwrap();
        assert!(wall >= 250.0, "cuMemcpyDtoH behind a 300 ms kernel returned after {wall} ms\n{run}");
    }
}
