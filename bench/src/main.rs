//! fgpu-bench: what the shim costs, measured against the same simulated driver without it,
//! in one run. See docs/benchmarks.md.
//!
//! Every figure is a median over runs that alternate baseline and shim (A B B A ...), so
//! noise on the machine hits both sides alike; every run gets its own simulated-driver
//! state file and ledger. Nothing here is a pass/fail test: the verdicts compare ratios
//! and differences taken in the same run against the targets of the design.

use plan::*;
use report::{loadavg, machine, utc_date, Report};
use scenarios::{init, launches, multi, single, startup, threads};
use setup::{Error, Setup};
use statistics::{median, Kind, Metric, Samples};
use std::path::{Path, PathBuf};
use std::time::Instant;

const USAGE: &str = "\
usage: fgpu-bench [--quick] [--json] [--release-dir DIR] [--shipped FILE]
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
mod scenarios;
mod setup;
mod statistics;

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
    match run(plan, &release_dir, &options) {
        Ok(report) => {
            if json_out {
                println!("{}", serde_json::to_string_pretty(&report.to_json()).expect("JSON"));
            } else {
                report.print();
            }
        }
        Err(e) => fail(&e),
    }
}

/// Per process (round), the program's pointer's cost per launch over the driver's own.
fn over_direct(s: &Samples) -> Vec<f64> {
    s.without.iter().zip(&s.with).map(|(direct, hooked)| hooked / direct).collect()
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

fn run(plan: &'static Plan, release_dir: &Path, options: &Options) -> Result<Report, Error> {
    let started = Instant::now();
    let load_before = loadavg();
    let setup = Setup::new(release_dir, options)?;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let metric = |key: &str, label: &str, unit: &'static str, samples: Samples, kind: Kind, target: &'static str| Metric {
        key: key.to_string(),
        label: label.to_string(),
        unit,
        samples,
        kind,
        target,
    };
    let mut launch_rows = Vec::new();
    if !options.startup_only {
        let launched = launches(&setup, plan, options.launch_baseline.as_deref())?;
        // With --launch-baseline: each side of the baseline build (A), and A against this
        // build (B). A process's launches cost more or less as a whole (its driver pointer
        // moves with them), so the A/B compares what the program's pointer costs over the
        // driver's own in the same process, paired by round.
        let mut baseline_rows = Vec::new();
        if let (Some(a_plain), Some(a_shared)) = (launched.baseline_plain, launched.baseline_shared) {
            let ab_plain = Samples { without: over_direct(&a_plain), with: over_direct(&launched.plain) };
            let ab_shared = Samples { without: over_direct(&a_shared), with: over_direct(&launched.shared) };
            baseline_rows = vec![
                ("launch_no_share_baseline_ns", "  same, --launch-baseline build, no compute share (info)", "ns", a_plain, Kind::Info, "-"),
                ("launch_under_share_baseline_ns", "  same, --launch-baseline build, under the share (info)", "ns", a_shared, Kind::Info, "-"),
                (
                    "launch_no_share_ab",
                    "kernel launch / driver's own, no share, A/B: A --launch-baseline, B local",
                    "x",
                    ab_plain,
                    Kind::AbWithin(TARGET_AB_FLOOR_PCT),
                    AB_TARGET,
                ),
                (
                    "launch_under_share_ab",
                    "kernel launch / driver's own, under the share, A/B: A --launch-baseline, B local",
                    "x",
                    ab_shared,
                    Kind::AbWithin(TARGET_AB_FLOOR_PCT),
                    AB_TARGET,
                ),
            ];
        }
        let mut rows = vec![
            ("launch_no_share_ns", "kernel launch, no compute share", "ns", launched.plain, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
            ("launch_under_share_ns", "kernel launch, under a 50% share", "ns", launched.shared, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
        ];
        rows.extend(baseline_rows);
        rows.extend([
            ("launch_control_ns", "  same pair without the shim (info)", "ns", launched.control, Kind::Info, "-"),
            ("launch_processes_ns", "  whole processes, share vs no shim (info)", "ns", launched.processes, Kind::Info, "-"),
        ]);
        for (key, label, unit, samples, kind, target) in rows {
            launch_rows.push(metric(key, label, unit, samples, kind, target));
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
        let local_pair = single.with.clone();
        metrics.push(metric("alloc_free_pair_ns", "alloc/free pair, 1 process", "ns", single, Kind::AddedAtMost(TARGET_PAIR_ADDED_NS), "<= +50 ns"));
        if let Some(baseline) = baseline {
            // A: the baseline build, B: this one, both per pair in CPU time, paired by round.
            let ab = Samples { without: baseline.with.clone(), with: local_pair };
            metrics.push(metric("alloc_free_pair_baseline_ns", "  same, --pair-baseline build (info)", "ns", baseline, Kind::Info, "-"));
            metrics.push(metric(
                "alloc_free_pair_ab_ns",
                "alloc/free pair, A/B: A --pair-baseline, B local",
                "ns",
                ab,
                Kind::AbWithin(TARGET_AB_FLOOR_PCT),
                AB_TARGET,
            ));
        }
        metrics.push(metric("alloc_free_pair_wall_ns", "  same, wall clock (info)", "ns", single_wall, Kind::Info, "-"));
        metrics.push(metric("alloc_free_4proc_mpairs_per_s", "alloc/free, 4 processes", "Mpairs/s", multi, Kind::RatioAtLeast(TARGET_MULTI_RATIO), ">= 0.90x"));
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
    let against = |i: usize| Samples { without: start.times[1].clone(), with: start.times[i].clone() };
    metrics.push(metric(
        "bin_true_local_us",
        "/bin/true start-up vs empty .so: local build",
        "us",
        against(2),
        Kind::RatioAtMost(TARGET_STARTUP_RATIO),
        "<= 1.05x",
    ));
    for (i, (name, label)) in start.names.iter().enumerate().skip(3) {
        let (kind, target, info) =
            if setup.preloads[i - 3].checked { (Kind::RatioAtMost(TARGET_STARTUP_RATIO), "<= 1.05x", "") } else { (Kind::Info, "-", " (info)") };
        metrics.push(metric(&format!("bin_true_{name}_us"), &format!("  {label}{info}"), "us", against(i), kind, target));
    }
    // The same rounds in the children's own CPU time: less noisy on a loaded machine.
    for (i, (name, label)) in start.names.iter().enumerate().skip(2) {
        let samples = Samples { without: start.cpu[1].clone(), with: start.cpu[i].clone() };
        metrics.push(metric(&format!("bin_true_{name}_cpu_us"), &format!("  {label}, child CPU time (info)"), "us", samples, Kind::Info, "-"));
    }
    metrics.push(metric(
        "bin_true_empty_preload_us",
        "  empty .so vs no preload (info)",
        "us",
        Samples { without: start.times[0].clone(), with: start.times[1].clone() },
        Kind::Info,
        "-",
    ));
    if !options.startup_only {
        let init = init(&setup, plan)?;
        metrics.push(metric("first_call_us", "first-call initialisation", "us", init.first_us, Kind::AddedAtMost(TARGET_INIT_ADDED_US), "< 1 ms added"));
        metrics.push(metric("later_call_ns", "  same call, later (info)", "ns", init.later_ns, Kind::Info, "-"));
        metrics.push(metric("spawn_to_first_answer_us", "  spawn to first answer (info)", "us", init.ready_us, Kind::Info, "-"));
    }
    metrics.extend(launch_rows);
    let startup_faults = start.names.iter().zip(&start.faults).map(|((name, label), f)| (name.clone(), label.clone(), median(f))).collect();
    Ok(Report {
        plan: if options.startup_only { "start-up only" } else { plan.name },
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
