//! NVML's per-process utilisation samples (`nvmlDeviceGetProcessUtilization`) as GPU time.
//!
//! **What a sample covers.** nvml.h: the call returns "one utilization sample structure
//! ... per process running, that had some non-zero utilization", and `lastSeenTimeStamp`
//! is the timestamp "at which utilization samples were last read ... Set lastSeenTimeStamp
//! to a timeStamp retrieved from a previous query to read utilization since the previous
//! query" (0: "based on all the samples maintained by the driver's internal sample
//! buffer"). So one answer holds one sample per process, its `smUtil` the percent of the
//! whole time since `lastSeenTimeStamp` (the driver's internal samples newer than it,
//! averaged), not of one sample period. Clients read it so: nvtop found per-process figures
//! lagging until it passed the last timestamp ("Otherwise the function returns the
//! utilization over a larger period of time"), nvitop dropped a 2 s margin because it made
//! the call return "the average utilization rather than the instant values", and HAMi-core
//! asks for the last second and reads the percent as a rate. A sample's own `timeStamp` is
//! that of the newest internal sample in which the process ran.
//!
//! So an answer's time is each sample's percent of the answer's window: from the timestamp
//! asked after to the newest timestamp answered (the end of the newest period in which any
//! process ran). An answer read one period after the last holds one period's figures; one
//! read late (a starved sampler thread) holds the average over all the periods since, and
//! is weighed by all of them. Counting a percent of one period per sample, as if every
//! sample covered one period, undercounts a late read by the number of periods it spans.
//!
//! Two limits remain. Periods at the end of a window in which no process ran are not
//! known to be in it (no timestamp names them): the window is taken to end at the newest
//! timestamp, so such a window's figures read low by the idle periods' share of it (a
//! read one period late, after a period idle for every process, reads half of the period
//! before); the next window starts at that timestamp, so nothing is counted twice. A
//! process throttled to its share runs in every period, so this loses only the work of a
//! late read's window after which every process stopped. And the first answer is asked
//! after the process's start, which the driver rounds down to the start of its period:
//! that answer's window is longer by the part of a period before the start, which is
//! added once the period is known.
//!
//! A driver that gave several samples of one process in one answer (not what nvml.h
//! describes) is read as giving one per sample period: each counts its percent of one
//! period.

/// One per-process utilisation sample as NVML gives it (`nvmlProcessUtilizationSample_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    /// CPU timestamp of the sample, microseconds since the epoch.
    pub timestamp_us: u64,
    /// Percent of the sample period during which the process's kernels ran.
    pub sm_util: u32,
}

/// NVML documents a sample period of 1/6 s to 1 s depending on the product.
pub const MIN_PERIOD_US: u64 = 1_000_000 / 6;
pub const MAX_PERIOD_US: u64 = 1_000_000;
/// Gaps between timestamps shorter than this are not a period (timestamps jitter a little).
const SHORTEST_GAP_US: u64 = MIN_PERIOD_US * 9 / 10;
/// Processes whose newest timestamp a [`UtilisationBook`] remembers.
const PIDS_KEPT: usize = 64;

/// Turns NVML's per-process utilisation samples into GPU time, for one device (see the
/// module's documentation for what an answer covers).
///
/// The sample period is not in the answer: it is the smallest gap between two timestamps
/// of one process (any process's, so one busy neighbour is enough to learn it), within the
/// documented 1/6 s to 1 s. Answers are counted without it; it says when the next answer is
/// due, how long a quiet device has been quiet, and where the first answer's window began.
/// What NVML has answered for is "covered": work that ended before the newest timestamp
/// answered is in its samples.
#[derive(Debug, Clone)]
pub struct UtilisationBook {
    start_us: u64,
    last_seen_us: u64,
    covered_us: u64,
    period_us: Option<u64>,
    /// The newest timestamp seen of each process (the most recent [`PIDS_KEPT`]).
    newest_of: Vec<(u32, u64)>,
    /// Percent-microseconds counted (percent of a window times its length), and those of
    /// samples counted as one period each (a driver giving several per process).
    percent_us: u64,
    percent_periods: u64,
    /// The first answer: the percent its samples gave and its newest timestamp (its window
    /// began at the start of the period holding `start_us`; see the module).
    first: Option<(u64, u64)>,
    /// GPU time reported so far (ns).
    reported_ns: u64,
    primed: bool,
}

impl UtilisationBook {
    /// A book for a process that began using the device at `start_us` (CPU time, µs since
    /// the epoch): it is asked for the samples after that time.
    pub fn new(start_us: u64) -> UtilisationBook {
        UtilisationBook {
            start_us,
            last_seen_us: start_us,
            covered_us: start_us,
            period_us: None,
            newest_of: Vec::new(),
            percent_us: 0,
            percent_periods: 0,
            first: None,
            reported_ns: 0,
            primed: false,
        }
    }

    /// The `lastSeenTimeStamp` to ask NVML with: the process's start the first time, then
    /// the newest timestamp answered. Each answer's window begins where the last one ended.
    pub fn ask_after(&self) -> u64 {
        self.last_seen_us
    }

    /// The sample period as learned so far (the shortest documented one until then, for
    /// deciding when to ask again).
    pub fn period_us(&self) -> u64 {
        self.period_us.unwrap_or(MIN_PERIOD_US)
    }

    /// Whether the sample period is known.
    pub fn measuring(&self) -> bool {
        self.period_us.is_some()
    }

    /// Everything that ended before this time (CPU µs since the epoch) is in the samples.
    pub fn covered_us(&self) -> u64 {
        self.covered_us
    }

    /// Takes the answer to a question asked with [`UtilisationBook::ask_after`]; returns the
    /// GPU time (ns) that processes `pids` used in it, plus the correction of the first
    /// answer's window once the period is known. `now_us` is the CPU time of the question.
    pub fn ingest(&mut self, samples: &[Sample], pids: &[u32], now_us: u64) -> i64 {
        let after = self.last_seen_us;
        let mut fresh: Vec<Sample> = samples.iter().copied().filter(|s| s.timestamp_us > after).collect();
        fresh.sort_unstable_by_key(|s| (s.pid, s.timestamp_us));
        fresh.dedup_by_key(|s| (s.pid, s.timestamp_us));
        self.learn_period(&fresh);
        if let Some(newest) = fresh.iter().map(|s| s.timestamp_us).max() {
            let window = newest - after;
            let mut percent = 0;
            for s in fresh.iter().filter(|s| pids.contains(&s.pid)) {
                let several = fresh.iter().filter(|o| o.pid == s.pid).count() > 1;
                if several {
                    self.percent_periods += s.sm_util.min(100) as u64;
                } else {
                    percent += s.sm_util.min(100) as u64;
                }
            }
            self.percent_us += percent * window;
            if !self.primed {
                self.first = Some((percent, newest));
            }
            self.last_seen_us = newest;
            self.covered_us = self.covered_us.max(newest);
        } else if let Some(period) = self.period_us {
            // Nothing new: no process ran in any period completed since; those periods are
            // complete once a whole period (and one more for slack) has passed.
            self.covered_us = self.covered_us.max(now_us.saturating_sub(2 * period));
        }
        self.primed = true;
        // percent x µs x 10 = ns.
        let total = (self.percent_us + self.percent_periods * self.period_us() + self.first_window_rest()) * 10;
        let delta = total as i64 - self.reported_ns as i64;
        self.reported_ns = total;
        delta
    }

    /// Learns the period from the gaps between timestamps of one process.
    fn learn_period(&mut self, fresh: &[Sample]) {
        for s in fresh {
            let (pid, t) = (s.pid, s.timestamp_us);
            if let Some((_, previous)) = self.newest_of.iter_mut().find(|(p, _)| *p == pid) {
                let gap = t.saturating_sub(*previous);
                if gap >= SHORTEST_GAP_US && self.period_us.is_none_or(|known| gap < known) {
                    self.period_us = Some(gap.clamp(MIN_PERIOD_US, MAX_PERIOD_US));
                }
                *previous = (*previous).max(t);
            } else {
                if self.newest_of.len() >= PIDS_KEPT {
                    // Forget the process seen least recently.
                    let oldest = self.newest_of.iter().enumerate().min_by_key(|(_, (_, t))| *t).map(|(i, _)| i).unwrap_or(0);
                    self.newest_of.swap_remove(oldest);
                }
                self.newest_of.push((pid, t));
            }
        }
    }

    /// Percent-microseconds of the first answer's window before the process's start (the
    /// driver's window began at the start of the period holding it), once the period is
    /// known: its timestamps are period ends, so the window held whole periods.
    fn first_window_rest(&self) -> u64 {
        let (Some((percent, newest)), Some(period)) = (self.first, self.period_us) else { return 0 };
        let asked = newest - self.start_us;
        let whole = asked.div_ceil(period) * period;
        percent * (whole - asked)
    }
}
