//! One cap across processes: sharing, dead processes, PID namespaces, fork/exec, and a
//! stress run with random SIGKILLs checked against the simulated driver's own accounting.

use fgpu_tests::*;
use std::time::{Duration, Instant};

#[test]
fn processes_of_one_ledger_share_the_cap_and_a_killed_one_is_reclaimed() {
    let env = Env::new("share");
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("2G").spawn();
    holder.wait_for("holding");
    let refused = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    assert_eq!(refused.rc("alloc"), 2, "second process must not pass the shared cap\n{refused}");
    let other_ledger = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").env("FGPU_LEDGER", env.dir.join("other")).success();
    assert_eq!(other_ledger.rc("alloc"), 0, "another ledger is independent\n{other_ledger}");

    holder.kill(libc::SIGKILL);
    let start = Instant::now();
    let after = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    assert_eq!(after.rc("alloc"), 0, "the killed process's share is reclaimed\n{after}");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(env.ledger_used(), 0);
}

/// Liveness is a lock the kernel drops at death, not a PID comparison: a new process never
/// sees a dead one's slot as its own, whatever its PID. Each process here is PID 1 of a PID
/// namespace of its own, so each has, for certain, the PID of every dead one before it.
#[test]
fn a_reused_pid_cannot_inherit_a_share() {
    if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1): each process is PID 1 of a PID namespace of its own") {
        return;
    }
    let env = Env::new("reuse");
    let as_pid_1 = |args: &[&str]| env.command("unshare").args(["--pid", "--fork", "--mount-proc"]).arg(client("cuclient")).args(args).shim().limit("1G");
    for round in 0..3 {
        let mut p = as_pid_1(&["init", "primary", "alloc", "512M", "hold"]).spawn();
        p.wait_for("holding");
        // The ledger knows the holder by PID 1, the PID the dead holders before it had.
        let seen = env.ledger().snapshot(None);
        let live: Vec<u32> = seen.processes.iter().filter(|p| p.alive).map(|p| p.pid).collect();
        assert_eq!(live, [1], "round {round}: one live process, PID 1 of its namespace\n{seen:?}");
        let holder = first_child(p.pid());
        // SAFETY: signalling the process this test started (unshare's child).
        unsafe { libc::kill(holder as i32, libc::SIGKILL) };
        p.finish();
    }
    let run = as_pid_1(&["init", "primary", "alloc", "700M", "info"]).success();
    assert_eq!(run.rc("alloc"), 0, "{run}");
    assert_eq!(run.field("info", "free"), (GIB - 300 * MIB - 700 * MIB).to_string(), "{run}");
}

#[test]
fn a_forked_child_does_not_keep_its_dead_parent_counted() {
    // The child inherits the parent's ledger descriptor; if it kept it, the parent's slot
    // would look alive after the parent is killed. The shim drops it in the child.
    let env = Env::new("fork");
    let mut parent = env.client(&["init", "primary", "alloc", "1G", "forksleep", "20000", "hold"]).shim().limit("2G").spawn();
    let forked = parent.wait_for("forked");
    let child: i32 = field(&forked, "pid").unwrap().parse().unwrap();
    parent.wait_for("holding");
    parent.kill(libc::SIGKILL);
    // The child drops the inherited ledger in its fork handler, which runs when the child is
    // first scheduled; on a loaded machine that can be just after the parent was killed.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    while last.rc("alloc") != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        last = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    }
    // The child still lives once the share has come back (it sleeps 20 s): had it died, its
    // inherited descriptor would have gone with it, and the test would prove nothing.
    let child_alive = process_alive(child as u32);
    // SAFETY: signalling the orphaned child we caused to exist.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(child_alive, "the forked child (pid {child}, state {:?}) died before the parent's share came back\n{last}", process_state(child as u32));
    assert_eq!(last.rc("alloc"), 0, "the dead parent's 1 GiB is reclaimed while its child lives\n{last}");
}

#[test]
fn exec_keeps_the_cap() {
    let env = Env::new("exec");
    let client = client("cuclient");
    let script = format!("exec {} init primary alloc 1G alloc 1G", client.display());
    let run = env.command("sh").args(["-c", &script]).shim().limit("2G").success();
    assert_eq!(run.lines("alloc")[1], "alloc 1073741824 rc=2", "{run}");
}

#[test]
fn pid_namespaces_share_one_ledger() {
    if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1) for a PID namespace") {
        return;
    }
    let env = Env::new("pidns");
    let client = client("cuclient");
    let mut inside = env
        .command("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(&client)
        .args(["init", "primary", "alloc", "1G", "hold"])
        .shim()
        .limit("2G")
        .spawn();
    inside.wait_for("holding");
    let outside = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    assert_eq!(outside.rc("alloc"), 2, "the namespaced process's 1 GiB counts here\n{outside}");
    let snapshot = env.ledger().snapshot(None);
    let namespaced = snapshot.processes.iter().find(|p| p.used[0] >= GIB).expect("namespaced process in the ledger");
    assert_eq!(namespaced.pid, 1, "inside its namespace it is PID 1");
    assert!(namespaced.pid_here.is_some_and(|p| p != 1), "seen from here with our PID for it: {namespaced:?}");
    // Kill the whole namespace (unshare and its child).
    let unshare_pid = inside.pid() as i32;
    let children = std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children")).unwrap_or_default();
    for pid in children.split_whitespace() {
        // SAFETY: signalling a process we started.
        unsafe { libc::kill(pid.parse().unwrap(), libc::SIGKILL) };
    }
    inside.kill(libc::SIGKILL);
    eventually("namespaced process reclaimed", Duration::from_secs(5), || env.ledger_used() == 0);
    let after = env.client(&["init", "primary", "alloc", "1G"]).shim().limit("2G").success();
    assert_eq!(after.rc("alloc"), 0, "{after}");
}

/// The bytes the ledger counts for processes that are dead ("stranded"), leaving out the
/// dying ones (dead, but the driver may still hold their memory: they are kept on purpose).
fn stranded(ledger: &fgpu_core::ledger::Ledger) -> u64 {
    ledger.snapshot(None).processes.iter().filter(|p| !p.alive && !p.dying).map(|p| p.reserved[0]).sum()
}

/// How many accesses (scans for dead processes, as a refusal, `cuMemGetInfo` or
/// `fgpu status` makes) until nothing is stranded; the last figure seen before.
fn accesses_to_repair(ledger: &fgpu_core::ledger::Ledger) -> u32 {
    let mut accesses = 0;
    while stranded(ledger) > 0 && accesses < 100 {
        ledger.reclaim_dead(None);
        accesses += 1;
    }
    accesses
}

/// What the simulated driver holds for live processes at one instant: the sum over live
/// processes, taken twice, kept only if both sums agree and the driver's own counter did
/// not move meanwhile (a sum read while memory moves from one process to another could
/// count it twice).
fn driver_live_usage(sim: &fgpu_sim_state::SimState) -> Option<u64> {
    let before = sim.device_used_counter(0);
    let live = sim.device_used(0);
    let between = sim.device_used_counter(0);
    let again = sim.device_used(0);
    (before == between && sim.device_used_counter(0) == before && live == again).then_some(live)
}

/// The soak of docs/reliability.md: 8 workers of 4 threads churn through cuMemAlloc,
/// cuMemAllocAsync and cuMemCreate (1 MiB to 1 GiB) under one 8 GiB cap; a random worker is
/// killed with SIGKILL about 9 times a second and replaced, for `FGPU_SOAK_SECONDS` (60 by
/// default), while a survivor holds 1 GiB throughout. Checked:
/// * the simulated driver never holds more than the cap for live processes;
/// * the bytes of dead processes ("stranded") are gone after one access: the monitor looks
///   (largest stranded amount seen), makes one access, and counts how many it took;
/// * at the end, nothing stranded after one access and a fresh process is granted the rest
///   of the cap to the byte.
#[test]
fn soak_kills_while_a_survivor_lives() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    let seconds: u64 = std::env::var("FGPU_SOAK_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let cap = 8 * GIB;
    let env = Env::new("soak");
    let churn = client("churn");
    let mut survivor = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    survivor.wait_for("holding");
    let ledger = Arc::new(env.ledger());
    let sim = env.sim();
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (stop, ledger) = (stop.clone(), ledger.clone());
        std::thread::spawn(move || {
            let (mut driver_peak, mut driver_samples, mut stranded_peak, mut looks) = (0u64, 0u64, 0u64, 0u64);
            let mut repairs = [0u64; 4]; // accesses it took: 0, 1, 2, more
            while !stop.load(Relaxed) {
                if let Some(live) = driver_live_usage(&sim) {
                    driver_peak = driver_peak.max(live);
                    driver_samples += 1;
                    if live > 8 * GIB && std::env::var_os("FGPU_SOAK_DEBUG").is_some() {
                        let procs = sim.processes();
                        let snap = ledger.snapshot(None);
                        eprintln!("OVER: live {live}");
                        for p in procs {
                            let l = snap.processes.iter().find(|q| q.pid == p.pid);
                            eprintln!("  pid {} sim {} ledger {:?}", p.pid, p.per_device_used[0], l.map(|q| (q.used[0], q.reserved[0], q.alive)));
                        }
                    }
                }
                stranded_peak = stranded_peak.max(stranded(&ledger));
                repairs[accesses_to_repair(&ledger).min(3) as usize] += 1;
                looks += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (driver_peak, driver_samples, stranded_peak, looks, repairs)
        })
    };
    let spawn = |env: &Env| env.command(&churn).args(["4", "3600", "1", "1024"]).shim().limit("8G").spawn();
    let mut workers: Vec<Background> = (0..8).map(|_| spawn(&env)).collect();
    let mut kills = 0u64;
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        // Kills on a fixed beat (one every 105 ms from the start), however long a spawn
        // takes on a busy host.
        let next = start + Duration::from_millis(105) * (kills as u32 + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let victim = (seed % workers.len() as u64) as usize;
        workers[victim].kill(libc::SIGKILL);
        kills += 1;
        workers[victim] = spawn(&env);
    }
    stop.store(true, Relaxed);
    let (driver_peak, driver_samples, stranded_peak, looks, repairs) = monitor.join().unwrap();
    for w in &mut workers {
        w.kill(libc::SIGKILL);
    }
    let final_accesses = accesses_to_repair(&ledger);
    // A fresh process is granted the rest of the cap to the byte, and one byte more refused.
    let survivor_holds = GIB + 300 * MIB;
    let exact = (cap - survivor_holds - 300 * MIB).to_string();
    let fresh = env.client(&["init", "primary", "alloc", &exact, "alloc", "1"]).shim().limit("8G").success();
    println!(
        "soak: {seconds} s, {kills} kills; driver peak {} MiB of a {} MiB cap ({driver_samples} samples); \
         largest stranded {} MiB in {looks} looks; accesses it took to repair: 0 in {}, 1 in {}, 2 in {}, more in {}; \
         after the last kill: {final_accesses} access(es)",
        driver_peak / MIB,
        cap / MIB,
        stranded_peak / MIB,
        repairs[0],
        repairs[1],
        repairs[2],
        repairs[3]
    );
    let rcs: Vec<String> = fresh.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    assert_eq!(rcs, ["0", "2"], "the fresh process was not granted exactly {exact} bytes\n{fresh}");
    assert!(final_accesses <= 1, "stranded bytes outlived {final_accesses} accesses after the last kill");
    assert_eq!(repairs[3], 0, "stranded bytes outlived 2 accesses {} times", repairs[3]);
    assert!(driver_peak <= cap, "the simulated driver held {driver_peak} bytes for live processes, over the {cap}-byte cap");
    assert!(driver_peak > cap / 2, "the soak never came near the cap (peak {driver_peak}); it tests nothing");
    assert!(kills >= 8 * seconds, "only {kills} kills in {seconds} s");
    let status = env.command(fgpu_bin()).args(["status", "--json"]).success();
    let value: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    assert_eq!(value["ledgers"][0]["devices"][0]["used_bytes"].as_u64(), Some(survivor_holds), "{status}");
    survivor.finish();
}

/// Watches the simulated driver's memory for `run`'s duration: the most it held at once for
/// processes, live or dying (their memory not freed yet).
fn driver_peak_during<T>(env: &Env, run: impl FnOnce() -> T) -> (T, u64) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let sim = env.sim();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Relaxed) {
                peak = peak.max(sim.device_used(0));
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        })
    };
    let out = run();
    stop.store(true, Relaxed);
    (out, watcher.join().unwrap())
}

/// docs/reliability.md, "A process dies while the driver holds its memory": the driver
/// frees a killed process's memory some time after the kernel drops its ledger lock (here
/// 600 ms and 3 s: `FGPU_SIM_EXIT_FREE_DELAY`). A newcomer asking for that memory
/// meanwhile waits for it (up to 1 s), then is refused; it is never granted into memory
/// the driver still holds, so the device never holds more than the cap for the ledger.
#[test]
fn memory_a_dead_process_still_has_in_the_driver_is_never_granted() {
    for (delay, granted_at_once) in [("600ms", true), ("3s", false)] {
        let env = Env::new(&format!("dying-{delay}"));
        let cap = 8 * GIB;
        let client = |args: &[&str]| env.client(args).shim().limit("8G").env("FGPU_SIM_EXIT_FREE_DELAY", delay);
        let mut survivor = client(&["init", "primary", "alloc", "1G", "hold"]).spawn();
        survivor.wait_for("holding");
        let mut victim = client(&["init", "primary", "alloc", "5G", "hold"]).spawn();
        victim.wait_for("holding");
        let (newcomer, peak) = driver_peak_during(&env, || {
            victim.kill(libc::SIGKILL);
            let started = Instant::now();
            let run = client(&["init", "primary", "alloc", "5G"]).success();
            (run, started.elapsed())
        });
        let (run, took) = newcomer;
        assert!(peak <= cap, "{delay}: the driver held {} MiB for the ledger's processes, over the {} MiB cap\n{run}", peak / MIB, cap / MIB);
        if granted_at_once {
            assert_eq!(run.rc("alloc"), 0, "{delay}: granted once the driver freed it\n{run}");
            assert!(took >= Duration::from_millis(400), "{delay}: granted after {took:?}, before the driver freed the memory\n{run}");
        } else {
            assert_eq!(run.rc("alloc"), 2, "{delay}: refused while the driver still holds it\n{run}");
            // Once the driver has let it go, it is the cap's again.
            std::thread::sleep(Duration::from_secs(3));
            let (later, peak) = driver_peak_during(&env, || client(&["init", "primary", "alloc", "5G"]).success());
            assert_eq!(later.rc("alloc"), 0, "{later}");
            assert!(peak <= cap, "{later}");
        }
        survivor.finish();
    }
}

/// The tools that observe a ledger ask the driver too: `fgpu status` run while the driver
/// still holds a killed process's memory keeps its slot (shown as dying, its bytes counted)
/// instead of dropping it, so a newcomer is still refused that memory; once the driver has
/// freed it, `fgpu status` drops the slot.
#[test]
fn memory_fgpu_status_keeps_what_the_driver_still_holds_of_a_dead_process() {
    let env = Env::new("dying-status");
    let cap = 8 * GIB;
    let client = |args: &[&str]| env.client(args).shim().limit("8G").env("FGPU_SIM_EXIT_FREE_DELAY", "4s");
    let mut survivor = client(&["init", "primary", "alloc", "1G", "hold"]).spawn();
    survivor.wait_for("holding");
    let mut victim = client(&["init", "primary", "alloc", "5G", "hold"]).spawn();
    victim.wait_for("holding");
    let victim_pid = victim.pid();
    victim.kill(libc::SIGKILL);
    let status = env.command(fgpu_bin()).args(["status", "--json"]).success();
    let value: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let dying: Vec<u64> = value["ledgers"][0]["dying"].as_array().unwrap().iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert_eq!(dying, [u64::from(victim_pid)], "the killed process, still listed by the driver, is kept as dying\n{status}");
    let (run, peak) = driver_peak_during(&env, || client(&["init", "primary", "alloc", "5G"]).success());
    assert_eq!(run.rc("alloc"), 2, "refused while the driver still holds the dead process's memory\n{run}");
    assert!(peak <= cap, "the driver held {} MiB for the ledger's processes, over the {} MiB cap\n{run}", peak / MIB, cap / MIB);
    // Once the simulated driver has freed it, status drops it.
    let freed = Instant::now() + Duration::from_secs(10);
    while env.sim().processes().iter().any(|p| p.pid == victim_pid) {
        assert!(Instant::now() < freed, "the simulated driver never freed the killed process's memory");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = env.command(fgpu_bin()).args(["status", "--json"]).success();
    let value: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let pids = |list: &str| -> Vec<u64> { value["ledgers"][0][list].as_array().unwrap().iter().filter_map(|p| p["pid"].as_u64()).collect() };
    assert_eq!(
        pids("reclaimed"),
        [u64::from(victim_pid)],
        "dropped once the driver freed it
{status}"
    );
    assert!(!pids("dying").contains(&u64::from(victim_pid)), "{status}");
    let run = client(&["init", "primary", "alloc", "5G"]).success();
    assert_eq!(run.rc("alloc"), 0, "{run}");
    survivor.finish();
}
