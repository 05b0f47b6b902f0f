//! The rows of the table, scenario by scenario: each scenario's samples made into metrics
//! with their targets, margins and, where this machine cannot judge a row, the reason.

use crate::plan::*;
use crate::scenarios::{init, launches, multi, single, startup, threads};
use crate::setup::{Error, Setup};
use crate::statistics::{median, Kind, Metric, Samples};
use std::path::Path;

/// What a run measures, in the order the table shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Pair,
    Multi,
    Async,
    Startup,
    Init,
    Launches,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [Scenario::Pair, Scenario::Multi, Scenario::Async, Scenario::Startup, Scenario::Init, Scenario::Launches];
}

/// What the rows of one run were measured from and for.
pub struct Context<'a> {
    pub setup: &'a Setup,
    pub plan: &'static Plan,
    pub options: &'a Options,
    pub cpus: usize,
}

fn metric(key: &str, label: &str, unit: &'static str, samples: Samples, kind: Kind, target: &'static str) -> Metric {
    let margin = match kind {
        Kind::AddedAtMost(_) if unit == "us" => MARGIN_INIT_US,
        Kind::AddedAtMost(_) => MARGIN_ADDED_NS,
        Kind::RatioAtLeast(_) => MARGIN_THROUGHPUT_RATIO,
        Kind::RatioAtMost(_) => MARGIN_STARTUP_RATIO,
        Kind::AbWithin(_) | Kind::Info => 0.0,
    };
    Metric { key: key.to_string(), label: label.to_string(), unit, samples, kind, target, margin, not_judged: None, remeasured: false }
}

/// Per process (round), the program's pointer's cost per launch over the driver's own.
fn over_direct(s: &Samples) -> Vec<f64> {
    s.without.iter().zip(&s.with).map(|(direct, hooked)| hooked / direct).collect()
}

/// What the start-up scenario saw besides its rows.
pub struct StartupFacts {
    /// Whether none of the spawned processes created a file.
    pub quiet: bool,
    /// Each library's median minor page faults: (name, label, faults).
    pub faults: Vec<(String, String, f64)>,
}

/// The rows of `scenario`, measured with `cx.plan`, and the start-up facts when it is
/// the start-up scenario.
pub fn measure(cx: &Context, scenario: Scenario) -> Result<(Vec<Metric>, Option<StartupFacts>), Error> {
    let (setup, plan, options) = (cx.setup, cx.plan, cx.options);
    let mut facts = None;
    let rows = match scenario {
        Scenario::Pair => {
            let (single, single_wall, baseline) = single(setup, plan, options.pair_baseline.as_deref())?;
            let local_pair = single.with.clone();
            let mut rows = vec![metric("alloc_free_pair_ns", "alloc/free pair, 1 process", "ns", single, Kind::AddedAtMost(TARGET_PAIR_ADDED_NS), "<= +50 ns")];
            if let Some(baseline) = baseline {
                // A: the baseline build, B: this one, both per pair in CPU time, paired by round.
                let ab = Samples { without: baseline.with.clone(), with: local_pair };
                rows.push(metric("alloc_free_pair_baseline_ns", "  same, --pair-baseline build (info)", "ns", baseline, Kind::Info, "-"));
                rows.push(metric(
                    "alloc_free_pair_ab_ns",
                    "alloc/free pair, A/B: A --pair-baseline, B local",
                    "ns",
                    ab,
                    Kind::AbWithin(TARGET_AB_FLOOR_PCT),
                    AB_TARGET,
                ));
            }
            rows.push(metric("alloc_free_pair_wall_ns", "  same, wall clock (info)", "ns", single_wall, Kind::Info, "-"));
            rows
        }
        Scenario::Multi => {
            let measured = multi(setup, plan)?;
            let mut throughput = metric(
                "alloc_free_4proc_mpairs_per_s",
                "alloc/free, 4 processes",
                "Mpairs/s",
                measured.throughput,
                Kind::RatioAtLeast(TARGET_MULTI_RATIO),
                ">= 0.90x",
            );
            if cx.cpus < PROCESSES {
                throughput.not_judged = Some(format!(
                    "{PROCESSES} CPU-bound processes on {} CPUs: they take turns, so the ratio is the pair's own CPU cost against the simulated driver's (judged by the pair rows) plus the scheduler's noise, not what running at once costs",
                    cx.cpus
                ));
            }
            vec![
                throughput,
                metric(
                    "alloc_free_4proc_cpu_ns",
                    "  same, CPU per pair, 4 processes at once",
                    "ns",
                    measured.cpu_per_pair,
                    Kind::AddedAtMost(TARGET_PAIR_ADDED_NS),
                    "<= +50 ns",
                ),
            ]
        }
        Scenario::Async => {
            let many = threads(setup, plan, ASYNC_THREADS)?;
            let one = threads(setup, plan, 1)?;
            // What the row is for: with the shim the threads must not take turns. That shows
            // only where they do not take turns without it: the baseline must gain from the
            // threads, or a lock held across the allocation would read the same.
            let scaling = median(&many.without) / median(&one.without);
            let mut row = metric(
                "async_8threads_mpairs_per_s",
                "cuMemAllocAsync/FreeAsync, 8 threads x 8 streams",
                "Mpairs/s",
                many,
                Kind::RatioAtLeast(TARGET_ASYNC_RATIO),
                ">= 0.90x",
            );
            // (A scaling that is not a number, from no samples, is not judged either.)
            let scales = scaling.partial_cmp(&ASYNC_BASELINE_SCALING).is_some_and(|o| o.is_ge());
            if cx.cpus < 2 || !scales {
                row.not_judged = Some(format!(
                    "without the shim {ASYNC_THREADS} threads ran {scaling:.2}x what 1 thread ran (on {} CPUs; judged from {ASYNC_BASELINE_SCALING}x): the simulated driver makes them take turns, so the row cannot show whether the shim does; its ratio is the cost of the shim's pool queries per allocation, as the 1-thread row shows",
                    cx.cpus
                ));
            }
            vec![row, metric("async_1thread_mpairs_per_s", "  same, 1 thread (info)", "Mpairs/s", one, Kind::Info, "-")]
        }
        Scenario::Startup => {
            let start = startup(setup, options.spawns.unwrap_or(plan.startup_spawns))?;
            // Every library against the empty one, spawned in the same rounds.
            let against = |i: usize| Samples { without: start.times[1].clone(), with: start.times[i].clone() };
            let mut rows = vec![metric(
                "bin_true_local_us",
                "/bin/true start-up vs empty .so: local build",
                "us",
                against(2),
                Kind::RatioAtMost(TARGET_STARTUP_RATIO),
                "<= 1.05x",
            )];
            for (i, (name, label)) in start.names.iter().enumerate().skip(3) {
                let (kind, target, info) =
                    if setup.preloads[i - 3].checked { (Kind::RatioAtMost(TARGET_STARTUP_RATIO), "<= 1.05x", "") } else { (Kind::Info, "-", " (info)") };
                rows.push(metric(&format!("bin_true_{name}_us"), &format!("  {label}{info}"), "us", against(i), kind, target));
            }
            // The same rounds in the children's own CPU time: less noisy on a loaded machine.
            for (i, (name, label)) in start.names.iter().enumerate().skip(2) {
                let samples = Samples { without: start.cpu[1].clone(), with: start.cpu[i].clone() };
                rows.push(metric(&format!("bin_true_{name}_cpu_us"), &format!("  {label}, child CPU time (info)"), "us", samples, Kind::Info, "-"));
            }
            rows.push(metric(
                "bin_true_empty_preload_us",
                "  empty .so vs no preload (info)",
                "us",
                Samples { without: start.times[0].clone(), with: start.times[1].clone() },
                Kind::Info,
                "-",
            ));
            let faults = start.names.iter().zip(&start.faults).map(|((name, label), f)| (name.clone(), label.clone(), median(f))).collect();
            facts = Some(StartupFacts { quiet: start.quiet, faults });
            rows
        }
        Scenario::Init => {
            let init = init(setup, plan)?;
            vec![
                metric("first_call_us", "first-call initialisation", "us", init.first_us, Kind::AddedAtMost(TARGET_INIT_ADDED_US), "< 1 ms added"),
                metric("later_call_ns", "  same call, later (info)", "ns", init.later_ns, Kind::Info, "-"),
                metric("spawn_to_first_answer_us", "  spawn to first answer (info)", "us", init.ready_us, Kind::Info, "-"),
            ]
        }
        Scenario::Launches => launch_rows(setup, plan, options.launch_baseline.as_deref())?,
    };
    Ok((rows, facts))
}

fn launch_rows(setup: &Setup, plan: &'static Plan, baseline: Option<&Path>) -> Result<Vec<Metric>, Error> {
    let launched = launches(setup, plan, baseline)?;
    // With --launch-baseline: each side of the baseline build (A), and A against this
    // build (B). A process's launches cost more or less as a whole (its driver pointer
    // moves with them), so the A/B compares what the program's pointer costs over the
    // driver's own in the same process, paired by round.
    let mut baseline_rows = Vec::new();
    if let (Some(a_plain), Some(a_shared)) = (launched.baseline_plain, launched.baseline_shared) {
        let ab_plain = Samples { without: over_direct(&a_plain), with: over_direct(&launched.plain) };
        let ab_shared = Samples { without: over_direct(&a_shared), with: over_direct(&launched.shared) };
        baseline_rows = vec![
            metric("launch_no_share_baseline_ns", "  same, --launch-baseline build, no compute share (info)", "ns", a_plain, Kind::Info, "-"),
            metric("launch_under_share_baseline_ns", "  same, --launch-baseline build, under the share (info)", "ns", a_shared, Kind::Info, "-"),
            metric(
                "launch_no_share_ab",
                "kernel launch / driver's own, no share, A/B: A --launch-baseline, B local",
                "x",
                ab_plain,
                Kind::AbWithin(TARGET_AB_FLOOR_PCT),
                AB_TARGET,
            ),
            metric(
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
        metric("launch_no_share_ns", "kernel launch, no compute share", "ns", launched.plain, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
        metric("launch_under_share_ns", "kernel launch, under a 50% share", "ns", launched.shared, Kind::AddedAtMost(TARGET_LAUNCH_ADDED_NS), "<= +50 ns"),
    ];
    rows.extend(baseline_rows);
    rows.push(metric("launch_control_ns", "  same pair without the shim (info)", "ns", launched.control, Kind::Info, "-"));
    rows.push(metric("launch_processes_ns", "  whole processes, share vs no shim (info)", "ns", launched.processes, Kind::Info, "-"));
    Ok(rows)
}
