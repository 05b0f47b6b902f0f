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

#[test]
fn a_reused_pid_cannot_inherit_a_share() {
    // Liveness is a lock the kernel drops at death, not a PID comparison: a new process
    // never sees a dead one's slot as its own, whatever its PID.
    let env = Env::new("reuse");
    for _ in 0..3 {
        let mut p = env.client(&["init", "primary", "alloc", "512M", "hold"]).shim().limit("1G").spawn();
        p.wait_for("holding");
        p.kill(libc::SIGKILL);
    }
    let run = env.client(&["init", "primary", "alloc", "700M", "info"]).shim().limit("1G").success();
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
    // SAFETY: signalling the orphaned child we caused to exist.
    unsafe { libc::kill(child, libc::SIGKILL) };
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
    if !is_root() {
        panic!("this test needs root for unshare --pid (CI runs as root)");
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

#[test]
fn stress_racing_processes_never_pass_the_cap() {
    let cap = 4 * GIB;
    let env = Env::new("stress").context_overhead("200M");
    let stress = client("stress");
    let spawn = |env: &Env| env.command(&stress).args(["4", "30", "96"]).shim().limit("4G").spawn();
    // Prime the sim state so the monitor can open it.
    env.client(&["init"]).success();
    let sim = env.sim();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut peak, mut samples) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // The driver's own counter, one atomic read; a sample is kept only if no dead
                // process was still counted in it (summing per-process figures instead would
                // add up moments apart, and count a free and the allocation it made room for
                // both).
                let used = sim.device_used_counter(0);
                if sim.reclaim_dead() == 0 {
                    peak = peak.max(used);
                    samples += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            (peak, samples)
        })
    };
    let mut procs: Vec<Background> = (0..8).map(|_| spawn(&env)).collect();
    let mut kills = 0;
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(400));
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let victim = (seed % procs.len() as u64) as usize;
        procs[victim].kill(libc::SIGKILL);
        kills += 1;
        procs[victim] = spawn(&env);
    }
    for p in &mut procs {
        p.kill(libc::SIGKILL);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (peak, samples) = monitor.join().unwrap();
    println!("stress: {kills} kills, {samples} samples, driver peak {} MiB of a {} MiB cap", peak / MIB, cap / MIB);
    assert!(peak <= cap, "the simulated driver held {peak} bytes, over the {cap}-byte cap");
    assert!(peak > cap / 2, "the stress never came near the cap (peak {peak}); it tests nothing");
    assert_eq!(env.ledger_used(), 0, "ledger back to zero");
    let sim = env.sim();
    sim.reclaim_dead();
    assert_eq!(sim.device_used(0), 0, "device back to zero");
}
