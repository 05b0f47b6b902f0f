//! `fgpu run`: caps shared by a job's processes, independent runs, its private ledger
//! directory, exit status and signals (Ctrl-C in tmux), and `--gpus auto`.

use super::*;

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
    // The usage line: --limit, --device, --compute or --mig, not --limit required.
    let help = fgpu(&env).args(["run", "--help"]).success();
    assert!(help.stdout().contains("<--limit <LIMIT>|--device <UUID=SIZE>|--compute <SHARE>|--mig <PROFILE>> <COMMAND>..."), "{help}");
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
