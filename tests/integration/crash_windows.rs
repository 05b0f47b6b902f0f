//! Every crash window of the accounting, tested: a process killed by SIGKILL at each named
//! point of each path (a test build of the shim kills itself there, `core/src/crash.rs`),
//! while a survivor holds memory. After each kill:
//!
//! 1. `fgpu status --json` shows the device's `used_bytes` equal to the sum of the live
//!    processes' `used_bytes`, which is what the survivor holds;
//! 2. a fresh process is granted `cap - holdings - its own context`, to the byte, and not
//!    one byte more;
//! 3. the simulated driver's own count agrees with the ledger.
//!
//! docs/reliability.md lists the windows with these tests' names. Every window is run twice:
//! with the ledger in a System V segment, and served (a sealed memory file handed out by a
//! keeper over a socket, as a Kubernetes claim's pods share it: `fgpu_core::ledger::served`),
//! with the served storage's own window besides.

use fgpu_tests::*;
use std::os::unix::process::ExitStatusExt;

const CAP: u64 = 4 * GIB;
const CONTEXT: u64 = 300 * MIB;
/// The survivor: 1 GiB and its context.
const SURVIVOR: u64 = GIB + CONTEXT;

/// (crash point, what the victim runs, a process to kill first so the victim meets a dead one)
const WINDOWS: &[(&str, &str, bool)] = &[
    ("ledger.join.locked", "init primary", false),
    ("ledger.join.filled", "init primary", false),
    ("ledger.spend.after", "init primary alloc 1M", false),
    ("ledger.refill.locked", "init primary alloc 100M", false),
    ("ledger.refill.after", "init primary alloc 100M", false),
    ("ledger.release.after", "init primary alloc 1M free", false),
    // 4096 - 1324 (survivor) - 300 (own context) = 2472 MiB: only with the survivor's credit.
    ("ledger.take_back.after_one", "init primary alloc 2472M", false),
    ("ledger.reclaim.locked", "init primary alloc 2472M", true),
    ("ledger.force_add.after", "init primary module 100M ctxsync", false),
    ("context.reserved", "init primary", false),
    ("context.created", "init primary", false),
    ("context.destroyed", "init primary ctx ctxdestroy", false),
    ("context.released", "init primary alloc 64M release", false),
    ("alloc.reserved", "init primary alloc 100M", false),
    ("alloc.allocated", "init primary alloc 100M", false),
    ("free.freed", "init primary alloc 100M free", false),
    ("untracked.measured", "init primary module 100M ctxsync", false),
    ("untracked.charged", "init primary module 100M ctxsync", false),
    ("pool.reserved", "init primary async 64M", false),
    ("pool.allocated", "init primary async 64M", false),
    ("sync.returned", "init primary async 64M trim 0", false),
    ("vmm.reserved", "init primary vmm 64M", false),
    ("vmm.created", "init primary vmm 64M", false),
    ("vmm.mapped", "init primary vmm 64M", false),
    ("vmm.unmapped", "init primary vmm 64M vmmunmap", false),
    ("vmm.released", "init primary vmm 64M vmmrelease", false),
    ("array.reserved", "init primary array 4096 4096", false),
    ("array.created", "init primary array 4096 4096", false),
    ("array.destroyed", "init primary array 4096 4096 arraydestroy", false),
    ("graph.reserved", "init primary graph 64M launch", false),
    ("graph.launched", "init primary graph 64M launch", false),
];

/// Windows only a served ledger has: its member between being handed the memory file and
/// anything else.
const SERVED_WINDOWS: &[(&str, &str, bool)] = &[("ledger.served.mapped", "init primary", false)];

/// The storage a window runs in: a System V segment, or a served ledger and its keeper
/// (this test process, as fgpu-kubelet-plugin keeps a claim's).
enum Storage {
    Segment,
    /// Held for the window: dropped, the keeper stops.
    Served(#[allow(dead_code)] fgpu_core::ledger::keeper::Serving),
}

impl Storage {
    fn served(env: &Env) -> Storage {
        Storage::Served(env.keep_ledger().0)
    }

    /// `cmd` as a process of this storage's ledger.
    fn on(&self, env: &Env, cmd: Cmd) -> Cmd {
        match self {
            Storage::Segment => cmd,
            Storage::Served(_) => cmd.env("FGPU_LEDGER_SOCKET", env.ledger_socket()),
        }
    }
}

fn status_json(env: &Env, storage: &Storage) -> serde_json::Value {
    let run = storage.on(env, env.command(fgpu_bin()).args(["status", "--json"])).success();
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"))
}

/// Runs one window; returns what went wrong, if anything.
fn one_window(point: &str, victim: &str, dead_first: bool, served: bool) -> Result<(), String> {
    let env = Env::new(&format!("crash-{point}{}", if served { "-served" } else { "" }));
    let storage = if served { Storage::served(&env) } else { Storage::Segment };
    let client = |args: &[&str]| storage.on(&env, env.client(args));
    let mut survivor = client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("4G").spawn();
    survivor.wait_for("holding");
    if served && crate::dra_shared::memfd_of(survivor.pid()).is_none() {
        return Err("the survivor holds no served ledger's memory file".into());
    }
    if dead_first {
        let mut dead = client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("4G").spawn();
        dead.wait_for("holding");
        dead.kill(libc::SIGKILL);
    }
    let args: Vec<&str> = victim.split_whitespace().collect();
    let run = client(&args).env("LD_PRELOAD", crash_front_path()).limit("4G").env("FGPU_CRASH_AT", point).run();
    if run.output.status.signal() != Some(libc::SIGKILL) {
        return Err(format!("the victim never reached the crash point\n{run}"));
    }
    // 1. status: the device total is the sum of the live processes, and that is the survivor.
    let status = status_json(&env, &storage);
    let ledger = &status["ledgers"][0];
    let device_used = ledger["devices"][0]["used_bytes"].as_u64().unwrap_or(u64::MAX);
    let processes = ledger["processes"].as_array().cloned().unwrap_or_default();
    let sum: u64 = processes.iter().map(|p| p["used_bytes"].as_u64().unwrap()).sum();
    if device_used != sum || device_used != SURVIVOR || processes.len() != 1 {
        return Err(format!("status after the kill: device used {device_used}, processes sum {sum}, survivor holds {SURVIVOR}\n{ledger:#}"));
    }
    // 2. a fresh process gets the rest of the cap to the byte, and not one byte more.
    let exact = (CAP - SURVIVOR - CONTEXT).to_string();
    let fresh = client(&["init", "primary", "alloc", &exact, "alloc", "1"]).shim().limit("4G").success();
    let rcs: Vec<String> = fresh.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    if rcs != ["0", "2"] {
        return Err(format!("a fresh process was not granted exactly cap - holdings - its context ({exact} bytes)\n{fresh}"));
    }
    // 3. the simulated driver holds what the ledger counts.
    let sim = env.sim();
    sim.reclaim_dead();
    if sim.device_used(0) != SURVIVOR {
        return Err(format!("the simulated driver holds {} bytes, the ledger counts {SURVIVOR}", sim.device_used(0)));
    }
    survivor.finish();
    Ok(())
}

fn all_windows(windows: &[(&str, &str, bool)], served: bool) {
    let failures: Vec<String> = windows
        .iter()
        .filter_map(|(point, victim, dead_first)| one_window(point, victim, *dead_first, served).err().map(|e| format!("== {point} ({victim}):\n{e}")))
        .collect();
    assert!(failures.is_empty(), "{} of {} crash windows failed:\n{}", failures.len(), windows.len(), failures.join("\n"));
}

#[test]
fn a_kill_at_any_crash_point_leaves_the_ledger_exact_while_a_survivor_runs() {
    all_windows(WINDOWS, false);
}

#[test]
fn a_kill_at_any_crash_point_leaves_a_served_ledger_exact_while_a_survivor_runs() {
    all_windows(&[WINDOWS, SERVED_WINDOWS].concat(), true);
}

#[test]
fn every_crash_point_in_the_code_is_tested() {
    // A crash point added to the code without a row here (and in docs/reliability.md) fails.
    let mut in_code = Vec::new();
    for dir in ["core/src", "shim/src"] {
        for entry in walk(&workspace().join(dir)) {
            let text = std::fs::read_to_string(&entry).unwrap();
            for part in text.split("crash_point!(\"").skip(1) {
                in_code.push(part.split('"').next().unwrap().to_string());
            }
        }
    }
    in_code.sort();
    in_code.dedup();
    let mut tested: Vec<String> = WINDOWS.iter().chain(SERVED_WINDOWS).map(|(p, _, _)| p.to_string()).collect();
    tested.sort();
    assert_eq!(in_code, tested, "crash points in the code vs. rows of this test");
    let doc = std::fs::read_to_string(workspace().join("docs/reliability.md")).unwrap();
    for point in &tested {
        assert!(doc.contains(&format!("`{point}`")), "docs/reliability.md has no row for `{point}`");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_panic_after_the_driver_acted_returns_the_drivers_answer() {
    // A panic inside a hook is caught; once the driver has acted (here: freed, allocated,
    // created), the program gets the driver's own answer, not a made-up error.
    let env = Env::new("panic-after-real");
    for (point, ops, line, rc) in [
        ("free.freed", "init primary alloc 100M free", "free", "0"),
        ("alloc.allocated", "init primary alloc 100M", "alloc", "0"),
        ("vmm.created", "init primary vmm 64M", "vmm", "0"),
        ("alloc.reserved", "init primary alloc 100M", "alloc", "2"),
    ] {
        let args: Vec<&str> = ops.split_whitespace().collect();
        let run = env.client(&args).env("LD_PRELOAD", crash_front_path()).limit("4G").env("FGPU_PANIC_AT", point).run();
        assert!(run.output.status.success(), "{point}: the panic must not take the program down\n{run}");
        assert_eq!(run.field(line, "rc"), rc, "{point}\n{run}");
        assert!(run.stderr().contains("internal error in a driver hook"), "{point}: one line says so\n{run}");
    }
}
