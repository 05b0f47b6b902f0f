//! The `fgpu` command against the simulated driver and real capped processes: `run`
//! (caps, independence, exit status, signals), `status` (JSON against the ledger, dead
//! processes, `--all` across mount and PID namespaces), `doctor` (every failure it claims
//! to detect, caused), `exporter` (promtool, numbers against the simulated driver's) and
//! `top` (tmux). What `status` and the exporter show is compared with the simulated driver's
//! own figures (`fgpu_sim_state`), never with the ledger they read.

use fgpu_tests::*;
use serde_json::Value;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn fgpu(env: &Env) -> Cmd {
    // `fgpu run` puts its private ledger directory under TMPDIR: keep it in the test's dir.
    let mut cmd = env.command(fgpu_bin());
    cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
    cmd
}

fn cuclient() -> String {
    client("cuclient").display().to_string()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{run}"))
}

fn private_dirs_left(env: &Env) -> Vec<String> {
    std::fs::read_dir(&env.dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("fgpu-run-")).collect()
}

// ------------------------------------------------------------------------------ fgpu run

/// A shell script for `fgpu run`: a client that holds memory in the background (a
/// grandchild of fgpu: the shell's child), then, once it holds, the shell becomes the
/// second client (fgpu's own child) with `exec`.
fn holder_then_exec(first: &str, second: &str) -> String {
    format!(
        "C={c}; sleep 3 | $C {first} hold > held.out & \
         for i in $(seq 300); do grep -q holding held.out && break; sleep 0.05; done; \
         cat held.out; exec $C {second}",
        c = cuclient()
    )
}

#[test]
fn run_caps_a_child_and_a_grandchild_together() {
    let env = Env::new("cli-run-tree").context_overhead("100M");
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "sh", "-c"]).arg(holder_then_exec("init primary alloc 600M", "init primary alloc 600M")).success();
    let allocs = run.lines("alloc");
    assert_eq!(allocs.len(), 2, "{run}");
    assert!(allocs[0].ends_with("rc=0"), "the grandchild gets its 600M\n{run}");
    assert!(allocs[1].ends_with("rc=2"), "the child must not pass the cap it shares with the grandchild\n{run}");
    // The grandchild outlived the command: fgpu keeps the ledger for it, and says so.
    assert!(run.stderr().contains("still use the cap") && run.stderr().contains("keeping"), "{run}");
    assert_eq!(private_dirs_left(&env).len(), 1);

    // The same two under a cap that fits both.
    let run = fgpu(&env).args(["run", "--limit", "2G", "--", "sh", "-c"]).arg(holder_then_exec("init primary alloc 600M", "init primary alloc 600M")).success();
    assert!(run.lines("alloc").iter().all(|l| l.ends_with("rc=0")), "{run}");

    // A command whose processes are all gone: its private ledger directory goes too.
    let clean = env.dir.join("clean");
    std::fs::create_dir_all(&clean).unwrap();
    let run = fgpu(&env).env("TMPDIR", &clean).args(["run", "--limit", "1G", "--", &cuclient(), "init", "primary", "alloc", "600M", "info"]).success();
    assert_eq!(run.rc("alloc"), 0, "{run}");
    assert_eq!(run.field("info", "total"), GIB.to_string(), "the command sees the cap as its GPU's memory\n{run}");
    assert_eq!(std::fs::read_dir(&clean).unwrap().count(), 0, "fgpu run removes its private ledger directory");
}

#[test]
fn two_runs_have_independent_caps_and_a_named_ledger_is_shared() {
    let env = Env::new("cli-run-two").context_overhead("100M");
    let hold = |ledger: Option<&Path>| {
        let mut cmd = fgpu(&env).args(["run", "--limit", "1G"]);
        if let Some(l) = ledger {
            cmd = cmd.arg("--ledger").arg(l);
        }
        let mut bg = cmd.args(["--", &cuclient(), "init", "primary", "alloc", "700M", "hold"]).spawn();
        bg.wait_for("holding");
        bg
    };
    let mut first = hold(None);
    let second = fgpu(&env).args(["run", "--limit", "1G", "--", &cuclient(), "init", "primary", "alloc", "700M"]).success();
    assert_eq!(second.rc("alloc"), 0, "a second `fgpu run` has its own cap\n{second}");
    first.finish();

    let shared = env.dir.join("team.ledger");
    let mut first = hold(Some(&shared));
    let second = fgpu(&env).args(["run", "--limit", "1G", "--ledger"]).arg(&shared).args(["--", &cuclient(), "init", "primary", "alloc", "700M"]).success();
    assert_eq!(second.rc("alloc"), 2, "runs naming one ledger share its cap\n{second}");
    first.finish();
    assert!(shared.exists(), "a ledger named with --ledger is kept");
}

/// The children of `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default().split_whitespace().filter_map(|c| c.parse().ok()).collect()
}

#[test]
fn the_directory_of_a_run_killed_with_sigkill_is_swept_by_the_next_run_once_unused() {
    let env = Env::new("cli-run-sweep").context_overhead("100M");
    let mut killed = fgpu(&env).args(["run", "--limit", "1G", "--", &cuclient(), "init", "primary", "alloc", "100M", "hold"]).spawn();
    killed.wait_for("holding");
    let left = private_dirs_left(&env);
    assert_eq!(left.len(), 1);
    // While its fgpu run lives, another run leaves it alone.
    fgpu(&env).args(["run", "--limit", "1G", "--", "true"]).success();
    assert_eq!(private_dirs_left(&env), left, "a live run's directory is kept");
    // fgpu is killed with SIGKILL; its command goes on holding memory under the cap.
    let command = children(killed.pid());
    assert_eq!(command.len(), 1, "fgpu run's one child is the command");
    // (Not Background::kill: waiting would close the pipe the command holds on.)
    // SAFETY: signalling the fgpu process this test started.
    unsafe { libc::kill(killed.pid() as i32, libc::SIGKILL) };
    eventually("fgpu is dead", Duration::from_secs(10), || gone(killed.pid()));
    fgpu(&env).args(["run", "--limit", "1G", "--", "true"]).success();
    assert_eq!(private_dirs_left(&env), left, "the ledger is still used by the command: kept");
    // Once the command is gone too, the next run sweeps the directory.
    // SAFETY: signalling the command this test started (through fgpu run).
    unsafe { libc::kill(command[0] as i32, libc::SIGKILL) };
    eventually("the command is gone", Duration::from_secs(10), || gone(command[0]));
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "true"]).success();
    assert!(private_dirs_left(&env).is_empty(), "the stale directory is swept\n{run}");
    drop(killed);
}

/// Whether a process has exited (a zombie not yet reaped has: its files are closed).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true)
}

#[test]
fn run_passes_exit_status_and_signals_through() {
    let env = Env::new("cli-run-exit");
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "sh", "-c", "exit 7"]).run();
    assert_eq!(run.output.status.code(), Some(7), "{run}");
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "sh", "-c", "kill -TERM $$"]).run();
    assert_eq!(run.output.status.signal(), Some(libc::SIGTERM), "fgpu dies of the command's signal\n{run}");
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "sh", "-c", "kill -SEGV $$"]).run();
    assert_eq!(run.output.status.signal(), Some(libc::SIGSEGV), "{run}");
    assert!(!run.output.status.core_dumped(), "fgpu itself writes no core file\n{run}");
    let run = fgpu(&env).args(["run", "--limit", "1G", "--", "no-such-command-anywhere"]).run();
    assert_eq!(run.output.status.code(), Some(127), "{run}");
    assert!(run.stderr().contains("command not found"), "{run}");
    let not_executable = env.dir.join("data.txt");
    std::fs::write(&not_executable, "x").unwrap();
    let run = fgpu(&env).args(["run", "--limit", "1G", "--"]).arg(&not_executable).run();
    assert_eq!(run.output.status.code(), Some(126), "{run}");
    // Usage errors name the argument and run nothing.
    let run = fgpu(&env).args(["run", "--limit", "8XB", "--", "touch", "ran"]).run();
    assert_eq!(run.output.status.code(), Some(2), "{run}");
    assert!(run.stderr().contains("--limit") && run.stderr().contains("8XB"), "{run}");
    let run = fgpu(&env).args(["run", "--device", "GPU-zz=1G", "--", "touch", "ran"]).run();
    assert_eq!(run.output.status.code(), Some(2), "{run}");
    assert!(run.stderr().contains("--device") && run.stderr().contains("GPU-zz"), "{run}");
    // An option fgpu run does not know, before the command: a usage error naming it, never
    // the start of the command.
    for (args, named) in [
        (&["run", "--limit", "1G", "--devic", "GPU-7f=4G", "--", "touch", "ran"][..], "'--devic'"),
        (&["run", "--bogus", "--limit", "1G", "--", "touch", "ran"][..], "'--bogus'"),
    ] {
        let run = fgpu(&env).args(args).run();
        assert_eq!(run.output.status.code(), Some(2), "{run}");
        assert!(run.stderr().contains(named), "the message names {named}\n{run}");
        assert!(!run.stderr().contains("required"), "not a complaint about --limit\n{run}");
    }
    assert!(!env.dir.join("ran").exists());
    // The usage line: --limit or --device, not --limit required.
    let help = fgpu(&env).args(["run", "--help"]).success();
    assert!(help.stdout().contains("<--limit <LIMIT>|--device <UUID=SIZE>|--compute <SHARE>> <COMMAND>..."), "{help}");
    // A missing front (FGPU_SHIM names libfgpu.so) is fgpu's own failure: 125.
    let run = fgpu(&env).env("FGPU_SHIM", env.dir.join("nope.so")).args(["run", "--limit", "1G", "--", "true"]).run();
    assert_eq!(run.output.status.code(), Some(125), "{run}");
    assert!(run.stderr().contains("FGPU_SHIM="), "{run}");
}

#[test]
fn run_forwards_termination_signals_sent_to_it() {
    let env = Env::new("cli-run-forward");
    for (signal, name) in [(libc::SIGTERM, "TERM"), (libc::SIGHUP, "HUP"), (libc::SIGINT, "INT"), (libc::SIGQUIT, "QUIT")] {
        let script = format!("trap 'echo got {name}; exit 42' {name}; echo ready; while :; do sleep 0.05; done");
        let mut bg = fgpu(&env).args(["run", "--limit", "1G", "--", "sh", "-c", &script]).spawn();
        bg.wait_for("ready");
        // SAFETY: signalling the fgpu process this test started.
        unsafe { libc::kill(bg.pid() as i32, signal) };
        let line = bg.wait_for("got");
        assert_eq!(line, format!("got {name}"));
        let run = bg.finish();
        assert_eq!(run.output.status.code(), Some(42), "{name}: fgpu leaves with the command's status\n{run}");
    }
}

// A tmux server of our own, so tests never touch a user's sessions.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(name: &str) -> Option<Tmux> {
        if !prerequisite(tool("tmux"), "tmux is not installed (Debian package tmux)") {
            return None;
        }
        Some(Tmux { socket: format!("fgpu-test-{}-{name}", std::process::id()) })
    }

    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("run tmux")
    }

    fn start(&self, command: &str) {
        let out = self.cmd(&["new-session", "-d", "-s", "t", "-x", "120", "-y", "40", command]);
        assert!(out.status.success(), "tmux new-session failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
    }

    fn wait_screen(&self, what: &str, timeout: Duration) -> String {
        let mut last = String::new();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            last = self.screen();
            if last.contains(what) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the terminal never showed {what:?}; it shows:\n{last}");
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        self.cmd(&args);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.cmd(&["kill-server"]);
    }
}

/// `VAR=value ...` for a tmux command line, which does not inherit the test's environment.
fn env_prefix(env: &Env, extra: &[(&str, String)]) -> String {
    let mut vars = vec![
        ("LD_LIBRARY_PATH", sim_lib_dir().display().to_string()),
        ("FGPU_SIM_STATE", env.sim_state.display().to_string()),
        ("FGPU_SIM_CONTEXT_OVERHEAD", env.context_overhead.clone()),
        ("TMPDIR", env.dir.display().to_string()),
    ];
    vars.extend(extra.iter().cloned());
    let vars: Vec<String> = vars.iter().map(|(k, v)| format!("{k}='{v}'")).collect();
    format!("cd '{}' && env -u LD_PRELOAD -u FGPU_LIMIT -u XDG_RUNTIME_DIR {}", env.dir.display(), vars.join(" "))
}

#[test]
fn ctrl_c_stops_the_job_as_it_would_without_fgpu() {
    let Some(tmux) = Tmux::new("ctrlc") else { return };
    let env = Env::new("cli-run-ctrlc");
    // An interactive shell with job control, as a user at a terminal has.
    tmux.start("env PS1='$ ' sh -i");
    let run = |command: &str| {
        tmux.keys(&["-l", &format!("{} {} run --limit 1G -- {command}", env_prefix(&env, &[]), fgpu_bin().display())]);
        tmux.keys(&["Enter"]);
    };
    // The job counts SIGINTs: the terminal's Ctrl-C must reach it exactly once (fgpu must not
    // pass on a second copy), and fgpu must then leave with the job's status.
    let script = env.dir.join("count-int.sh");
    std::fs::write(&script, "n=0; trap 'n=$((n+1))' INT; echo READY; while [ $n -eq 0 ]; do sleep 0.05; done; sleep 0.5; echo COUNT=$n; exit $((100+n))\n")
        .unwrap();
    // (printf so the typed command line does not itself contain what we wait for)
    run(&format!("sh {}; printf 'JOB-%s=%s\\n' RC $?", script.display()));
    tmux.wait_screen("READY", Duration::from_secs(10));
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_screen("JOB-RC=", Duration::from_secs(10));
    assert!(screen.contains("COUNT=1"), "the job got Ctrl-C once:\n{screen}");
    assert!(screen.contains("JOB-RC=101"), "fgpu leaves with the job's status:\n{screen}");

    // A job that dies of Ctrl-C: fgpu dies of SIGINT too. The shell then stops the command
    // list (the `printf` after `;` never runs), as it does for a job killed by Ctrl-C
    // without fgpu, and reports 130.
    run("sh -c 'echo SLEEP\"\"ING; exec sleep 60'; printf 'NOT-%s\\n' REACHED");
    tmux.wait_screen("SLEEPING", Duration::from_secs(10));
    tmux.keys(&["C-c"]);
    tmux.wait_screen("SLEEPING\n^C\n$", Duration::from_secs(10));
    tmux.keys(&["-l", "printf 'SECOND-%s=%s\\n' RC $?"]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_screen("SECOND-RC=", Duration::from_secs(10));
    assert!(screen.contains("SECOND-RC=130"), "{screen}");
    assert!(!screen.contains("NOT-REACHED"), "{screen}");
}

// ------------------------------------------------------------------------------ fgpu status

fn processes_by_pid(ledger: &Value) -> std::collections::HashMap<u64, Value> {
    ledger["processes"].as_array().unwrap().iter().map(|p| (p["pid"].as_u64().unwrap(), p.clone())).collect()
}

/// The simulated driver's own figures for the live processes: (pid, bytes it holds for
/// them on device 0, their CUDA context memory there).
fn sim_processes(env: &Env) -> std::collections::HashMap<u32, (u64, u64)> {
    let sim = env.sim();
    sim.processes().into_iter().map(|p| (p.pid, (p.per_device_used[0], p.per_device_contexts[0] as u64 * sim.context_overhead()))).collect()
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

// ------------------------------------------------------------------------------ fgpu doctor

fn doctor(cmd: Cmd) -> (Run, Value) {
    let run = cmd.args(["doctor", "--json"]).run();
    let value = json(&run);
    let failed = value["findings"].as_array().unwrap().iter().any(|f| f["level"] == "fail");
    let unconfigured = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["check"] == "cap" && f["message"].as_str().unwrap_or("").starts_with("No cap is configured yet"));
    assert_eq!(run.output.status.code(), Some(if failed { 1 } else { 0 }), "exit status follows the findings\n{run}");
    assert_eq!(value["cap_applies"], !failed && !unconfigured, "{run}");
    (run, value)
}

/// The findings of one check at one level, as messages.
fn findings(value: &Value, check: &str, level: &str) -> Vec<String> {
    value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check && f["level"] == level)
        .map(|f| format!("{} | {}", f["message"].as_str().unwrap(), f["advice"].as_str().unwrap_or("")))
        .collect()
}

fn assert_finding(run: &Run, value: &Value, check: &str, level: &str, text: &str) {
    let found = findings(value, check, level);
    assert!(found.iter().any(|m| m.contains(text)), "expected a {level} {check} finding containing {text:?}\n{run}");
}

#[test]
fn doctor_passes_under_fgpu_run_and_says_why() {
    let env = Env::new("cli-doctor-ok");
    let (run, value) = doctor(fgpu(&env).args(["run", "--limit", "2G", "--"]).arg(fgpu_bin()));
    assert_eq!(value["cap_applies"], true, "{run}");
    assert_finding(&run, &value, "shim", "ok", "and the shim beside it load here");
    assert_finding(&run, &value, "preload", "ok", "through LD_PRELOAD");
    assert_finding(&run, &value, "cap", "ok", "from FGPU_LIMIT in the environment: 2 GiB on every GPU");
    assert_finding(&run, &value, "driver", "ok", "libcuda.so.1 loads, CUDA driver API 12.8, 1 GPU");
    assert_finding(&run, &value, "driver", "ok", "libnvidia-ml.so.1 loads, driver ");
    assert_finding(&run, &value, "cap", "info", "capped at 2 GiB");
    assert_finding(&run, &value, "ledger", "ok", "is not in use");
    assert_finding(&run, &value, "pidns", "info", "This is the host PID namespace");
    assert_finding(&run, &value, "interposer", "ok", "No other CUDA interposer");
    // A per-device limit that matches no visible GPU leaves it uncapped: a warning.
    let (run, value) = doctor(fgpu(&env).args(["run", "--device", "GPU-ffffffff=1G", "--"]).arg(fgpu_bin()));
    assert_finding(&run, &value, "cap", "warn", "is not capped: no entry of the limit matches its UUID");
    // The plain text says the same in sentences.
    let text = fgpu(&env).args(["run", "--limit", "2G", "--"]).arg(fgpu_bin()).arg("doctor").success();
    assert!(text.stdout().contains("A cap applies to GPU programs started here."), "{text}");
}

#[test]
fn doctor_reports_configuration_failures() {
    let env = Env::new("cli-doctor-config");
    let front = front_path();
    // No cap at all, as after `pip install`: nothing has failed (exit 0), nothing is capped,
    // and it says what to do next.
    let (run, value) = doctor(fgpu(&env));
    assert_eq!(run.output.status.code(), Some(0), "{run}");
    assert_eq!(value["cap_applies"], false, "{run}");
    assert_finding(&run, &value, "cap", "info", "No cap is configured yet");
    assert_finding(&run, &value, "cap", "info", "fgpu run --limit 8G -- COMMAND");
    assert_finding(&run, &value, "shim", "ok", "and the shim beside it load here");
    let text = fgpu(&env).arg("doctor").success();
    assert!(text.stdout().contains("fgpu works here, and no cap is configured yet"), "{text}");
    // An invalid cap: the configuration error, verbatim.
    let (run, value) = doctor(fgpu(&env).env("LD_PRELOAD", &front).env("FGPU_LIMIT", "lots"));
    assert_finding(&run, &value, "cap", "fail", r#"FGPU_LIMIT="lots" is not a valid limit"#);
    // A cap, but nothing preloaded to enforce it.
    let (run, value) = doctor(fgpu(&env).env("FGPU_LIMIT", "2G"));
    assert_finding(&run, &value, "cap", "fail", "not preloaded here");
    assert_finding(&run, &value, "preload", "warn", "not preloaded");
    // LD_PRELOAD naming a front that is not there.
    let (run, value) = doctor(fgpu(&env).env("FGPU_LIMIT", "2G").env("LD_PRELOAD", "/nonexistent/libfgpu.so"));
    assert_finding(&run, &value, "preload", "fail", "/nonexistent/libfgpu.so, which does not exist");
}

#[test]
fn doctor_reports_a_front_that_cannot_load() {
    let env = Env::new("cli-doctor-shim");
    let front_bytes = std::fs::read(front_path()).unwrap();
    // FGPU_SHIM names the front (libfgpu.so) the doctor checks.
    let capped = |front: &Path| fgpu(&env).env("FGPU_SHIM", front).env("LD_PRELOAD", front_path()).env("FGPU_LIMIT", "2G");

    let (run, value) = doctor(capped(&env.dir.join("missing/libfgpu.so")));
    assert_finding(&run, &value, "shim", "fail", "does not exist");

    let text = env.dir.join("text/libfgpu.so");
    std::fs::create_dir_all(text.parent().unwrap()).unwrap();
    std::fs::write(&text, "this is not a library\n").unwrap();
    let (run, value) = doctor(capped(&text));
    assert_finding(&run, &value, "shim", "fail", "not an ELF file");
    assert_finding(&run, &value, "cap", "fail", "fgpu's libraries cannot be loaded");

    // Built for another architecture: the same file with e_machine = AArch64.
    let arm = env.dir.join("arm/libfgpu.so");
    std::fs::create_dir_all(arm.parent().unwrap()).unwrap();
    let mut bytes = front_bytes.clone();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(&arm, &bytes).unwrap();
    let (run, value) = doctor(capped(&arm));
    assert_finding(&run, &value, "shim", "fail", "built for AArch64");

    // Needs a newer glibc than this system has: rename its GLIBC_2.x needs to GLIBC_9.x.
    let newer = env.dir.join("newer/libfgpu.so");
    std::fs::create_dir_all(newer.parent().unwrap()).unwrap();
    let mut bytes = front_bytes.clone();
    let needle = b"GLIBC_2.";
    let mut patched = 0;
    let mut i = 0;
    while i + needle.len() <= bytes.len() {
        if &bytes[i..i + needle.len()] == needle && i > 0 && bytes[i - 1] == 0 {
            bytes[i + 6] = b'9';
            patched += 1;
        }
        i += 1;
    }
    assert!(patched > 0);
    std::fs::write(&newer, &bytes).unwrap();
    let (run, value) = doctor(capped(&newer));
    assert_finding(&run, &value, "shim", "fail", "needs glibc 9.");

    // Fine by its headers, but a library it needs is missing: the trial load catches it.
    let src = env.dir.join("empty.c");
    std::fs::write(&src, "int fgpu_test_dep(void) { return 0; }\n").unwrap();
    let dep_dir = env.dir.join("dep");
    let broken = env.dir.join("broken/libfgpu.so");
    std::fs::create_dir_all(&dep_dir).unwrap();
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    let cc = |args: &[&str]| Cmd(Command::new("cc")).args(args).success();
    cc(&["-shared", "-fPIC", "-o", &dep_dir.join("libfgpudep.so").display().to_string(), &src.display().to_string()]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &broken.display().to_string(),
        &src.display().to_string(),
        "-Wl,--no-as-needed",
        &format!("-L{}", dep_dir.display()),
        "-lfgpudep",
    ]);
    std::fs::remove_file(dep_dir.join("libfgpudep.so")).unwrap();
    let (run, value) = doctor(capped(&broken));
    assert_finding(&run, &value, "shim", "fail", "libfgpudep.so");
}

#[test]
fn doctor_reports_a_broken_ledger_a_missing_driver_and_another_interposer() {
    let env = Env::new("cli-doctor-misc");
    let capped = || fgpu(&env).env("LD_PRELOAD", front_path()).env("FGPU_LIMIT", "2G");

    // A ledger that cannot be trusted: a link in place of the file.
    std::os::unix::fs::symlink(env.dir.join("elsewhere"), &env.ledger).unwrap();
    let (run, value) = doctor(capped());
    assert_finding(&run, &value, "ledger", "fail", "symbolic link");
    std::fs::remove_file(&env.ledger).unwrap();

    // No driver: a warning (no CUDA program runs at all), not a failure of the cap.
    let (run, value) = doctor(capped().env("LD_LIBRARY_PATH", env.dir.join("nothing-here")));
    assert_finding(&run, &value, "driver", "warn", "libcuda.so.1 cannot be loaded");
    assert_finding(&run, &value, "driver", "warn", "libnvidia-ml.so.1 cannot be loaded");

    // Another interposer (a stand-in for HAMi-core's libvgpu.so) preloaded beside fgpu.
    let src = env.dir.join("vgpu.c");
    std::fs::write(&src, "int cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 2; }\n").unwrap();
    let vgpu = env.dir.join("libvgpu.so");
    Cmd(Command::new("cc")).args(["-shared", "-fPIC", "-o"]).arg(&vgpu).arg(&src).success();
    let preload = format!("{}:{}", front_path().display(), vgpu.display());
    let (run, value) = doctor(capped().env("LD_PRELOAD", &preload));
    assert_finding(&run, &value, "interposer", "fail", "(HAMi-core)");

    // Not the host PID namespace.
    if prerequisite(is_root() && tool("unshare"), "the PID namespace part needs root and unshare(1)") {
        let inner = env
            .command("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--mount"])
            .arg(fgpu_bin())
            .args(["doctor", "--json"])
            .env("LD_PRELOAD", front_path())
            .env("FGPU_LIMIT", "2G")
            .run();
        let value = json(&inner);
        assert_finding(&inner, &value, "pidns", "info", "not the host PID namespace");
    }
}

#[test]
fn doctor_reads_the_config_file_and_ld_so_preload() {
    let env = Env::new("cli-doctor-etc");
    let fgpu_cmd = format!("TMPDIR={} {} doctor --json", env.dir.display(), fgpu_bin().display());
    let front = front_path().display().to_string();
    // The front preloaded for everything through /etc/ld.so.preload, the cap from the file.
    let file_ledger = env.dir.join("file-ledger");
    let Some(cmd) = env.with_private_etc(&format!(
        "mkdir -p /etc/fgpu; printf 'limit = 3G\\nledger = {}\\n' > /etc/fgpu/fgpu.conf; chmod 644 /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}",
        file_ledger.display()
    )) else {
        return;
    };
    let run = cmd.run();
    let value = json(&run);
    assert_eq!(value["cap_applies"], true, "{run}");
    assert_finding(&run, &value, "preload", "ok", "for every program on this system (through /etc/ld.so.preload)");
    assert_finding(&run, &value, "cap", "ok", "from /etc/fgpu/fgpu.conf: 3 GiB on every GPU");
    // The driver probe goes around the preloaded shim: it sees the GPU's own 80 GiB, not
    // the cap, and no ledger is created by the doctor's look.
    assert_finding(&run, &value, "cap", "info", "80 GiB): capped at 3 GiB");
    assert_finding(&run, &value, "ledger", "ok", "is not in use");
    assert!(!file_ledger.exists(), "the doctor created the ledger: its probe went through the shim\n{run}");

    // Both: the smaller applies, and the doctor says so.
    let cmd = env
        .with_private_etc(&format!("mkdir -p /etc/fgpu; echo 'limit = 3G' > /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; FGPU_LIMIT=1G {fgpu_cmd}"))
        .unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "cap", "ok", "on each GPU the smaller applies");
    assert_finding(&run, &value, "cap", "info", "capped at 1 GiB");

    // A bad line in the file: the configuration error verbatim.
    let cmd =
        env.with_private_etc(&format!("mkdir -p /etc/fgpu; echo 'limt = 3G' > /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}")).unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert_finding(&run, &value, "cap", "fail", "/etc/fgpu/fgpu.conf:1: \"limt = 3G\" is not a `key = value` line");

    // A file others may write: not trusted.
    let cmd = env
        .with_private_etc(&format!(
            "mkdir -p /etc/fgpu; echo 'limit = 3G' > /etc/fgpu/fgpu.conf; chmod 666 /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}"
        ))
        .unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "cap", "fail", "refusing to trust its cap");

    // Another interposer in /etc/ld.so.preload.
    let src = env.dir.join("vgpu.c");
    std::fs::write(&src, "int cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 2; }\n").unwrap();
    let vgpu = env.dir.join("libvgpu.so");
    Cmd(Command::new("cc")).args(["-shared", "-fPIC", "-o"]).arg(&vgpu).arg(&src).success();
    let cmd = env.with_private_etc(&format!("printf '{front}\\n{}\\n' > /etc/ld.so.preload; FGPU_LIMIT=1G {fgpu_cmd}", vgpu.display())).unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "interposer", "fail", "preloaded through /etc/ld.so.preload");
}

#[test]
fn doctor_reports_a_ledger_directory_it_cannot_write() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to run the doctor as another user") {
        return;
    }
    let env = Env::new("cli-doctor-perm");
    use std::os::unix::fs::PermissionsExt;
    let open = |dir: &Path| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // What user 65534 runs is copied where it can reach it: a root-owned clone (under /root,
    // mode 0700) would otherwise hide the binary, the shim and the simulated driver.
    open(&env.dir);
    let bin = env.dir.join("bin");
    let driver = env.dir.join("driver");
    for dir in [&bin, &driver] {
        std::fs::create_dir_all(dir).unwrap();
        open(dir);
    }
    let copy = |from: &Path, to: &Path| {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let fgpu = bin.join("fgpu");
    let front = bin.join("libfgpu.so");
    copy(&fgpu_bin(), &fgpu);
    copy(&front_path(), &front);
    copy(&shim_library_path(), &bin.join("libfgpu_shim.so"));
    copy(&release_dir().join("libfgpu_sim_cuda.so"), &driver.join("libcuda.so.1"));
    copy(&release_dir().join("libfgpu_sim_nvml.so"), &driver.join("libnvidia-ml.so.1"));
    let locked = env.dir.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    open(&locked);
    let run = env
        .command("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&fgpu)
        .args(["doctor", "--json"])
        .env("LD_LIBRARY_PATH", &driver)
        .env("FGPU_LEDGER", locked.join("sub/ledger"))
        .env("LD_PRELOAD", &front)
        .env("FGPU_LIMIT", "1G")
        .run();
    // Nothing printed is a failure (a doctor that crashed prints nothing), shown by json().
    let value = json(&run);
    assert_finding(&run, &value, "shim", "ok", &format!("The front {} and the shim beside it load here", front.display()));
    assert_finding(&run, &value, "ledger", "fail", "is not writable by this user");
}

// ------------------------------------------------------------------------------ fgpu exporter

/// The value of the sample `name{...}` whose labels contain all of `labels`.
fn sample(body: &str, name: &str, labels: &[(&str, String)]) -> Option<f64> {
    body.lines().filter(|l| l.starts_with(&format!("{name}{{"))).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        labels.iter().all(|(k, v)| series.contains(&format!("{k}=\"{v}\""))).then(|| value.parse().ok())?
    })
}

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

    if prerequisite(tool("promtool"), "promtool is not installed (Debian package prometheus)") {
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        check.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed:\n{}{}\n--- metrics ---\n{body}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

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

// ------------------------------------------------------------------------------ fgpu top

#[test]
fn top_renders_in_a_terminal_and_quits_on_q() {
    let Some(tmux) = Tmux::new("top") else { return };
    let env = Env::new("cli-top").context_overhead("100M");
    let mut holder = env.client(&["init", "primary", "alloc", "400M", "hold"]).shim().limit("2G").spawn();
    holder.wait_for("holding");
    let ledger = env.ledger.display().to_string();
    tmux.start(&format!("{} {} top --ledger {ledger}; echo TOP-EXITED rc=$?; sleep 60", env_prefix(&env, &[]), fgpu_bin().display()));
    let screen = tmux.wait_screen(&holder.pid().to_string(), Duration::from_secs(10));
    assert!(screen.contains("fgpu top"), "{screen}");
    assert!(screen.contains("of 2 GiB cap"), "{screen}");
    assert!(screen.contains("GPU 0"), "{screen}");
    assert!(screen.contains("cuclient"), "{screen}");
    // It refreshes: a second holder appears without a key press.
    let mut second = env.client(&["init", "primary", "alloc", "100M", "hold"]).shim().limit("2G").spawn();
    second.wait_for("holding");
    tmux.wait_screen(&second.pid().to_string(), Duration::from_secs(5));
    tmux.keys(&["q"]);
    let screen = tmux.wait_screen("TOP-EXITED rc=0", Duration::from_secs(5));
    assert!(!screen.contains("fgpu top"), "the alternate screen is left on exit:\n{screen}");
    holder.finish();
    second.finish();
}

#[test]
fn top_without_a_terminal_says_so() {
    let env = Env::new("cli-top-notty");
    let run = fgpu(&env).args(["top"]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert!(run.stderr().contains("needs a terminal"), "{run}");
}

// ------------------------------------------------------------------------------ conventions

#[test]
fn every_command_has_help_with_examples_and_completions_exist() {
    let env = Env::new("cli-help");
    for command in ["run", "status", "top", "doctor", "exporter", "completions"] {
        let run = fgpu(&env).args([command, "--help"]).success();
        assert!(run.stdout().contains("Examples:"), "{command} --help has examples\n{run}");
    }
    let run = fgpu(&env).arg("--help").success();
    assert!(run.stdout().contains("Examples:") && !run.stdout().contains("__driver-probe"), "{run}");
    for shell in ["bash", "zsh", "fish"] {
        let run = fgpu(&env).args(["completions", shell]).success();
        assert!(run.stdout().contains("exporter"), "{shell} completions\n{run}");
        assert!(!run.stdout().contains("__driver-probe"), "{shell} completions offer a hidden subcommand\n{run}");
    }
    if prerequisite(tool("bash"), "bash is not installed") {
        let script = env.dir.join("fgpu.bash");
        std::fs::write(&script, fgpu(&env).args(["completions", "bash"]).success().output.stdout).unwrap();
        Cmd(Command::new("bash")).arg("-n").arg(&script).success();
    }
    let run = fgpu(&env).args(["status", "--all", "--ledger", "x"]).run();
    assert_eq!(run.output.status.code(), Some(2), "{run}");
}

// ------------------------------------------------------------------------------ fgpu sim-env

/// A plain shell with nothing of the simulator set: `fgpu sim-env` alone makes the
/// simulated driver usable, for a C client and for `fgpu run`.
#[test]
fn sim_env_sets_up_the_simulated_driver_for_a_plain_shell() {
    let env = Env::new("cli-sim-env");
    let dir = env.dir.join("sim");
    let plain = |script: &str| {
        let mut sh = Command::new("sh");
        sh.args(["-c", script]).current_dir(&env.dir).env("TMPDIR", &env.dir);
        for var in [
            "LD_LIBRARY_PATH",
            "LD_PRELOAD",
            "FGPU_LIMIT",
            "FGPU_LEDGER",
            "FGPU_SIM_STATE",
            "FGPU_SIM_MEMORY",
            "FGPU_SIM_DEVICES",
            "FGPU_SIM_CONTEXT_OVERHEAD",
            "FGPU_SIM_DRIVER_VERSION",
            "FGPU_SHIM",
            "XDG_RUNTIME_DIR",
        ] {
            sh.env_remove(var);
        }
        Cmd(sh)
    };
    let fgpu_path = fgpu_bin().display().to_string();
    let script = format!(
        "eval \"$({f} sim-env {d} --devices 2 --memory 16G)\" || exit 9; C={c}; $C init device 1 primary info; {f} run --limit 4G -- $C init primary info",
        f = fgpu_path,
        d = dir.display(),
        c = cuclient()
    );
    let run = plain(&script).success();
    let totals: Vec<String> = run.lines("info").iter().map(|l| field(l, "total").unwrap()).collect();
    assert_eq!(totals, vec![(16 * GIB).to_string(), (4 * GIB).to_string()], "GPU 1 of two 16 GiB GPUs, then a 4 GiB cap\n{run}");
    for (name, built) in [("libcuda.so.1", "libfgpu_sim_cuda.so"), ("libcuda.so", "libfgpu_sim_cuda.so"), ("libnvidia-ml.so.1", "libfgpu_sim_nvml.so")] {
        let target = std::fs::read_link(dir.join("lib").join(name)).unwrap();
        assert_eq!(target, std::fs::canonicalize(release_dir().join(built)).unwrap(), "{name}");
    }
    assert!(dir.join("sim-state").exists(), "the state file is the one it exported");

    // --dry-run makes nothing, and what it prints makes the same layout.
    let other = env.dir.join("dry");
    let dry = Cmd(Command::new(fgpu_bin())).arg("sim-env").arg(&other).arg("--dry-run").success();
    assert!(!other.exists(), "{dry}");
    let run = plain(&format!("{} && {} init primary info", dry.stdout().trim_end().replace('\n', " && "), cuclient())).success();
    assert_eq!(run.field("info", "total"), (80 * GIB).to_string(), "{run}");
    assert!(std::fs::read_link(other.join("lib/libnvidia-ml.so.1")).is_ok());

    // Libraries that are not there: one line saying how to build them.
    let run = Cmd(Command::new(fgpu_bin())).arg("sim-env").arg(env.dir.join("x")).args(["--libs", "/nonexistent"]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert!(run.stderr().contains("/nonexistent/libfgpu_sim_cuda.so is missing") && run.stderr().contains("cargo build --release"), "{run}");
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
    if prerequisite(tool("promtool"), "promtool is not installed (Debian package prometheus)") {
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        check.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed:\n{}{}\n--- metrics ---\n{body}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
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

/// `fgpu run --gpus auto` on a machine with two 80 GiB GPUs: a 50 GiB job goes to GPU 0 (a
/// tie: the lower index), the next to GPU 1 (GPU 0 has 30 GiB left), a third is refused
/// with one line naming each GPU and what it has left, and one started with `--wait` goes
/// where the first was once that one ends. `fgpu status` shows what each GPU has committed.
/// The jobs run as a user of their own, whose ledgers are the only ones fgpu sees (other
/// tests' ledgers, on simulated GPUs with the same UUIDs, belong to other users).
#[test]
fn run_gpus_auto_puts_jobs_where_there_is_room() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to run the jobs as a user of their own") {
        return;
    }
    let env = Env::new("cli-gpus-auto").devices(2);
    env.client(&["init"]).success(); // the simulated GPUs, made by root for every user
    let user = 4262;
    let tmp = reachable().dir.join(format!("gpus-auto-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let fgpu_copy = reachable_fgpu();
    let client = reachable_client("cuclient");
    let as_user = |args: &[&str]| env.command_as(user, &fgpu_copy).args(args).env("TMPDIR", &tmp).env("FGPU_SHIM", &reachable().front);
    let job = |extra: &[&str]| {
        as_user(&["run", "--limit", "50G", "--gpus", "auto"]).args(extra).arg("--").arg(&client).args(["init", "primary", "alloc", "1G", "hold"])
    };
    // The GPU the simulated driver shows a process's memory on (the ground truth).
    let gpu_of = |pid: u32| {
        let sim = env.sim();
        eventually("the job's memory shows on a GPU", Duration::from_secs(10), || {
            sim.processes().iter().any(|p| p.pid == pid && p.per_device_used.iter().any(|u| *u >= GIB))
        });
        let p = sim.processes().into_iter().find(|p| p.pid == pid).unwrap();
        p.per_device_used.iter().position(|u| *u >= GIB).unwrap()
    };
    let child_of = |b: &Background| {
        let text = std::fs::read_to_string(format!("/proc/{}/task/{}/children", b.pid(), b.pid())).unwrap();
        text.split_whitespace().next().unwrap().parse::<u32>().unwrap()
    };
    let mut first = job(&[]).spawn();
    first.wait_for("holding");
    assert_eq!(gpu_of(child_of(&first)), 0, "a tie goes to the lower index");
    let mut second = job(&[]).spawn();
    second.wait_for("holding");
    assert_eq!(gpu_of(child_of(&second)), 1, "GPU 0 has 30 GiB left, GPU 1 80 GiB");
    let third = job(&[]).run();
    assert_eq!(third.output.status.code(), Some(125), "{third}");
    let line = third.stderr();
    assert!(line.contains("no GPU has room") && line.contains("GPU 0 (") && line.contains("GPU 1 (") && line.contains("needs 50 GiB"), "{third}");
    assert_eq!(line.lines().count(), 1, "one line\n{third}");
    let status = as_user(&["status", "--json"]).success();
    let value = json(&status);
    let gpus = value["gpus"].as_array().unwrap_or_else(|| panic!("{status}"));
    assert_eq!(gpus.len(), 2, "{status}");
    for g in gpus {
        assert_eq!(g["committed_bytes"], 50 * GIB, "{status}");
        assert!(g["left_bytes"].as_u64().unwrap() < 30 * GIB, "{status}");
    }
    // --wait: placed once the first job ends, and not before: until then `fgpu run` waits,
    // and its job has neither started (no child, nothing printed) nor touched a GPU.
    let mut waiting = job(&["--wait"]).spawn();
    std::thread::sleep(Duration::from_millis(1500));
    waiting.assert_running("fgpu run --wait, while no GPU has room");
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", waiting.pid())).unwrap_or_default();
    assert!(children.trim().is_empty(), "the waiting job started (fgpu run has children {children:?}) before the first ended");
    assert!(waiting.lines_so_far().is_empty(), "the waiting job printed {:?} before the first ended", waiting.lines_so_far());
    let on_gpus = env.sim().processes().into_iter().filter(|p| p.per_device_used.iter().any(|u| *u >= GIB)).count();
    assert_eq!(on_gpus, 2, "only the first two jobs hold memory on the GPUs while the third waits: {:?}", env.sim().processes());
    first.finish();
    waiting.wait_for("holding");
    assert_eq!(gpu_of(child_of(&waiting)), 0, "the room the first job left");
    waiting.finish();
    second.finish();
    let _ = std::fs::remove_dir_all(&tmp);
}
