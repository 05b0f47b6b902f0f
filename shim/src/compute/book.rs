//! Per device, what the limiter has learnt: the estimated cost of a launch of each kind,
//! scaled by what NVML measured for the chunks it refunded, and how NVML measures this
//! process there (its per-process samples, `fgpu_core::compute::UtilisationBook`), if it
//! does.

use fgpu_core::compute::{CostEstimate, UtilisationBook};

/// What a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Unit {
    /// One kernel (`cuLaunchKernel` and its kin).
    Kernel = 0,
    /// A whole graph (`cuGraphLaunch`): its cost is estimated apart from single kernels.
    Graph = 1,
}

/// Per device: the cost estimates and the measurement by NVML (`sampler.rs`).
pub struct DevBook {
    est: [CostEstimate; 2],
    pub nvml: Option<NvmlState>,
    /// NVML cannot measure this device for this process: events do.
    pub by_events: bool,
    /// What NVML measured per unit of estimate, lately (see [`DevBook::calibrate`]).
    calibration: f64,
    /// NVML's figures and the estimates refunded since the calibration last moved.
    pub measured_since: i64,
    refunded_since: u64,
}

impl Default for DevBook {
    fn default() -> Self {
        DevBook { est: Default::default(), nvml: None, by_events: false, calibration: 1.0, measured_since: 0, refunded_since: 0 }
    }
}

/// Estimates refunded before the calibration moves (so one chunk at the edge of an NVML
/// period does not swing it).
const CALIBRATE_AFTER_NS: u64 = 20_000_000;

impl DevBook {
    /// The time between a chunk's markers includes other contexts' time slices, so on a
    /// shared GPU the estimates read high. Where NVML measures, the estimate is scaled by
    /// what NVML measured for the chunks it refunded, so that what is charged in advance
    /// is close to what will be measured (a large gap between the two only delays, but
    /// it would make the admission come in bursts).
    ///
    /// The refunded estimates were already scaled by the calibration, so their ratio to
    /// NVML's figure is what is left to correct: the calibration is multiplied by it
    /// (smoothed), and settles where the two agree.
    ///
    /// Each step weighs the residual by 0.3 per 1/6 s of NVML's sample period, so the
    /// calibration settles in about the same time whatever the product's period, but by at
    /// most 0.51 (two such steps): with periods of a second, the chunks one answer refunds
    /// were admitted under the calibration of the step before, so a larger step overshoots
    /// and the calibration swings from one answer to the next (0.55 to 0.85 and back, with
    /// completions known 10-20 ms late; a 70 % container got 53-57 %).
    pub fn calibrate(&mut self) {
        if self.refunded_since < CALIBRATE_AFTER_NS {
            return;
        }
        let residual = (self.measured_since.max(0) as f64 / self.refunded_since as f64).clamp(0.05, 4.0);
        let periods = self.nvml.as_ref().map_or(1.0, |n| n.period_us() as f64 / fgpu_core::compute::MIN_PERIOD_US as f64);
        let weight = 1.0 - 0.7f64.powf(periods.clamp(1.0, 2.0));
        self.calibration = (self.calibration * (1.0 - weight + weight * residual)).clamp(0.05, 4.0);
        (self.measured_since, self.refunded_since) = (0, 0);
    }

    /// The estimated GPU time of one launch of `unit`, 0 while unknown.
    pub fn estimate(&self, unit: Unit) -> u64 {
        (self.est[unit as usize].get() as f64 * self.calibration) as u64
    }

    /// A chunk of `launches` of `unit` took `busy` ns between its markers.
    pub fn measured(&mut self, unit: Unit, busy: u64, launches: u32) {
        self.est[unit as usize].add(busy, launches);
    }

    /// A chunk's estimate was refunded (NVML measured it instead).
    pub fn refunded(&mut self, provisional: u64) {
        self.refunded_since += provisional;
    }
}

/// What NVML measures of this process on one device.
pub struct NvmlState {
    pub handle: usize,
    pub book: UtilisationBook,
    pub host_pid: u32,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC at the last question (NVML stamps samples in CPU
    /// time; the limiter's clock is CLOCK_MONOTONIC).
    pub offset_ns: i64,
    /// When to ask next (CLOCK_MONOTONIC ns).
    pub next_poll: u64,
    /// When NVML was first asked (CLOCK_MONOTONIC ns).
    pub since: u64,
}

impl NvmlState {
    /// NVML's sample period as learned so far (µs).
    pub fn period_us(&self) -> u64 {
        self.book.period_us()
    }

    /// CLOCK_MONOTONIC time up to which NVML has answered for this process.
    pub fn covered_mono(&self) -> Option<u64> {
        let covered = self.book.covered_us() as i64 * 1000 - self.offset_ns;
        u64::try_from(covered).ok()
    }
}

pub fn realtime_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}
