//! fgpu-bench: what the shim costs, measured against the same simulated driver without it,
//! in one run. See docs/benchmarks.md.
//!
//! Every figure is a median over runs that alternate baseline and shim (A B B A ...), so
//! noise on the machine hits both sides alike; every run gets its own simulated-driver
//! state file and ledger. Nothing here is a pass/fail test: the verdicts compare ratios
//! and differences taken in the same run against the targets of the design.

use serde_json::{json, Value};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const USAGE: &str = "\
usage: fgpu-bench [--quick] [--json] [--release-dir DIR] [--shipped FILE]
                  [--startup-only] [--launches-only] [--spawns N] [--preload NAME=FILE]...

Measures libfgpu.so against the simulated driver, without and with the shim:
  alloc/free pair, 1 process   ns per cuMemAlloc+cuMemFree through cuGetProcAddress
  alloc/free, 4 processes      total pairs/s of 4 processes at once
  /bin/true start-up           wall time of a spawn with the local build, the shipped
                               build(s) and an empty library preloaded, in one run
  first-call initialisation    first cuDeviceTotalMem after cuInit (the shim builds its state)
  kernel launch                ns per cuLaunchKernel: without the shim, with it and no
                               compute share, with it and FGPU_COMPUTE=50% (under the share)

  --quick            fewer and shorter runs (a few seconds; proves it works)
  --json             one JSON document on stdout instead of the table
  --launches-only    only the kernel launch rows
  --release-dir DIR  where libfgpu.so and the simulated driver are
                     (default: the directory of this executable)
  --shipped FILE     the release build to compare in the start-up rows (default: every
                     libfgpu.so under DIR/../dist, from scripts/build-release.sh)
  --startup-only     only the start-up rows
  --spawns N         spawns of each library in the start-up rows (default 500, quick 100)
  --preload NAME=FILE  one more library for the start-up rows (repeatable)
  --pair-baseline FILE  another build of the shim (an earlier commit's libfgpu.so) timed in
                     the same rounds as the alloc/free pair: an A/B of the pair's cost

Build first: cargo build --release -p fgpu-bench -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml";

const ALLOC_PAIRS_C: &str = include_str!("../clients/alloc_pairs.c");
const ASYNC_THREADS_C: &str = include_str!("../clients/async_threads.c");
const FIRST_CALL_C: &str = include_str!("../clients/first_call.c");
const EMPTY_PRELOAD_C: &str = include_str!("../clients/empty_preload.c");
const LAUNCHES_C: &str = include_str!("../clients/launches.c");
/// The compute share the launch row runs under: far above what its 1 ns kernels use.
const SHARE: &str = "50%";

/// The cap the shim runs with, and the simulated GPU's memory: far apart, so a client can
/// tell from the total it sees whether the shim was in effect.
const LIMIT: &str = "8G";
const LIMIT_BYTES: u64 = 8 << 30;
const SIM_MEMORY: &str = "80G";
const SIM_MEMORY_BYTES: u64 = 80 << 30;
/// Bytes per allocation in the alloc/free loops.
const ALLOC_SIZE: u64 = 1 << 20;
const PROCESSES: usize = 4;
/// Threads (each with its own stream) in the stream-ordered row.
const ASYNC_THREADS: usize = 8;

/// Targets from the design (issue 2, "Benchmark").
const TARGET_PAIR_ADDED_NS: f64 = 50.0;
const TARGET_MULTI_RATIO: f64 = 0.90;
const TARGET_ASYNC_RATIO: f64 = 0.90;
const TARGET_STARTUP_RATIO: f64 = 1.05;
const TARGET_INIT_ADDED_US: f64 = 1000.0;
/// Issue 15: "a launch costs at most +50 ns over no shim" (under the share, and without one).
const TARGET_LAUNCH_ADDED_NS: f64 = 50.0;

struct Plan {
    name: &'static str,
    single_rounds: usize,
    single_ms: u64,
    multi_rounds: usize,
    multi_ms: u64,
    startup_spawns: usize,
    init_runs: usize,
    launch_rounds: usize,
    launch_warmup_ms: u64,
    launch_ms: u64,
}

const FULL: Plan = Plan {
    name: "full",
    single_rounds: 12,
    single_ms: 400,
    multi_rounds: 10,
    multi_ms: 600,
    startup_spawns: 500,
    init_runs: 60,
    launch_rounds: 8,
    launch_warmup_ms: 1500,
    launch_ms: 400,
};
const QUICK: Plan = Plan {
    name: "quick",
    single_rounds: 3,
    single_ms: 150,
    multi_rounds: 3,
    multi_ms: 200,
    startup_spawns: 100,
    init_runs: 15,
    launch_rounds: 2,
    launch_warmup_ms: 800,
    launch_ms: 150,
};

type Error = String;

/// Command-line choices beyond the plan.
#[derive(Default)]
struct Options {
    /// The release build to compare in the start-up rows; default: what `dist/` holds.
    shipped: Option<PathBuf>,
    startup_only: bool,
    /// Only the kernel launch rows.
    launches_only: bool,
    spawns: Option<usize>,
    /// More libraries for the start-up rows, for comparisons: (name, file).
    extra: Vec<(String, PathBuf)>,
    /// Another shim timed in the same rounds as the alloc/free pair.
    pair_baseline: Option<PathBuf>,
}

/// A library preloaded into `/bin/true` in the start-up rows.
struct Preload {
    /// Short name, used in the JSON keys and the labels.
    name: String,
    label: String,
    path: PathBuf,
    /// Held to the start-up target (the shipped builds), or shown for information.
    checked: bool,
}

fn main() {
    let mut quick = false;
    let mut json_out = false;
    let mut release_dir: Option<PathBuf> = None;
    let mut options = Options::default();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--quick") => quick = true,
            Some("--json") => json_out = true,
            Some("--release-dir") => match args.next() {
                Some(dir) => release_dir = Some(PathBuf::from(dir)),
                None => fail("--release-dir needs a directory"),
            },
            Some("--shipped") => match args.next() {
                Some(file) => options.shipped = Some(PathBuf::from(file)),
                None => fail("--shipped needs a file"),
            },
            Some("--startup-only") => options.startup_only = true,
            Some("--launches-only") => options.launches_only = true,
            Some("--spawns") => match args.next().and_then(|n| n.to_str()?.parse().ok()) {
                Some(n) if n > 0 => options.spawns = Some(n),
                _ => fail("--spawns needs a positive number"),
            },
            Some("--preload") => match args.next() {
                Some(spec) => match spec.to_str().and_then(|s| s.split_once('=')) {
                    Some((name, file)) if !name.is_empty() && !file.is_empty() => {
                        options.extra.push((name.to_string(), PathBuf::from(file)))
                    }
                    _ => fail(&format!("--preload wants NAME=FILE, got {spec:?}")),
                },
                None => fail("--preload needs NAME=FILE"),
            },
            Some("--pair-baseline") => match args.next() {
                Some(file) => options.pair_baseline = Some(PathBuf::from(file)),
                None => fail("--pair-baseline needs a file"),
            },
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return;
            }
            _ => fail(&format!("unknown argument {arg:?}\n{USAGE}")),
        }
    }
    let release_dir = release_dir.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("target/release"))
    });
    let plan = if quick { &QUICK } else { &FULL };
    match run(plan, &release_dir, &options) {
        Ok(report) => {
            if json_out {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report.to_json()).expect("JSON")
                );
            } else {
                report.print();
            }
        }
        Err(e) => fail(&e),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("fgpu-bench: {message}");
    std::process::exit(2);
}

// ---------------------------------------------------------------------------------------
// Set-up: the libraries, the clients, a private temp directory.

struct Setup {
    shim: PathBuf,
    sim_lib: PathBuf,
    alloc_pairs: PathBuf,
    async_threads: PathBuf,
    first_call: PathBuf,
    empty_preload: PathBuf,
    launches: PathBuf,
    /// The shipped build(s) and any `--preload` libraries, beside the local `shim`.
    preloads: Vec<Preload>,
    tmp: TempDir,
    runs: std::cell::Cell<u64>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Setup {
    fn new(release_dir: &Path, options: &Options) -> Result<Setup, Error> {
        let need = |name: &str| -> Result<PathBuf, Error> {
            let path = release_dir.join(name);
            if path.exists() {
                Ok(std::fs::canonicalize(&path).unwrap_or(path))
            } else {
                Err(format!(
                    "{} is missing; build first: cargo build --release -p fgpu-bench -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml",
                    path.display()
                ))
            }
        };
        let shim = need("libfgpu.so")?;
        let sim_cuda = need("libfgpu_sim_cuda.so")?;
        let sim_nvml = need("libfgpu_sim_nvml.so")?;

        let clients = release_dir.join("bench-clients");
        std::fs::create_dir_all(&clients).map_err(|e| format!("{}: {e}", clients.display()))?;
        let alloc_pairs = compile(&clients, "alloc_pairs", ALLOC_PAIRS_C, &["-ldl"])?;
        let async_threads = compile(&clients, "async_threads", ASYNC_THREADS_C, &["-ldl", "-lpthread"])?;
        let first_call = compile(&clients, "first_call", FIRST_CALL_C, &["-ldl"])?;
        let launches = compile(&clients, "launches", LAUNCHES_C, &["-ldl"])?;
        let empty_preload = compile(
            &clients,
            "libfgpu_bench_empty.so",
            EMPTY_PRELOAD_C,
            &["-shared", "-fPIC"],
        )?;

        let preloads = preloads(release_dir, options)?;

        let tmp = std::env::temp_dir().join(format!("fgpu-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let tmp = TempDir(tmp);
        let sim_lib = tmp.0.join("lib");
        std::fs::create_dir_all(&sim_lib).map_err(|e| e.to_string())?;
        for (target, soname) in [
            (&sim_cuda, "libcuda.so.1"),
            (&sim_nvml, "libnvidia-ml.so.1"),
        ] {
            std::os::unix::fs::symlink(target, sim_lib.join(soname))
                .map_err(|e| format!("symlink {soname}: {e}"))?;
        }
        Ok(Setup {
            shim,
            sim_lib,
            alloc_pairs,
            async_threads,
            first_call,
            empty_preload,
            launches,
            preloads,
            tmp,
            runs: std::cell::Cell::new(0),
        })
    }

    /// A fresh directory for one run: its own simulated-driver state and ledger.
    fn run_dir(&self) -> Result<PathBuf, Error> {
        let n = self.runs.get();
        self.runs.set(n + 1);
        let dir = self.tmp.0.join(format!("run-{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// A command with a clean environment: no preload or fgpu setting inherited from
    /// whoever runs the benchmark, the same variables on both sides but `LD_PRELOAD`.
    fn command(&self, program: &Path, run_dir: &Path, shim: bool) -> Command {
        self.command_preloading(program, run_dir, shim.then_some(self.shim.as_path()))
    }

    /// [`Setup::command`] with `preload` (any build of the shim) preloaded, or none.
    fn command_preloading(&self, program: &Path, run_dir: &Path, preload: Option<&Path>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear();
        for (key, value) in std::env::vars_os() {
            if keep_var(&key) {
                cmd.env(key, value);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &self.sim_lib)
            .env("FGPU_SIM_STATE", run_dir.join("sim-state"))
            .env("FGPU_SIM_MEMORY", SIM_MEMORY)
            .env("FGPU_SIM_CONTEXT_OVERHEAD", "300M")
            .env("FGPU_LIMIT", LIMIT)
            .env("FGPU_LEDGER", run_dir.join("ledger"));
        if let Some(library) = preload {
            cmd.env("LD_PRELOAD", library);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// The libraries compared with the local build in the start-up rows: the shipped build
/// (`--shipped`, or every `libfgpu.so` that scripts/build-release.sh left in `dist/` beside
/// the release directory: the glibc-2.17 build and the per-baseline ones), then `--preload`s.
fn preloads(release_dir: &Path, options: &Options) -> Result<Vec<Preload>, Error> {
    let mut out = Vec::new();
    let mut add = |name: String, label: String, path: &Path, checked: bool| -> Result<(), Error> {
        let path = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(Preload {
            name,
            label,
            path,
            checked,
        });
        Ok(())
    };
    match &options.shipped {
        Some(file) => add("shipped".into(), "shipped build".into(), file, true)?,
        None => {
            let dist = release_dir.join("../dist");
            if dist.join("libfgpu.so").is_file() {
                add(
                    "shipped".into(),
                    "shipped, glibc 2.17".into(),
                    &dist.join("libfgpu.so"),
                    true,
                )?;
            }
            let mut baselines: Vec<PathBuf> = std::fs::read_dir(&dist)
                .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
                .unwrap_or_default();
            baselines.sort();
            for dir in baselines {
                let Some(version) = dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix("glibc-"))
                else {
                    continue;
                };
                if dir.join("libfgpu.so").is_file() {
                    add(
                        format!("shipped_glibc_{}", version.replace('.', "_")),
                        format!("shipped, glibc {version}"),
                        &dir.join("libfgpu.so"),
                        true,
                    )?;
                }
            }
        }
    }
    // What the front saves: the shim itself preloaded, as before the front existed.
    let shim = release_dir.join("libfgpu_shim.so");
    if shim.is_file() {
        add(
            "shim_direct".into(),
            "libfgpu_shim.so preloaded itself".into(),
            &shim,
            false,
        )?;
    }
    for (name, file) in &options.extra {
        let key: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        add(key, name.clone(), file, false)?;
    }
    Ok(out)
}

fn keep_var(key: &OsString) -> bool {
    let key = key.to_string_lossy();
    !(key.starts_with("LD_") || key.starts_with("FGPU_") || key == "CUDA_VISIBLE_DEVICES")
}

/// Writes the embedded C source next to the build outputs and compiles it when it changed.
fn compile(dir: &Path, name: &str, source: &str, flags: &[&str]) -> Result<PathBuf, Error> {
    let src = dir.join(format!("{}.c", name.trim_end_matches(".so")));
    let bin = dir.join(name);
    let same = std::fs::read_to_string(&src)
        .map(|s| s == source)
        .unwrap_or(false);
    if same && bin.exists() {
        return Ok(bin);
    }
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    let partial = dir.join(format!(".{name}.{}", std::process::id()));
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&partial)
        .arg(&src)
        .args(flags)
        .output()
        .map_err(|e| format!("cannot run cc to build the benchmark clients: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&partial, &bin).map_err(|e| e.to_string())?;
    Ok(bin)
}

/// CLOCK_MONOTONIC in nanoseconds, the clock the C clients use.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// "key value key value ..." from a client's output line.
fn fields(line: &str) -> impl Fn(&str) -> Result<u64, Error> + '_ {
    move |key: &str| {
        let mut words = line.split_whitespace();
        while let Some(word) = words.next() {
            if word == key {
                return words
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("bad value for {key} in {line:?}"));
            }
        }
        Err(format!("no {key} in client output {line:?}"))
    }
}

fn finish(child: Child, what: &str) -> Result<String, Error> {
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The shim must have been in effect exactly when asked for, or the comparison is void.
fn check_total(total: u64, shim: bool, what: &str) -> Result<(), Error> {
    let want = if shim { LIMIT_BYTES } else { SIM_MEMORY_BYTES };
    if total != want {
        return Err(format!(
            "{what} {} the shim saw a device of {total} bytes, expected {want}: the shim was {}in effect",
            if shim { "with" } else { "without" },
            if shim { "not " } else { "" }
        ));
    }
    Ok(())
}

/// ABBA order: round 0 = baseline first, round 1 = shim first, ...
fn order(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

// ---------------------------------------------------------------------------------------
// The measurements.

/// Samples of one metric, without and with the shim.
#[derive(Default)]
struct Samples {
    without: Vec<f64>,
    with: Vec<f64>,
}

impl Samples {
    fn push(&mut self, shim: bool, v: f64) {
        if shim {
            self.with.push(v)
        } else {
            self.without.push(v)
        }
    }
}

/// One process, alloc/free pairs for `ms`: nanoseconds of the thread's CPU time per pair
/// (immune to being descheduled by other work), and wall-clock nanoseconds per pair.
/// The alloc/free pair, one process: CPU time and wall time per pair, without and with the
/// shim, and (`--pair-baseline`) with another build of the shim in the same rounds.
fn single(setup: &Setup, plan: &Plan, baseline: Option<&Path>) -> Result<(Samples, Samples, Option<Samples>), Error> {
    let mut s = Samples::default();
    let mut wall = Samples::default();
    let mut base = Samples::default();
    for round in 0..plan.single_rounds {
        let mut sides: Vec<Option<&Path>> = order(round).iter().map(|&shim| shim.then_some(setup.shim.as_path())).collect();
        if let Some(b) = baseline {
            sides.insert(round % 3, Some(b));
        }
        for preload in sides {
            let dir = setup.run_dir()?;
            let child = setup
                .command_preloading(&setup.alloc_pairs, &dir, preload)
                .args([ALLOC_SIZE.to_string(), plan.single_ms.to_string()])
                .spawn()
                .map_err(|e| format!("alloc_pairs: {e}"))?;
            let out = finish(child, "alloc_pairs")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, preload.is_some(), "alloc_pairs")?;
            let pairs = f("pairs")? as f64;
            let cpu = f("cpu_ns")? as f64 / pairs;
            if preload.is_some() && preload != Some(setup.shim.as_path()) {
                base.with.push(cpu);
            } else {
                if preload.is_none() {
                    base.without.push(cpu);
                }
                s.push(preload.is_some(), cpu);
                wall.push(preload.is_some(), (f("end_ns")? - f("start_ns")?) as f64 / pairs);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok((s, wall, baseline.map(|_| base)))
}

/// One process, `ASYNC_THREADS` threads each allocating and freeing from the device's pool
/// on a stream of its own: total pairs per second (millions). With the shim, no lock of the
/// process may be held across the driver's allocation, or the threads take turns.
fn threads(setup: &Setup, plan: &Plan) -> Result<Samples, Error> {
    let mut s = Samples::default();
    for round in 0..plan.multi_rounds {
        for shim in order(round) {
            let dir = setup.run_dir()?;
            let child = setup
                .command(&setup.async_threads, &dir, shim)
                .args([ASYNC_THREADS.to_string(), ALLOC_SIZE.to_string(), plan.multi_ms.to_string()])
                .spawn()
                .map_err(|e| format!("async_threads: {e}"))?;
            let out = finish(child, "async_threads")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, shim, "async_threads")?;
            s.push(shim, f("pairs")? as f64 * 1e3 / (f("end_ns")? - f("start_ns")?) as f64);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(s)
}

/// `PROCESSES` clients sharing one simulated GPU (and, with the shim, one ledger), started
/// together: total pairs per second over the wall-clock window.
fn multi(setup: &Setup, plan: &Plan) -> Result<Samples, Error> {
    let mut s = Samples::default();
    for round in 0..plan.multi_rounds {
        for shim in order(round) {
            let dir = setup.run_dir()?;
            let mut children = Vec::new();
            for _ in 0..PROCESSES {
                let mut cmd = setup.command(&setup.alloc_pairs, &dir, shim);
                cmd.args([
                    ALLOC_SIZE.to_string(),
                    plan.multi_ms.to_string(),
                    "sync".into(),
                ])
                .stdin(Stdio::piped());
                children.push(cmd.spawn().map_err(|e| format!("alloc_pairs: {e}"))?);
            }
            let mut readers = Vec::new();
            for child in children.iter_mut() {
                let mut reader = BufReader::new(child.stdout.take().expect("piped"));
                let mut line = String::new();
                reader.read_line(&mut line).map_err(|e| e.to_string())?;
                if line.trim() != "ready" {
                    let _ = child.kill();
                    let err = child.stderr.take().map(|mut e| {
                        let mut text = String::new();
                        let _ = std::io::Read::read_to_string(&mut e, &mut text);
                        text
                    });
                    return Err(format!(
                        "alloc_pairs (4 processes) did not get ready: {line}{}",
                        err.unwrap_or_default()
                    ));
                }
                readers.push(reader);
            }
            // Everyone sleeps until the same instant, then runs for the same time.
            let start = monotonic_ns() + 20_000_000;
            for child in children.iter_mut() {
                let mut stdin = child.stdin.take().expect("piped");
                writeln!(stdin, "{start}").map_err(|e| e.to_string())?;
            }
            let (mut pairs, mut end) = (0u64, start);
            for (mut child, mut reader) in children.into_iter().zip(readers) {
                let mut line = String::new();
                reader.read_line(&mut line).map_err(|e| e.to_string())?;
                let status = child.wait().map_err(|e| e.to_string())?;
                if !status.success() {
                    let mut text = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut text);
                    }
                    return Err(format!(
                        "alloc_pairs (4 processes) failed ({status}): {text}"
                    ));
                }
                let f = fields(line.trim());
                check_total(f("total_mem")?, shim, "alloc_pairs")?;
                pairs += f("pairs")?;
                end = end.max(f("end_ns")?);
            }
            // Millions of pairs per second.
            s.push(shim, pairs as f64 * 1e3 / (end - start) as f64);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(s)
}

/// `/bin/true` spawned and waited for: with no preload, with an empty library preloaded
/// (what any preload costs here), with the local build of the shim and with each shipped
/// build (and `FGPU_LIMIT` set, as in an image with the shim in /etc/ld.so.preload). Every
/// round runs each once, in an order that rotates and reverses from round to round, so
/// every library takes every position equally often. Microseconds per start-up and minor
/// page faults of each process; also whether any of them created the ledger or a file.
struct Startup {
    /// Index 0: no preload, 1: the empty library, 2: the local build, 3..: `Setup::preloads`.
    names: Vec<(String, String)>,
    times: Vec<Vec<f64>>,
    /// User + system CPU time of the child, microseconds: not inflated by waiting for a CPU.
    cpu: Vec<Vec<f64>>,
    faults: Vec<Vec<f64>>,
    quiet: bool,
}

/// The order of the variants in round `round` of `n`: rotations, then the same reversed.
fn rotation(round: usize, n: usize) -> Vec<usize> {
    let k = round % n;
    let mut order: Vec<usize> = (0..n).map(|i| (i + k) % n).collect();
    if (round / n) % 2 == 1 {
        order.reverse();
    }
    order
}

/// One spawn of `/bin/true`, as wait4(2) saw it.
struct Spawned {
    /// Wall-clock microseconds from before the spawn to after the wait.
    wall_us: f64,
    /// The child's user + system CPU time, microseconds.
    cpu_us: f64,
    minor_faults: f64,
}

/// Spawns the command and waits for it with wait4(2).
fn spawn_timed(cmd: &mut Command) -> Result<Spawned, Error> {
    let t = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("/bin/true: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4(2) on our own child, writing into locals we own. `child` is not
        // waited for again (dropping a std Child neither waits nor kills).
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4 /bin/true: {err}"));
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6;
    drop(child);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(format!("/bin/true failed: wait status {status:#x}"));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Ok(Spawned {
        wall_us: us,
        cpu_us: tv(usage.ru_utime) + tv(usage.ru_stime),
        minor_faults: usage.ru_minflt as f64,
    })
}

fn startup(setup: &Setup, spawns: usize) -> Result<Startup, Error> {
    let dir = setup.run_dir()?;
    let truth = Path::new("/bin/true");
    let mut names = vec![
        ("none".to_string(), "no preload".to_string()),
        ("empty".to_string(), "empty .so".to_string()),
        ("local".to_string(), "local build".to_string()),
    ];
    let mut libs: Vec<Option<&Path>> = vec![None, Some(&setup.empty_preload), Some(&setup.shim)];
    for p in &setup.preloads {
        names.push((p.name.clone(), p.label.clone()));
        libs.push(Some(&p.path));
    }
    let mut commands: Vec<Command> = libs
        .iter()
        .map(|lib| {
            let mut cmd = setup.command(truth, &dir, false);
            cmd.env_remove("LD_LIBRARY_PATH")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(lib) = lib {
                cmd.env("LD_PRELOAD", lib);
            }
            cmd
        })
        .collect();
    // Warm the page cache and the loader's paths on every side first.
    for cmd in commands.iter_mut() {
        for _ in 0..10 {
            spawn_timed(cmd)?;
        }
    }
    let n = commands.len();
    let mut times = vec![Vec::with_capacity(spawns); n];
    let mut cpu = vec![Vec::with_capacity(spawns); n];
    let mut faults = vec![Vec::with_capacity(spawns); n];
    for i in 0..spawns {
        for variant in rotation(i, n) {
            let spawned = spawn_timed(&mut commands[variant]).map_err(|e| {
                format!(
                    "{} ({}): {e}",
                    names[variant].1,
                    libs[variant]
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )
            })?;
            times[variant].push(spawned.wall_us);
            cpu[variant].push(spawned.cpu_us);
            faults[variant].push(spawned.minor_faults);
        }
    }
    let quiet = std::fs::read_dir(&dir)
        .map(|d| d.count() == 0)
        .unwrap_or(false);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Startup {
        names,
        times,
        cpu,
        faults,
        quiet,
    })
}

/// First-call cost: the first cuDeviceTotalMem after cuInit (where the shim reads its
/// configuration, creates the ledger, joins it and registers the device), and the time
/// from spawning the process to the end of that call.
struct Init {
    first_us: Samples,
    later_ns: Samples,
    ready_us: Samples,
}

fn init(setup: &Setup, plan: &Plan) -> Result<Init, Error> {
    let mut r = Init {
        first_us: Samples::default(),
        later_ns: Samples::default(),
        ready_us: Samples::default(),
    };
    for i in 0..plan.init_runs {
        for shim in order(i) {
            let dir = setup.run_dir()?;
            let mut cmd = setup.command(&setup.first_call, &dir, shim);
            let spawned = monotonic_ns();
            let child = cmd
                .arg(spawned.to_string())
                .spawn()
                .map_err(|e| format!("first_call: {e}"))?;
            let out = finish(child, "first_call")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, shim, "first_call")?;
            r.first_us.push(shim, f("first_ns")? as f64 / 1e3);
            r.later_ns.push(shim, f("later_ns")? as f64);
            r.ready_us.push(shim, f("ready_ns")? as f64 / 1e3);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// Statistics and the report.

/// What the launch rows measured.
struct Launches {
    /// In one process with the shim and no compute share: the driver's own cuLaunchKernel
    /// (without) against the one the program gets, the shim's (with).
    plain: Samples,
    /// The same with FGPU_COMPUTE=50%, far above what the 1 ns kernels use.
    shared: Samples,
    /// The same pair in a process without the shim (both pointers are the driver's): what
    /// the method reads when there is nothing to find.
    control: Samples,
    /// Whole processes: no shim (without) against the shim with a share (with), all
    /// launches of each.
    processes: Samples,
}

/// Kernel launches (`bench/clients/launches.c`): nanoseconds of the thread's CPU time per
/// launch. Three processes a round, their order rotating: no shim, the shim without a
/// compute share, the shim with one. Each alternates bursts of launches through the
/// driver's own cuLaunchKernel and through the program's (the shim's), so the shim's cost
/// is read inside one process, paired burst by burst. The side with a share runs with
/// `FGPU_LOG=debug`, whose one line at its first launch proves the limiter was in effect.
fn launches(setup: &Setup, plan: &Plan) -> Result<Launches, Error> {
    let mut out = Launches {
        plain: Samples::default(),
        shared: Samples::default(),
        control: Samples::default(),
        processes: Samples::default(),
    };
    for round in 0..plan.launch_rounds {
        let mut sides = [0usize, 1, 2];
        sides.rotate_left(round % 3);
        let mut whole = [0f64; 3];
        for side in sides {
            let dir = setup.run_dir()?;
            let mut cmd = setup.command(&setup.launches, &dir, side > 0);
            cmd.args([
                plan.launch_warmup_ms.to_string(),
                plan.launch_ms.to_string(),
            ]);
            if side == 2 {
                cmd.env("FGPU_COMPUTE", SHARE).env("FGPU_LOG", "debug");
            }
            let output = cmd.output().map_err(|e| format!("launches: {e}"))?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            if !output.status.success() {
                return Err(format!(
                    "launches failed ({}):\n{stdout}{stderr}",
                    output.status
                ));
            }
            if side == 2 && !stderr.contains(&format!("compute share {SHARE}")) {
                return Err(format!("launches with FGPU_COMPUTE={SHARE}: the limiter did not say it was in effect:\n{stderr}"));
            }
            let f = fields(stdout.trim());
            check_total(f("total_mem")?, side > 0, "launches")?;
            let n = f("launches")? as f64;
            let pair = match side {
                0 => &mut out.control,
                1 => &mut out.plain,
                _ => &mut out.shared,
            };
            pair.push(false, f("direct_cpu_ns")? as f64 / n);
            pair.push(true, f("hooked_cpu_ns")? as f64 / n);
            whole[side] = f("cpu_ns")? as f64 / (2.0 * n);
            let _ = std::fs::remove_dir_all(&dir);
        }
        out.processes.push(false, whole[0]);
        out.processes.push(true, whole[2]);
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Interquartile range relative to the median, in percent: how noisy a side was.
fn spread(v: &[f64]) -> f64 {
    100.0 * (quantile(v, 0.75) - quantile(v, 0.25)) / median(v)
}

enum Kind {
    /// Shim minus baseline must stay at or under the target.
    AddedAtMost(f64),
    /// Shim / baseline must be at least the target.
    RatioAtLeast(f64),
    /// Shim / baseline must be at most the target.
    RatioAtMost(f64),
    /// Shown for information.
    Info,
}

struct Metric {
    key: String,
    label: String,
    unit: &'static str,
    samples: Samples,
    kind: Kind,
    /// The target as the design states it.
    target: &'static str,
}

impl Metric {
    fn without(&self) -> f64 {
        median(&self.samples.without)
    }
    fn with(&self) -> f64 {
        median(&self.samples.with)
    }
    /// Median of the per-round ratios: each shim run against the baseline run next to it.
    fn ratio(&self) -> f64 {
        median(&self.ratios())
    }
    /// The per-round ratios (each shim run against the baseline run next to it).
    fn ratios(&self) -> Vec<f64> {
        self.samples
            .without
            .iter()
            .zip(&self.samples.with)
            .map(|(a, b)| b / a)
            .collect()
    }
    /// Median of the per-round differences, paired as for [`Metric::ratio`].
    fn added(&self) -> f64 {
        let d: Vec<f64> = self
            .samples
            .without
            .iter()
            .zip(&self.samples.with)
            .map(|(a, b)| b - a)
            .collect();
        median(&d)
    }
    fn meets(&self) -> Option<bool> {
        match self.kind {
            Kind::AddedAtMost(t) => Some(self.added() <= t),
            Kind::RatioAtLeast(t) => Some(self.ratio() >= t),
            Kind::RatioAtMost(t) => Some(self.ratio() <= t),
            Kind::Info => None,
        }
    }
    fn difference_text(&self) -> String {
        let ratio = self.ratio();
        match self.kind {
            Kind::RatioAtLeast(_) | Kind::RatioAtMost(_) => format!("{ratio:.3}x"),
            Kind::AddedAtMost(_) | Kind::Info => {
                let added = self.added();
                let sign = if added < 0.0 { "-" } else { "+" };
                let mut text = format!("{sign}{} {}", fmt_num(added.abs()), self.unit);
                if ratio < 100.0 {
                    text += &format!(" ({ratio:.2}x)");
                }
                text
            }
        }
    }
}

fn fmt_num(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

struct Report {
    plan: &'static str,
    date: String,
    machine: String,
    cpus: usize,
    metrics: Vec<Metric>,
    startup_quiet: bool,
    /// Median minor page faults of `/bin/true` under each preload: (name, label, faults).
    startup_faults: Vec<(String, String, f64)>,
    seconds: f64,
    /// One-minute load average before and after the run.
    load: (f64, f64),
}

fn run(plan: &'static Plan, release_dir: &Path, options: &Options) -> Result<Report, Error> {
    let started = Instant::now();
    let load_before = loadavg();
    let setup = Setup::new(release_dir, options)?;
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let metric = |key: &str,
                  label: &str,
                  unit: &'static str,
                  samples: Samples,
                  kind: Kind,
                  target: &'static str| Metric {
        key: key.to_string(),
        label: label.to_string(),
        unit,
        samples,
        kind,
        target,
    };
    let mut launch_rows = Vec::new();
    if !options.startup_only {
        let launched = launches(&setup, plan)?;
        let rows = [
            ("launch_no_share_ns", "kernel launch, no compute share", launched.plain, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
            ("launch_under_share_ns", "kernel launch, under a 50% share", launched.shared, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
            ("launch_control_ns", "  same pair without the shim (info)", launched.control, Kind::Info, "-"),
            ("launch_processes_ns", "  whole processes, share vs no shim (info)", launched.processes, Kind::Info, "-"),
        ];
        for (key, label, samples, kind, target) in rows {
            launch_rows.push(metric(key, label, "ns", samples, kind, target));
        }
    }
    if options.launches_only {
        return Ok(Report {
            plan: "kernel launches only",
            date: utc_date(),
            machine: machine(),
            cpus,
            metrics: launch_rows,
            startup_quiet: true,
            startup_faults: Vec::new(),
            seconds: started.elapsed().as_secs_f64(),
            load: (load_before, loadavg()),
        });
    }
    let mut metrics = Vec::new();
    if !options.startup_only {
        let (single, single_wall, baseline) = single(&setup, plan, options.pair_baseline.as_deref())?;
        let multi = multi(&setup, plan)?;
        metrics.push(metric(
            "alloc_free_pair_ns",
            "alloc/free pair, 1 process",
            "ns",
            single,
            Kind::AddedAtMost(TARGET_PAIR_ADDED_NS),
            "<= +50 ns",
        ));
        if let Some(baseline) = baseline {
            metrics.push(metric(
                "alloc_free_pair_baseline_ns",
                "  same, --pair-baseline build (info)",
                "ns",
                baseline,
                Kind::Info,
                "-",
            ));
        }
        metrics.push(metric(
            "alloc_free_pair_wall_ns",
            "  same, wall clock (info)",
            "ns",
            single_wall,
            Kind::Info,
            "-",
        ));
        metrics.push(metric(
            "alloc_free_4proc_mpairs_per_s",
            "alloc/free, 4 processes",
            "Mpairs/s",
            multi,
            Kind::RatioAtLeast(TARGET_MULTI_RATIO),
            ">= 0.90x",
        ));
        metrics.push(metric(
            "async_8threads_mpairs_per_s",
            "cuMemAllocAsync/FreeAsync, 8 threads x 8 streams",
            "Mpairs/s",
            threads(&setup, plan)?,
            Kind::RatioAtLeast(TARGET_ASYNC_RATIO),
            ">= 0.90x",
        ));
    }
    let start = startup(&setup, options.spawns.unwrap_or(plan.startup_spawns))?;
    // Every library against the empty one, spawned in the same rounds.
    let against = |i: usize| Samples {
        without: start.times[1].clone(),
        with: start.times[i].clone(),
    };
    metrics.push(metric(
        "bin_true_local_us",
        "/bin/true start-up vs empty .so: local build",
        "us",
        against(2),
        Kind::RatioAtMost(TARGET_STARTUP_RATIO),
        "<= 1.05x",
    ));
    for (i, (name, label)) in start.names.iter().enumerate().skip(3) {
        let (kind, target, info) = if setup.preloads[i - 3].checked {
            (Kind::RatioAtMost(TARGET_STARTUP_RATIO), "<= 1.05x", "")
        } else {
            (Kind::Info, "-", " (info)")
        };
        metrics.push(metric(
            &format!("bin_true_{name}_us"),
            &format!("  {label}{info}"),
            "us",
            against(i),
            kind,
            target,
        ));
    }
    // The same rounds in the children's own CPU time: less noisy on a loaded machine.
    for (i, (name, label)) in start.names.iter().enumerate().skip(2) {
        let samples = Samples {
            without: start.cpu[1].clone(),
            with: start.cpu[i].clone(),
        };
        metrics.push(metric(
            &format!("bin_true_{name}_cpu_us"),
            &format!("  {label}, child CPU time (info)"),
            "us",
            samples,
            Kind::Info,
            "-",
        ));
    }
    metrics.push(metric(
        "bin_true_empty_preload_us",
        "  empty .so vs no preload (info)",
        "us",
        Samples {
            without: start.times[0].clone(),
            with: start.times[1].clone(),
        },
        Kind::Info,
        "-",
    ));
    if !options.startup_only {
        let init = init(&setup, plan)?;
        metrics.push(metric(
            "first_call_us",
            "first-call initialisation",
            "us",
            init.first_us,
            Kind::AddedAtMost(TARGET_INIT_ADDED_US),
            "< 1 ms added",
        ));
        metrics.push(metric(
            "later_call_ns",
            "  same call, later (info)",
            "ns",
            init.later_ns,
            Kind::Info,
            "-",
        ));
        metrics.push(metric(
            "spawn_to_first_answer_us",
            "  spawn to first answer (info)",
            "us",
            init.ready_us,
            Kind::Info,
            "-",
        ));
    }
    metrics.extend(launch_rows);
    let startup_faults = start
        .names
        .iter()
        .zip(&start.faults)
        .map(|((name, label), f)| (name.clone(), label.clone(), median(f)))
        .collect();
    Ok(Report {
        plan: if options.startup_only {
            "start-up only"
        } else {
            plan.name
        },
        date: utc_date(),
        machine: machine(),
        cpus,
        metrics,
        startup_quiet: start.quiet,
        startup_faults,
        seconds: started.elapsed().as_secs_f64(),
        load: (load_before, loadavg()),
    })
}

impl Report {
    fn print(&self) {
        println!(
            "fgpu-bench ({} run, {}, {} CPUs: {})",
            self.plan, self.date, self.cpus, self.machine
        );
        println!(
            "simulated driver, cap {LIMIT} of {SIM_MEMORY}, {} MiB per allocation; medians of interleaved runs, difference/ratio = median over paired runs",
            ALLOC_SIZE >> 20
        );
        if self.load.0.max(self.load.1) >= 0.5 {
            println!(
                "note: load average {:.2} before, {:.2} after: other work was running and adds noise to both sides",
                self.load.0, self.load.1
            );
        }
        if self.cpus < PROCESSES
            && self
                .metrics
                .iter()
                .any(|m| m.key == "alloc_free_4proc_mpairs_per_s")
        {
            println!(
                "note: {PROCESSES} processes share {} CPUs in the 4-process figure",
                self.cpus
            );
        }
        println!();
        let header = [
            "metric",
            "without shim",
            "with shim",
            "difference",
            "target",
            "verdict",
        ];
        let rows: Vec<[String; 6]> = self
            .metrics
            .iter()
            .map(|m| {
                [
                    m.label.clone(),
                    format!("{} {}", fmt_num(m.without()), m.unit),
                    format!("{} {}", fmt_num(m.with()), m.unit),
                    m.difference_text(),
                    m.target.to_string(),
                    match m.meets() {
                        Some(true) => "meets".into(),
                        Some(false) => "misses".into(),
                        None => "".into(),
                    },
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &rows {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
                if i == 0 {
                    out += &format!("{cell:<w$}");
                } else {
                    out += &format!("  {cell:>w$}");
                }
            }
            println!("{}", out.trim_end());
        };
        line(&header.map(String::from));
        line(&width.map(|w| "-".repeat(w)));
        for row in &rows {
            line(row);
        }
        println!();
        let noise: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| !matches!(m.kind, Kind::Info))
            .map(|m| {
                format!(
                    "{} {:.1}%/{:.1}% (n={})",
                    m.key,
                    spread(&m.samples.without),
                    spread(&m.samples.with),
                    m.samples.with.len()
                )
            })
            .collect();
        println!("spread (IQR/median, without/with): {}", noise.join("; "));
        // How far the paired ratios themselves scatter: their quartiles.
        let ratios: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| matches!(m.kind, Kind::RatioAtMost(_) | Kind::RatioAtLeast(_)))
            .map(|m| {
                let r = m.ratios();
                format!(
                    "{} {:.3}x..{:.3}x",
                    m.key,
                    quantile(&r, 0.25),
                    quantile(&r, 0.75)
                )
            })
            .collect();
        if !ratios.is_empty() {
            println!("paired ratios, quartiles: {}", ratios.join("; "));
        }
        if self.startup_faults.is_empty() {
            // No start-up rows: nothing was spawned bare.
            println!("run took {:.1} s", self.seconds);
            return;
        }
        let faults: Vec<String> = self
            .startup_faults
            .iter()
            .map(|(_, label, f)| format!("{label} {f:.0}"))
            .collect();
        println!(
            "/bin/true minor page faults (median): {}",
            faults.join(", ")
        );
        println!(
            "/bin/true under the shim created {}; run took {:.1} s",
            if self.startup_quiet {
                "no file"
            } else {
                "a FILE (ledger or state): it should not"
            },
            self.seconds
        );
    }

    fn to_json(&self) -> Value {
        let metrics: Vec<Value> = self
            .metrics
            .iter()
            .map(|m| {
                json!({
                    "key": m.key,
                    "label": m.label.trim(),
                    "unit": m.unit,
                    "without": m.without(),
                    "with": m.with(),
                    "difference": m.added(),
                    "ratio": m.ratio(),
                    "target": m.target,
                    "meets": m.meets(),
                    "spread_pct": { "without": spread(&m.samples.without), "with": spread(&m.samples.with) },
                    "ratio_quartiles": [quantile(&m.ratios(), 0.25), quantile(&m.ratios(), 0.75)],
                    "samples": { "without": m.samples.without, "with": m.samples.with },
                })
            })
            .collect();
        json!({
            "plan": self.plan,
            "date": self.date,
            "machine": self.machine,
            "cpus": self.cpus,
            "limit": LIMIT,
            "sim_memory": SIM_MEMORY,
            "alloc_size": ALLOC_SIZE,
            "processes": PROCESSES,
            "metrics": metrics,
            "startup_created_no_file": self.startup_quiet,
            "startup_minor_faults": self.startup_faults.iter().map(|(name, _, f)| (name.clone(), json!(f))).collect::<serde_json::Map<String, Value>>(),
            "seconds": self.seconds,
            "load_average": { "before": self.load.0, "after": self.load.1 },
        })
    }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let virt = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.contains(" hypervisor"))
        .unwrap_or(false);
    if virt {
        format!("{model}, virtual machine")
    } else {
        model
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the civil-from-days algorithm.
fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!("{year:04}-{month:02}-{day:02}")
}
