//! The `fgpu` command against the simulated driver and real capped processes: `run`
//! (caps, independence, exit status, signals), `status` (JSON against the ledger, dead
//! processes, `--all` across mount and PID namespaces), `doctor` (every failure it claims
//! to detect, caused), `exporter` (promtool, numbers against the simulated driver's) and
//! `top` (tmux). What `status` and the exporter show is compared with the simulated driver's
//! own figures (`fgpu_sim_state`), never with the ledger they read.

mod doctor;
mod exporter;
mod run;
mod status;
mod top;

use fgpu_tests::*;
use serde_json::Value;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub(super) fn fgpu(env: &Env) -> Cmd {
    // `fgpu run` puts its private ledger directory under TMPDIR: keep it in the test's dir.
    let mut cmd = env.command(fgpu_bin());
    cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
    cmd
}

pub(super) fn cuclient() -> String {
    client("cuclient").display().to_string()
}

pub(super) fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{run}"))
}

pub(super) fn private_dirs_left(env: &Env) -> Vec<String> {
    std::fs::read_dir(&env.dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("fgpu-run-")).collect()
}

/// `promtool check metrics` accepts `body` (where promtool is installed; counted as a skip
/// where not).
pub(super) fn promtool_accepts(body: &str) {
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
}

/// The simulated driver's own figures for the live processes: (pid, bytes it holds for
/// them on device 0, their CUDA context memory there).
pub(super) fn sim_processes(env: &Env) -> std::collections::HashMap<u32, (u64, u64)> {
    let sim = env.sim();
    sim.processes().into_iter().map(|p| (p.pid, (p.per_device_used[0], p.per_device_contexts[0] as u64 * sim.context_overhead()))).collect()
}

/// The value of the sample `name{...}` whose labels contain all of `labels`.
pub(super) fn sample(body: &str, name: &str, labels: &[(&str, String)]) -> Option<f64> {
    body.lines().filter(|l| l.starts_with(&format!("{name}{{"))).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        labels.iter().all(|(k, v)| series.contains(&format!("{k}=\"{v}\""))).then(|| value.parse().ok())?
    })
}

// A tmux server of our own, so tests never touch a user's sessions.
pub(super) struct Tmux {
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
pub(super) fn env_prefix(env: &Env, extra: &[(&str, String)]) -> String {
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
