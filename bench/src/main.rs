//! fgpu-bench: what the shim costs, measured against the same simulated driver without it,
//! in one run. See docs/benchmarks.md.
//!
//! Every figure is a median over runs that alternate baseline and shim (A B B A ...), so
//! noise on the machine hits both sides alike; every run gets its own simulated-driver
//! state file and ledger. The verdicts compare ratios and differences taken in the same run
//! against the targets of the design; with `--check` a target missed beyond its margin
//! makes the exit status 1 (docs/benchmarks.md, "Verdicts").

use plan::*;
use report::{loadavg, machine, utc_date, Report};
use rows::{measure, Context, Scenario};
use setup::{Error, Setup};
use statistics::{Metric, Verdict};
use std::path::{Path, PathBuf};
use std::time::Instant;

const USAGE: &str = "\
usage: fgpu-bench [--quick] [--json] [--check] [--release-dir DIR] [--shipped FILE]
                  [--startup-only] [--launches-only] [--spawns N] [--preload NAME=FILE]...
                  [--pair-baseline FILE] [--launch-baseline FILE]

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
  --check            exit 1 when a target is missed beyond its margin (after measuring
                     such a row again with the full plan, when the run was --quick)
  --launches-only    only the kernel launch rows
  --release-dir DIR  where libfgpu.so and the simulated driver are
                     (default: the directory of this executable)
  --shipped FILE     the release build to compare in the start-up rows (default: every
                     libfgpu.so under DIR/../dist, from scripts/build-release.sh)
  --startup-only     only the start-up rows
  --spawns N         spawns of each library in the start-up rows (default 500, quick 100)
  --preload NAME=FILE  one more library for the start-up rows (repeatable)
  --pair-baseline FILE  another build of fgpu (an earlier commit's front, libfgpu.so, with
                     its libfgpu_shim.so beside it) timed in the same rounds as the
                     alloc/free pair: an A/B of the pair's cost
  --launch-baseline FILE  the same for the kernel launch rows: FILE's processes, without
                     and with the share, run in the same rounds as this build's

Build first: cargo build --release -p fgpu-bench -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml";

mod plan;
mod report;
mod rows;
mod scenarios;
mod setup;
mod statistics;

fn main() {
    let mut quick = false;
    let mut json_out = false;
    let mut check = false;
    let mut release_dir: Option<PathBuf> = None;
    let mut options = Options::default();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--quick") => quick = true,
            Some("--json") => json_out = true,
            Some("--check") => check = true,
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
                    Some((name, file)) if !name.is_empty() && !file.is_empty() => options.extra.push((name.to_string(), PathBuf::from(file))),
                    _ => fail(&format!("--preload wants NAME=FILE, got {spec:?}")),
                },
                None => fail("--preload needs NAME=FILE"),
            },
            Some("--pair-baseline") => match args.next() {
                Some(file) => options.pair_baseline = Some(baseline_file("--pair-baseline", file)),
                None => fail("--pair-baseline needs a file"),
            },
            Some("--launch-baseline") => match args.next() {
                Some(file) => options.launch_baseline = Some(baseline_file("--launch-baseline", file)),
                None => fail("--launch-baseline needs a file"),
            },
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return;
            }
            _ => fail(&format!("unknown argument {arg:?}\n{USAGE}")),
        }
    }
    let release_dir = release_dir
        .unwrap_or_else(|| std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_else(|| PathBuf::from("target/release")));
    let plan = if quick { &QUICK } else { &FULL };
    match run(plan, &release_dir, &options, check) {
        Ok(report) => {
            if json_out {
                println!("{}", serde_json::to_string_pretty(&report.to_json()).expect("JSON"));
            } else {
                report.print();
            }
            let failed = report.failed();
            if check && !failed.is_empty() {
                eprintln!("fgpu-bench: missed beyond its margin: {}", failed.join(", "));
                std::process::exit(1);
            }
        }
        Err(e) => fail(&e),
    }
}

/// A baseline build named on the command line: it must be there (a missing file would be
/// ignored by the dynamic loader, and the run would stop later with a less clear message).
fn baseline_file(option: &str, file: std::ffi::OsString) -> PathBuf {
    let path = PathBuf::from(file);
    match std::fs::canonicalize(&path) {
        Ok(p) if p.is_file() => p,
        Ok(_) => fail(&format!("{option} {}: not a file", path.display())),
        Err(e) => fail(&format!("{option} {}: {e}", path.display())),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("fgpu-bench: {message}");
    std::process::exit(2);
}

fn run(plan: &'static Plan, release_dir: &Path, options: &Options, check: bool) -> Result<Report, Error> {
    let started = Instant::now();
    let load_before = loadavg();
    let setup = Setup::new(release_dir, options)?;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| match s {
            Scenario::Launches => !options.startup_only,
            Scenario::Startup => !options.launches_only,
            _ => !options.startup_only && !options.launches_only,
        })
        .collect();
    let cx = Context { setup: &setup, plan, options, cpus };
    // The launches first (as before the rows were split by scenario): shown last.
    let mut measured = Vec::new();
    let mut startup_facts = None;
    for scenario in scenarios.iter().rev() {
        let (rows, facts) = measure(&cx, *scenario)?;
        startup_facts = startup_facts.or(facts);
        measured.push((*scenario, rows));
    }
    measured.reverse();
    // A quick run is short and noisy: a row it reads past its margin is measured again with
    // the full plan before it fails the check, and that measurement is the row's verdict.
    if check && !std::ptr::eq(plan, &FULL) {
        let full = Context { plan: &FULL, ..cx };
        for (scenario, rows) in measured.iter_mut() {
            if rows.iter().any(|m| m.verdict() == Verdict::Fails) {
                eprintln!("fgpu-bench: {scenario:?} read past its margin in the {} run; measuring it again with the full plan", plan.name);
                let (again, _) = measure(&full, *scenario)?;
                *rows = again
                    .into_iter()
                    .map(|mut m| {
                        m.remeasured = true;
                        m
                    })
                    .collect();
            }
        }
    }
    let metrics: Vec<Metric> = measured.into_iter().flat_map(|(_, rows)| rows).collect();
    let (startup_quiet, startup_faults) = startup_facts.map(|f| (f.quiet, f.faults)).unwrap_or((true, Vec::new()));
    Ok(Report {
        plan: if options.startup_only {
            "start-up only"
        } else if options.launches_only {
            "kernel launches only"
        } else {
            plan.name
        },
        date: utc_date(),
        machine: machine(),
        cpus,
        metrics,
        startup_quiet,
        startup_faults,
        seconds: started.elapsed().as_secs_f64(),
        load: (load_before, loadavg()),
    })
}
