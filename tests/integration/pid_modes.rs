//! Containers without `--pid=host` on every driver behaviour the simulator models
//! (`FGPU_SIM_NVML_PIDS`, docs/simulator.md): host PIDs (older drivers), PIDs as the
//! caller's namespace sees them (current drivers), the same without a per-process memory
//! figure, and no entry for the container at all. Each test runs a process in its own PID
//! namespace (`unshare -p -f --mount-proc`, as root) under every mode and checks against the
//! simulator's own figures: module memory counted before the next allocation and the
//! device never past the cap, NVML's view and `fgpu status` inside the container, the
//! compute share measured from the timeline, and the crash windows of untracked memory.
//!
//! The real driver knows every process's host PID; the simulated one learns it from a
//! process of the host's namespace, here a thread of the test ([`Env::driver_watch`]).

use fgpu_sim_state::{now_ns, BusyWindow};
use fgpu_tests::*;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Every behaviour, by its `FGPU_SIM_NVML_PIDS` name.
const MODES: [&str; 4] = ["host", "caller", "caller-no-memory", "none"];
const CONTEXT: u64 = 300 * MIB;
/// What an uncapped process beside 30 % of the GPU gets at least, in percent: the rest,
/// less what the handover between the two costs (compute.rs holds its row to 65 %).
const UNCAPPED_NEIGHBOUR_AT_LEAST: f64 = 60.0;

fn can_unshare() -> bool {
    prerequisite(is_root() && tool("unshare") && tool("nsenter"), "root, unshare(1) and nsenter(1) for PID namespaces")
}

/// The most the simulated device held for live processes while it ran (sampled every
/// millisecond by a thread of the test).
struct Peak(Arc<AtomicBool>, Arc<AtomicU64>, Option<std::thread::JoinHandle<()>>);

impl Peak {
    fn watch(env: &Env) -> Peak {
        let sim = env.sim();
        let (stop, peak) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Relaxed) {
                p.fetch_max(sim.device_used(0), Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Peak(stop, peak, Some(thread))
    }

    fn stop(mut self) -> u64 {
        self.0.store(true, Relaxed);
        if let Some(t) = self.2.take() {
            let _ = t.join();
        }
        self.1.load(Relaxed)
    }
}

/// `script` under `sh` in a new PID namespace with its own /proc, the shim preloaded and an
/// 8 GiB cap; `FGPU_HOST_SOCKET` names `socket` or a path where no service answers.
fn in_namespace(env: &Env, script: &str, socket: Option<&std::path::Path>) -> Cmd {
    let socket = socket.map(|s| s.to_path_buf()).unwrap_or_else(|| env.dir.join("no-service-here.sock"));
    env.command("unshare").args(["--pid", "--fork", "--mount-proc", "sh", "-c", script]).shim().limit("8G").env("FGPU_HOST_SOCKET", socket)
}

/// Starts `fgpu service` on a socket in the test's directory.
fn service(env: &Env) -> (Background, std::path::PathBuf) {
    let socket = env.dir.join("host.sock");
    let service = env.command(fgpu_bin()).args(["service", "--socket"]).arg(&socket).spawn();
    eventually("fgpu service listens", Duration::from_secs(5), || socket.exists());
    (service, socket)
}

/// One driver behaviour's run of a test: a fresh environment whose driver is watched from
/// the host's namespace, and `fgpu service`'s socket where the test asked for the service.
struct Mode<'m> {
    name: &'m str,
    env: Env,
    socket: Option<PathBuf>,
}

/// Runs `body` once under each of `modes`, each in its own environment
/// (`modes-<test>-<mode>`), with `fgpu service` started first where `with_service(mode)`
/// and stopped after. `body` notes its failures; the test fails at the end with every one
/// of every mode.
fn under_modes<'m>(test: &str, modes: &[&'m str], with_service: impl Fn(&str) -> bool, mut body: impl FnMut(&Mode<'m>, &mut Vec<String>)) {
    if !can_unshare() {
        return;
    }
    let mut failures = Vec::new();
    for &name in modes {
        let env = Env::new(&format!("modes-{test}-{name}")).nvml_pids(name);
        let service = with_service(name).then(|| service(&env));
        let mode = Mode { name, env, socket: service.as_ref().map(|(_, socket)| socket.clone()) };
        let _watch = mode.env.driver_watch();
        body(&mode, &mut failures);
        if let Some((mut service, _)) = service {
            service.kill(libc::SIGTERM);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A command run inside the PID and mount namespaces of `target` (a host PID).
fn inside(env: &Env, target: u32) -> Cmd {
    env.command("nsenter").args(["--target", &target.to_string(), "--pid", "--mount", "--"])
}

/// NVML's test client, inside the namespaces of `target`, with the shim and the service.
fn nvml_inside(m: &Mode, target: u32) -> Cmd {
    let socket = m.socket.as_deref().expect("NVML inside the container reads with the service");
    inside(&m.env, target).arg(crate::nvml::nvml_client(crate::nvml::Variant::Dlsym)).shim().limit("8G").env("FGPU_HOST_SOCKET", socket)
}

/// Ten seconds of the simulated device's timeline (after 1.5 s for the shares to settle)
/// beside an uncapped process on the host, started here and finished after. A share means
/// something only beside a neighbour that wanted the rest: a failure is noted when it ran
/// less than [`UNCAPPED_NEIGHBOUR_AT_LEAST`] % of the window.
fn beside_uncapped(m: &Mode, failures: &mut Vec<String>) -> BusyWindow {
    let mut uncapped = m.env.command(client("compute_load")).env("FGPU_LEDGER", m.env.dir.join("uncapped")).spawn();
    uncapped.wait_for("ready");
    std::thread::sleep(Duration::from_millis(1500));
    let from = now_ns();
    std::thread::sleep(Duration::from_secs(10));
    let w = m.env.sim().device_busy(0, from, now_ns());
    let neighbour = w.share_of_pid(uncapped.pid()) * 100.0;
    println!("{}: the uncapped neighbour ran {neighbour:.2} %", m.name);
    if neighbour < UNCAPPED_NEIGHBOUR_AT_LEAST {
        failures.push(format!("{}: the uncapped neighbour ran {neighbour:.2} % (at least {UNCAPPED_NEIGHBOUR_AT_LEAST} %)\n{w:?}", m.name));
    }
    uncapped.finish();
    w
}

/// `key=` of the first line of `run`'s output that starts with `prefix`, or "" (a run that
/// failed is reported with its output, not by a panic here).
fn out_field(run: &Run, prefix: &str, key: &str) -> String {
    run.stdout().lines().find(|l| l.starts_with(prefix)).and_then(|l| field(l, key)).unwrap_or_default()
}

/// A 1 GiB module loaded in a PID namespace, then 7000 MiB asked under an 8 GiB cap with
/// 300 MiB contexts: refused under every behaviour (8 GiB - 300 MiB - 1 GiB leaves 6892
/// MiB), with nothing between the load and the allocation, and the simulated device never
/// holds more than the cap. Where no behaviour gives a per-process figure, one line says so
/// and names --pid=host.
#[test]
fn module_memory_in_a_pid_namespace_counts_under_every_driver() {
    under_modes(
        "module",
        &MODES,
        |_| false,
        |m, failures| {
            let (mode, env) = (m.name, &m.env);
            let peak = Peak::watch(env);
            let script = format!("exec {} init primary module 1G alloc 7000M alloc 6800M info hold", client("cuclient").display());
            let mut process = in_namespace(env, &script, None).spawn();
            process.wait_for("holding");
            // What the driver holds for live processes now: the context, the module and 6800 MiB.
            let held = env.sim().device_used(0);
            let peak = peak.stop().max(held);
            let run = process.finish();
            let rcs: Vec<String> = run.lines("alloc").iter().filter_map(|l| field(l, "rc")).collect();
            let free = out_field(&run, "info", "free");
            let warnings = run.stderr().lines().filter(|l| l.contains("--pid=host")).count();
            let exact = matches!(mode, "host" | "caller");
            println!("{mode}: allocs {rcs:?}, free {free}, device peak {} MiB, {warnings} warning(s)", peak >> 20);
            if rcs != ["2", "0"] || free != (8 * GIB - CONTEXT - GIB - 6800 * MIB).to_string() || held != CONTEXT + GIB + 6800 * MIB {
                failures.push(format!("{mode}: the module was not counted before the allocation\n{run}"));
            }
            if peak > 8 * GIB {
                failures.push(format!("{mode}: the simulated device held {peak} bytes, over the 8 GiB cap\n{run}"));
            }
            if warnings != usize::from(!exact) {
                failures.push(format!("{mode}: {warnings} lines name --pid=host (expected {})\n{run}", usize::from(!exact)));
            }
        },
    );
}

/// NVML's view inside the container, under every behaviour: the compute list (from the
/// ledger) shows the container's process by its PID there with what it holds; the graphics
/// list shows it as the driver does (with its memory, without it, or not at all); the
/// accounting PIDs (raw host PIDs on every driver) map to it through the host PID the
/// service told; another tenant on the host never shows.
#[test]
fn nvml_in_a_pid_namespace_answers_for_the_container_under_every_driver() {
    under_modes(
        "nvml",
        &MODES,
        |_| true,
        |m, failures| {
            let (mode, env) = (m.name, &m.env);
            let mut other = env
                .client(&["init", "primary", "alloc", "2G", "hold"])
                .shim()
                .limit("8G")
                .env("FGPU_LEDGER", env.dir.join("other"))
                .env("FGPU_SIM_PROCESS_KINDS", "graphics")
                .spawn();
            other.wait_for("holding");
            let script = format!("exec {} init primary alloc 1G hold", client("cuclient").display());
            let mut holder = in_namespace(env, &script, m.socket.as_deref()).env("FGPU_SIM_PROCESS_KINDS", "graphics").spawn();
            holder.wait_for("holding");
            let host_pid = first_child(holder.pid());
            eventually("the holder learns its host PID", Duration::from_secs(5), || {
                env.ledger().snapshot(None).processes.iter().any(|p| p.host_pid == Some(host_pid))
            });
            let reader = nvml_inside(m, host_pid).args(["list", "compute", "3", "list", "graphics", "3", "acctpids"]).run();
            // The other tenant was there to be hidden: alive, its 2 GiB on the device.
            other.assert_running("the other tenant, whom NVML inside the container must not show");
            let other_held = env.sim().processes().iter().filter(|p| p.pid == other.pid()).map(|p| p.per_device_used[0]).sum::<u64>();
            assert_load("bytes the other tenant holds on the device while NVML is read inside", other_held, 2 * GIB + CONTEXT);
            let held = GIB + CONTEXT;
            let compute = out_field(&reader, "list compute 3", "procs");
            let graphics = out_field(&reader, "list graphics 3", "procs");
            let acct = out_field(&reader, "acctpids", "pids");
            let expected_graphics = match mode {
                "host" | "caller" => format!("1:{held}"),
                "caller-no-memory" => "1:0".to_string(),
                _ => String::new(),
            };
            println!("{mode}: compute {compute:?}, graphics {graphics:?}, accounting {acct:?}");
            if !reader.output.status.success() || compute != format!("1:{held}") || graphics != expected_graphics || acct != "1" {
                failures.push(format!("{mode}: expected compute 1:{held}, graphics {expected_graphics:?}, accounting 1\n{reader}"));
            }
            holder.finish();
            other.finish();
        },
    );
}

/// The host PID `fgpu status` inside the namespace of `target` shows for its processes (its
/// own snapshot does not fill host PIDs in, as one taken on the host would).
fn ledger_host_pids_seen_inside(env: &Env, target: u32) -> Vec<u64> {
    let status = inside(env, target).arg(fgpu_bin()).args(["status", "--json"]).run();
    let report: Value = serde_json::from_str(&status.stdout()).unwrap_or(Value::Null);
    report["ledgers"][0]["processes"].as_array().map(|ps| ps.iter().filter_map(|p| p["host_pid"].as_u64()).collect()).unwrap_or_default()
}

/// NVML's utilisation samples inside the container, under every behaviour: the container's
/// process by its PID there (its samples carry that PID, or its host PID, which the service
/// told it); an uncapped process on the host never shows.
#[test]
fn utilisation_samples_in_a_pid_namespace_answer_for_the_container_under_every_driver() {
    under_modes(
        "util",
        &MODES,
        |_| true,
        |m, failures| {
            let (mode, env) = (m.name, &m.env);
            let mut neighbour = env.command(client("compute_load")).env("FGPU_LEDGER", env.dir.join("other")).spawn();
            neighbour.wait_for("ready");
            let script = format!("exec {} --sync-every 8", client("compute_load").display());
            let mut process = in_namespace(env, &script, m.socket.as_deref()).spawn();
            process.wait_for("ready");
            let host_pid = first_child(process.pid());
            eventually("the process inside learns its host PID from the service", Duration::from_secs(5), || {
                ledger_host_pids_seen_inside(env, host_pid).contains(&(host_pid as u64))
            });
            let neighbour_kernels = env.sim().items_submitted(0, neighbour.pid()).kernels;
            std::thread::sleep(Duration::from_millis(600));
            let reader = nvml_inside(m, host_pid).arg("util").run();
            // The neighbour whose samples must not show ran kernels over the samples read.
            neighbour.assert_running("the uncapped neighbour, whose samples NVML inside must not show");
            assert_load(
                "kernels the uncapped neighbour ran while the samples were taken",
                env.sim().items_submitted(0, neighbour.pid()).kernels - neighbour_kernels,
                1,
            );
            let pids = out_field(&reader, "util", "pids");
            println!("{mode}: samples for {pids:?}");
            if !reader.output.status.success() || pids.split(',').any(|p| p != "1") || pids.is_empty() {
                failures.push(format!("{mode}: expected samples of PID 1 only\n{reader}"));
            }
            process.finish();
            neighbour.finish();
        },
    );
}

/// A ledger whose processes sit in two PID namespaces (the containers of one pod): each
/// process measures its own utilisation samples, under the PID NVML knows it by, and
/// charges the ledger's one bucket, so together they hold the share. Under caller-namespace
/// PIDs nothing else is needed; under host PIDs the host's service tells each its host PID.
#[test]
fn a_ledger_across_two_pid_namespaces_holds_its_share() {
    under_modes(
        "pod",
        &["caller", "host"],
        |mode| mode == "host",
        |m, failures| {
            let (mode, env, socket) = (m.name, &m.env, m.socket.as_deref());
            let script = format!("exec {}", client("compute_load").display());
            // Started at the same instant, as a pod's containers are: the first to launch sets the
            // ledger's share although the other is already live (issue 19, part C).
            let mut a = in_namespace(env, &script, socket).env("FGPU_COMPUTE", "30%").spawn();
            let mut b = in_namespace(env, &script, socket).env("FGPU_COMPUTE", "30%").spawn();
            a.wait_for("ready");
            b.wait_for("ready");
            let (pa, pb) = (first_child(a.pid()), first_child(b.pid()));
            let w = beside_uncapped(m, failures);
            let got = (w.busy_of_host_pid(pa) + w.busy_of_host_pid(pb)) as f64 * 100.0 / w.len_ns().max(1) as f64;
            println!(
                "{mode}: the two processes of one 30 % ledger ran {got:.2} % together ({:.2} % and {:.2} %)",
                w.busy_of_host_pid(pa) as f64 * 100.0 / w.len_ns().max(1) as f64,
                w.busy_of_host_pid(pb) as f64 * 100.0 / w.len_ns().max(1) as f64
            );
            if !(25.0..=35.0).contains(&got) {
                failures.push(format!("{mode}: {got:.2} % for a 30 % share\n{w:?}"));
            }
            a.finish();
            b.finish();
        },
    );
}

/// `fgpu doctor` inside the container names the behaviour it sees, while a capped process
/// runs there, under every behaviour; on the host it says it cannot tell.
#[test]
fn doctor_in_a_pid_namespace_names_the_behaviour() {
    under_modes(
        "doctor",
        &MODES,
        |_| true,
        |m, failures| {
            let (mode, env) = (m.name, &m.env);
            // Later small allocations pick the service's answer up (no call waits for it).
            let script = format!("exec {} init primary alloc 1G sleep 300 alloc 1M sleep 700 alloc 1M hold", client("cuclient").display());
            let mut holder = in_namespace(env, &script, m.socket.as_deref()).spawn();
            holder.wait_for("holding");
            let host_pid = first_child(holder.pid());
            if mode == "host" {
                // Under host PIDs the doctor tells by the holder's entry under its host PID.
                eventually("the holder learns its host PID", Duration::from_secs(5), || {
                    ledger_host_pids_seen_inside(env, host_pid).contains(&(host_pid as u64))
                });
            }
            let socket = m.socket.as_deref().expect("the doctor runs with the service");
            let doctor = inside(env, host_pid).arg(fgpu_bin()).args(["doctor", "--json"]).shim().limit("8G").env("FGPU_HOST_SOCKET", socket).run();
            let report: Value = serde_json::from_str(&doctor.stdout()).unwrap_or(Value::Null);
            let said = report["nvml_pids"].as_str().unwrap_or("").to_string();
            println!("{mode}: fgpu doctor says {said:?}");
            if said != mode {
                failures.push(format!("{mode}: fgpu doctor says {said:?}\n{doctor}"));
            }
            if mode == "host" {
                let outside = env.command(fgpu_bin()).args(["doctor", "--json"]).shim().limit("8G").run();
                let report: Value = serde_json::from_str(&outside.stdout()).unwrap_or(Value::Null);
                if report["nvml_pids"] != "host-namespace" || !outside.stdout().contains("cannot be told from here") {
                    failures.push(format!("on the host, fgpu doctor must say it cannot tell\n{outside}"));
                }
            }
            holder.finish();
        },
    );
}

/// `fgpu status` inside the container, under every behaviour: the container's process by
/// its PID there, with what the simulated driver holds for it (module memory included).
#[test]
fn status_in_a_pid_namespace_shows_the_container_under_every_driver() {
    under_modes(
        "status",
        &MODES,
        |_| false,
        |m, failures| {
            let (mode, env) = (m.name, &m.env);
            let script = format!("exec {} init primary module 256M alloc 512M hold", client("cuclient").display());
            let mut holder = in_namespace(env, &script, None).spawn();
            holder.wait_for("holding");
            let host_pid = first_child(holder.pid());
            let status = inside(env, host_pid).arg(fgpu_bin()).args(["status", "--json"]).run();
            let truth = env.sim().processes().into_iter().find(|p| p.host_pid == host_pid).map(|p| p.per_device_used[0]).unwrap_or(0);
            let report: Value = serde_json::from_str(&status.stdout()).unwrap_or(Value::Null);
            let processes = report["ledgers"][0]["processes"].as_array().cloned().unwrap_or_default();
            let shown: Vec<(u64, u64)> = processes.iter().map(|p| (p["pid"].as_u64().unwrap_or(0), p["used_bytes"].as_u64().unwrap_or(0))).collect();
            println!("{mode}: status shows {shown:?}; the simulated driver holds {truth} for the process");
            if truth != CONTEXT + 768 * MIB || shown != [(1, truth)] {
                failures.push(format!("{mode}: expected PID 1 holding {}\n{status}", CONTEXT + 768 * MIB));
            }
            holder.finish();
        },
    );
}

/// A 30 % share in a PID namespace beside an uncapped process on the host reads its own
/// samples: under caller-namespace PIDs (with or without a memory figure) with nothing
/// else, under host PIDs and under no entries at all with the host's service. Measured on
/// the simulator's timeline: each within 25 to 35 %.
#[test]
fn a_share_in_a_pid_namespace_holds_under_every_driver() {
    under_modes(
        "compute",
        &MODES,
        |mode| matches!(mode, "host" | "none"),
        |m, failures| {
            let mode = m.name;
            let script = format!("exec {}", client("compute_load").display());
            let mut capped = in_namespace(&m.env, &script, m.socket.as_deref()).env("FGPU_COMPUTE", "30%").spawn();
            capped.wait_for("ready");
            let host_pid = first_child(capped.pid());
            let w = beside_uncapped(m, failures);
            let got = w.busy_of_host_pid(host_pid) as f64 * 100.0 / w.len_ns().max(1) as f64;
            println!("{mode}: the 30 % process ran {got:.2} %");
            if !(25.0..=35.0).contains(&got) {
                failures.push(format!("{mode}: {got:.2} % for a 30 % share\n{w:?}"));
            }
            capped.finish();
        },
    );
}

/// The crash windows of untracked memory, with the victim in a PID namespace, under every
/// behaviour: killed between measuring what NVML (or the device, around the load) shows and
/// charging it, or right after, the ledger stays exact while a survivor on the host runs.
#[test]
fn untracked_memory_crash_windows_in_a_pid_namespace_under_every_driver() {
    const CAP: u64 = 4 * GIB;
    const SURVIVOR: u64 = GIB + CONTEXT;
    for point in ["untracked.measured", "untracked.charged", "ledger.force_add.after"] {
        under_modes(
            &format!("crash-{point}"),
            &MODES,
            |_| false,
            |m, failures| {
                let (mode, env) = (m.name, &m.env);
                let mut survivor = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("4G").spawn();
                survivor.wait_for("holding");
                // Not PID 1 of its namespace (`sh` is): the namespace's init ignores a SIGKILL it
                // sends itself.
                let script = format!("{} init primary module 100M ctxsync", client("cuclient").display());
                let victim = env
                    .command("unshare")
                    .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
                    .env("LD_PRELOAD", crash_front_path())
                    .limit("4G")
                    .env("FGPU_HOST_SOCKET", env.dir.join("no-service-here.sock"))
                    .env("FGPU_CRASH_AT", point)
                    .run();
                let killed = victim.output.status.signal() == Some(libc::SIGKILL) || victim.output.status.code() == Some(128 + libc::SIGKILL);
                if !killed {
                    failures.push(format!("{mode} {point}: the victim never reached the crash point\n{victim}"));
                    return;
                }
                let status = env.command(fgpu_bin()).args(["status", "--json"]).success();
                let report: Value = serde_json::from_str(&status.stdout()).unwrap_or(Value::Null);
                let ledger = &report["ledgers"][0];
                let device_used = ledger["devices"][0]["used_bytes"].as_u64().unwrap_or(u64::MAX);
                let exact = (CAP - SURVIVOR - CONTEXT).to_string();
                let fresh = env.client(&["init", "primary", "alloc", &exact, "alloc", "1"]).shim().limit("4G").success();
                let rcs: Vec<String> = fresh.lines("alloc").iter().filter_map(|l| field(l, "rc")).collect();
                let sim = env.sim();
                sim.reclaim_dead();
                let driver = sim.device_used(0);
                println!("{mode} {point}: ledger {device_used}, fresh process {rcs:?}, driver {driver}");
                if device_used != SURVIVOR || rcs != ["0", "2"] || driver != SURVIVOR {
                    failures.push(format!("{mode} {point}: ledger {device_used}, driver {driver}, survivor {SURVIVOR}, fresh {rcs:?}\n{status}\n{fresh}"));
                }
                survivor.finish();
            },
        );
    }
}
