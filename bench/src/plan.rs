//! What a run measures and for how long (the full and quick plans), the command line's
//! other choices, and the fixed figures every scenario shares: the cap, the simulated GPU,
//! the sizes, and the design's targets.

use std::path::PathBuf;

/// The compute share the launch row runs under: far above what its 1 ns kernels use.
pub const SHARE: &str = "50%";

/// The cap the shim runs with, and the simulated GPU's memory: far apart, so a client can
/// tell from the total it sees whether the shim was in effect.
pub const LIMIT: &str = "8G";
pub const LIMIT_BYTES: u64 = 8 << 30;
pub const SIM_MEMORY: &str = "80G";
pub const SIM_MEMORY_BYTES: u64 = 80 << 30;
/// Bytes per allocation in the alloc/free loops.
pub const ALLOC_SIZE: u64 = 1 << 20;
pub const PROCESSES: usize = 4;
/// Threads (each with its own stream) in the stream-ordered row.
pub const ASYNC_THREADS: usize = 8;
/// How much more than one thread `ASYNC_THREADS` threads must allocate without the shim
/// for the stream-ordered row to be judged: below it the baseline itself makes the
/// threads take turns, and the row cannot show whether the shim does.
pub const ASYNC_BASELINE_SCALING: f64 = 1.5;

/// Targets from the design (issue 2, "Benchmark").
pub const TARGET_PAIR_ADDED_NS: f64 = 50.0;
pub const TARGET_MULTI_RATIO: f64 = 0.90;
pub const TARGET_ASYNC_RATIO: f64 = 0.90;
pub const TARGET_STARTUP_RATIO: f64 = 1.05;
pub const TARGET_INIT_ADDED_US: f64 = 1000.0;
/// Issue 15: "a launch costs at most +50 ns over no shim" (under the share, and without one).
pub const TARGET_LAUNCH_ADDED_NS: f64 = 50.0;
/// Margins: how far past its target a row may read before `--check` fails
/// (docs/benchmarks.md, "Verdicts", says why each is what it is).
/// Nanoseconds added per pair or per launch: fails past twice the target.
pub const MARGIN_ADDED_NS: f64 = 50.0;
/// Microseconds added to the first call: fails past 1.5 ms.
pub const MARGIN_INIT_US: f64 = 500.0;
/// Start-up against the empty preload: fails past 1.10x.
pub const MARGIN_STARTUP_RATIO: f64 = 0.05;
/// Throughput against no shim: fails under 0.80x.
pub const MARGIN_THROUGHPUT_RATIO: f64 = 0.10;
/// Issue 21's bar for an A/B against a baseline build: B's median at most A's plus the
/// larger of 3 % and A's spread (IQR/median).
pub const TARGET_AB_FLOOR_PCT: f64 = 3.0;
pub const AB_TARGET: &str = "B <= A + max(3%, A spread)";

pub struct Plan {
    pub name: &'static str,
    pub single_rounds: usize,
    pub single_ms: u64,
    pub multi_rounds: usize,
    pub multi_ms: u64,
    pub startup_spawns: usize,
    pub init_runs: usize,
    pub launch_rounds: usize,
    pub launch_warmup_ms: u64,
    pub launch_ms: u64,
}

pub const FULL: Plan = Plan {
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
pub const QUICK: Plan = Plan {
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

/// Command-line choices beyond the plan.
#[derive(Default)]
pub struct Options {
    /// The release build to compare in the start-up rows; default: what `dist/` holds.
    pub shipped: Option<PathBuf>,
    pub startup_only: bool,
    /// Only the kernel launch rows.
    pub launches_only: bool,
    pub spawns: Option<usize>,
    /// More libraries for the start-up rows, for comparisons: (name, file).
    pub extra: Vec<(String, PathBuf)>,
    /// Another shim timed in the same rounds as the alloc/free pair.
    pub pair_baseline: Option<PathBuf>,
    /// Another shim timed in the same rounds as the kernel launch rows.
    pub launch_baseline: Option<PathBuf>,
}
