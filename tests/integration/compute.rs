//! The compute share (`FGPU_COMPUTE`): containers held to their share of the GPU's time,
//! measured on the simulated driver's timeline (`SimState::device_busy`), never from the
//! limiter's own figures. Each workload runs `tests/clients/compute_load.c`; a "container"
//! is the processes that share one ledger. Windows are 10 s, as the table says.

use fgpu_sim_state::{now_ns, BusyWindow};
use fgpu_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Points of tolerance around a share (the table).
const TOLERANCE: f64 = 3.0;
const WINDOW: Duration = Duration::from_secs(10);

/// One process of the workload, running until dropped.
struct Load {
    process: Background,
    label: String,
}

impl Load {
    fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// Starts `compute_load ARGS` under the shim with `share` (none: FGPU_COMPUTE unset) in the
/// ledger `ledger`, or without the shim at all when `shim` is false; returns once it has
/// launched.
fn start(env: &Env, label: &str, ledger: &Path, shim: bool, share: Option<&str>, args: &[&str]) -> Load {
    let mut cmd = env.command(client("compute_load")).args(args).env("FGPU_LEDGER", ledger);
    if shim {
        cmd = cmd.shim();
    }
    if let Some(share) = share {
        cmd = cmd.env("FGPU_COMPUTE", share);
    }
    let mut process = cmd.spawn();
    process.wait_for("ready");
    Load { process, label: label.to_string() }
}

fn ledger(env: &Env, name: &str) -> PathBuf {
    env.dir.join(format!("{name}.ledger"))
}

/// Waits `WINDOW` (after `settle`) and returns what the device ran in it.
fn measure(env: &Env, settle: Duration) -> BusyWindow {
    std::thread::sleep(settle);
    let from = now_ns();
    std::thread::sleep(WINDOW);
    let w = env.sim().device_busy(0, from, now_ns());
    assert!(w.complete, "the timeline's history covers the window: {w:?}");
    w
}

/// Percent of the window the processes ran.
fn share(w: &BusyWindow, loads: &[&Load]) -> f64 {
    loads.iter().map(|l| w.share_of_pid(l.pid())).sum::<f64>() * 100.0
}

fn describe(w: &BusyWindow, loads: &[&Load]) -> String {
    let parts: Vec<String> = loads.iter().map(|l| format!("{} (pid {}) {:.2} %", l.label, l.pid(), w.share_of_pid(l.pid()) * 100.0)).collect();
    format!("over {:.2} s: {}; device busy {:.2} %", w.len_ns() as f64 / 1e9, parts.join(", "), w.device_share() * 100.0)
}

fn assert_near(what: &str, measured: f64, target: f64, detail: &str) {
    println!("{what}: {measured:.2} % (target {target} %)");
    assert!((measured - target).abs() <= TOLERANCE, "{what}: {measured:.2} % is not within {TOLERANCE} points of {target} %\n{detail}");
}

#[test]
fn two_saturating_containers_get_30_and_70_percent() {
    let env = Env::new("compute-30-70");
    let a = start(&env, "A", &ledger(&env, "a"), true, Some("30%"), &[]);
    let b = start(&env, "B", &ledger(&env, "b"), true, Some("70%"), &[]);
    let w = measure(&env, Duration::from_millis(500));
    let detail = describe(&w, &[&a, &b]);
    println!("{detail}");
    assert_near("container at 30 %", share(&w, &[&a]), 30.0, &detail);
    assert_near("container at 70 %", share(&w, &[&b]), 70.0, &detail);
}

#[test]
fn a_container_alone_gets_its_25_percent() {
    let env = Env::new("compute-alone-25");
    let a = start(&env, "A", &ledger(&env, "a"), true, Some("25%"), &[]);
    let w = measure(&env, Duration::from_millis(500));
    let detail = describe(&w, &[&a]);
    println!("{detail}");
    assert_near("container alone at 25 %", share(&w, &[&a]), 25.0, &detail);
}

#[test]
fn short_kernels_with_a_sync_every_64_get_their_40_percent() {
    let env = Env::new("compute-50us");
    let a = start(&env, "A", &ledger(&env, "a"), true, Some("40%"), &["--us", "50", "--sync-every", "64"]);
    let w = measure(&env, Duration::from_millis(500));
    let detail = describe(&w, &[&a]);
    println!("{detail}");
    assert_near("50 us kernels at 40 %", share(&w, &[&a]), 40.0, &detail);
}

#[test]
fn a_container_launching_graphs_gets_30_percent_beside_an_uncapped_one() {
    let env = Env::new("compute-graphs");
    let a = start(&env, "graphs", &ledger(&env, "a"), true, Some("30%"), &["--via", "graph", "--nodes", "8", "--us", "1000"]);
    let b = start(&env, "uncapped", &ledger(&env, "b"), false, None, &[]);
    let w = measure(&env, Duration::from_millis(500));
    let detail = describe(&w, &[&a, &b]);
    println!("{detail}");
    assert_near("graphs at 30 %", share(&w, &[&a]), 30.0, &detail);
    let other = share(&w, &[&b]);
    assert!(other >= 65.0, "the uncapped container gets at least 65 %: {other:.2}\n{detail}");
}

#[test]
fn four_processes_of_a_container_share_its_50_percent_beside_an_uncapped_one() {
    let env = Env::new("compute-four");
    let l = ledger(&env, "four");
    let four: Vec<Load> = (0..4).map(|i| start(&env, &format!("p{i}"), &l, true, Some("50%"), &["--us", "1000"])).collect();
    let b = start(&env, "uncapped", &ledger(&env, "b"), false, None, &[]);
    let w = measure(&env, Duration::from_millis(500));
    let all: Vec<&Load> = four.iter().chain([&b]).collect();
    let detail = describe(&w, &all);
    println!("{detail}");
    let refs: Vec<&Load> = four.iter().collect();
    assert_near("4 processes at 50 % together", share(&w, &refs), 50.0, &detail);
    let other = share(&w, &[&b]);
    assert!(other >= 45.0, "the uncapped container gets the rest: {other:.2}\n{detail}");
}

#[test]
fn a_process_under_the_shim_without_a_share_is_not_throttled() {
    let env = Env::new("compute-none");
    let mut cmd = env.command(client("compute_load")).shim().limit("8G");
    cmd = cmd.env("FGPU_LEDGER", ledger(&env, "a"));
    let mut process = cmd.spawn();
    process.wait_for("ready");
    let a = Load { process, label: "no share".into() };
    let w = measure(&env, Duration::from_millis(200));
    let detail = describe(&w, &[&a]);
    println!("{detail}");
    let got = share(&w, &[&a]);
    assert!(got >= 90.0, "a process with no FGPU_COMPUTE runs unthrottled: {got:.2} %\n{detail}");
}

#[test]
fn an_uncapped_container_beside_one_at_30_percent_gets_at_least_65() {
    let env = Env::new("compute-beside");
    let a = start(&env, "capped", &ledger(&env, "a"), true, Some("30%"), &[]);
    let b = start(&env, "uncapped", &ledger(&env, "b"), true, None, &[]);
    let w = measure(&env, Duration::from_millis(500));
    let detail = describe(&w, &[&a, &b]);
    println!("{detail}");
    assert_near("capped at 30 %", share(&w, &[&a]), 30.0, &detail);
    let other = share(&w, &[&b]);
    assert!(other >= 65.0, "the uncapped container gets at least 65 %: {other:.2}\n{detail}");
}
