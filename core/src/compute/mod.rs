//! The compute share (`FGPU_COMPUTE`, `compute =` in the configuration file): a ceiling on
//! the part of a GPU's time that the kernels of a ledger's processes occupy. This module is
//! the policy, with no driver: what a share is, the bucket that holds a ledger to it, how
//! launches are grouped into chunks, and how NVML's per-process utilisation samples become
//! GPU time. The shim (`shim/src/compute/`) applies it; the ledger (`ledger/compute.rs`)
//! holds the state that a ledger's processes share. The design is in `docs/compute.md`.
//!
//! **The bucket.** A ledger's share `c` on a device is a virtual clock `V` (nanoseconds of
//! `CLOCK_MONOTONIC`), the generic cell rate algorithm: charging `g` nanoseconds of GPU
//! time moves `V` forward by `g / c`; launches are admitted while `V` is behind now, so the
//! GPU time charged over any interval `T` is at most `c * T` plus what the bucket holds at
//! its start. `V` is never left more than [`BURST_WALL_NS`] behind now: unused time is kept
//! for at most that long, so a ledger idle for an hour cannot then run at 100 % for 15
//! minutes. One 64-bit word in the ledger, changed by compare-and-swap.
//!
//! **Charges.** A chunk of launches is charged when it is admitted, at an estimate of its
//! cost (provisional); once what it really took is known, the estimate is refunded and the
//! measured time charged (NVML's samples of the process, or the time its work kept the GPU
//! according to its own events). Every estimate is refunded exactly once, so over time `V`
//! moves by exactly the measured time: the estimate only decides how smoothly.

use crate::limit::{parse_spec, AmbiguousKey, Amount, LimitError, LimitSpec};

/// Parts per million: the unit of a share in the ledger (`30%` is 300 000).
pub const PPM: u64 = 1_000_000;

/// How long unused share is kept: the bucket holds at most this much wall time of share
/// (`share x 200 ms` of GPU time).
pub const BURST_WALL_NS: u64 = 200_000_000;

/// GPU time one chunk of launches aims at (its launches are counted from the cost
/// estimate). Chunks are the unit of admission, of the in-flight bound and of measurement.
pub const CHUNK_GPU_NS: u64 = 5_000_000;

/// Most launches in one chunk: kernels so short that thousands fit in [`CHUNK_GPU_NS`]
/// still end a chunk (and record its events) at least this often.
pub const MAX_CHUNK_LAUNCHES: u32 = 16384;

/// Most estimated GPU time a process keeps queued beyond what has completed (chunks
/// admitted whose end marker has not completed). At least one chunk is always allowed.
pub const INFLIGHT_GPU_NS: u64 = 40_000_000;

/// A compute share as configured: one percentage for every device, or per device UUID
/// (the same key grammar as `FGPU_LIMIT`, see `limit.rs`), every amount a percentage.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareSpec {
    pub spec: LimitSpec,
}

/// Parses `FGPU_COMPUTE` or the file's `compute`: `30%`, `12.5%`, `GPU-1a2b=30%,*=50%`.
pub fn parse_share(text: &str) -> Result<ShareSpec, LimitError> {
    let spec = parse_spec(text)?;
    let amounts = spec.default.iter().chain(spec.per_device.iter().map(|(_, a)| a));
    for amount in amounts {
        if let Amount::Bytes(_) = amount {
            return Err(LimitError::NotPercent(text.trim().to_string()));
        }
    }
    Ok(ShareSpec { spec })
}

impl ShareSpec {
    /// The share of the device with this UUID (`GPU-…` or `MIG-…`), in parts per million,
    /// or `None` when this spec does not name the device.
    pub fn share_for(&self, uuid: &str) -> Option<u64> {
        match self.spec.amount_for(uuid)? {
            Amount::Percent(p) => Some(percent_to_ppm(p)),
            Amount::Bytes(_) => None,
        }
    }

    pub fn has_prefix_keys(&self) -> bool {
        self.spec.has_prefix_keys()
    }

    pub fn first_prefix_key(&self) -> Option<&str> {
        self.spec.first_prefix_key()
    }

    pub fn ambiguous_key(&self, uuids: &[String]) -> Option<AmbiguousKey> {
        self.spec.ambiguous_key(uuids)
    }
}

/// `30.0` -> 300 000; at least 1.
pub fn percent_to_ppm(percent: f64) -> u64 {
    ((percent * 10_000.0).round() as u64).clamp(1, PPM)
}

/// `300000` -> `"30%"`, `125000` -> `"12.5%"`.
pub fn format_share(ppm: u64) -> String {
    let percent = ppm as f64 / 10_000.0;
    if ppm.is_multiple_of(10_000) {
        format!("{percent:.0}%")
    } else {
        let text = format!("{percent:.4}");
        format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// Wall time that `gpu_ns` of GPU time is worth at `share`.
pub fn wall_for(gpu_ns: u64, share: u64) -> u64 {
    let share = share.clamp(1, PPM);
    (gpu_ns as u128 * PPM as u128 / share as u128).min(u64::MAX as u128) as u64
}

/// The bucket's clock after charging `gpu_ns` of GPU time (negative: a refund) at `now`.
/// The clock is first brought to at most [`BURST_WALL_NS`] behind now, and a refund never
/// takes it further back than that.
pub fn charge(vclock: u64, now: u64, gpu_ns: i64, share: u64) -> u64 {
    charge_keeping_rest(vclock, now, gpu_ns, share).0
}

/// [`charge`], and the part of a refund (GPU ns) the bucket could not take because it
/// would have gone further back than [`BURST_WALL_NS`]. The caller keeps that rest
/// ([`Carry`]) and takes it off later charges: a refund gives back estimates that were
/// charged earlier, so dropping it would hold the ledger below its share for good.
pub fn charge_keeping_rest(vclock: u64, now: u64, gpu_ns: i64, share: u64) -> (u64, u64) {
    let floor = now.saturating_sub(BURST_WALL_NS);
    let base = vclock.max(floor);
    let wall = wall_for(gpu_ns.unsigned_abs(), share);
    if gpu_ns >= 0 {
        return (base.saturating_add(wall), 0);
    }
    let room = base - floor;
    if wall <= room {
        return (base - wall, 0);
    }
    // GPU time worth the wall time that did not fit.
    let rest = ((wall - room) as u128 * share.clamp(1, PPM) as u128 / PPM as u128) as u64;
    (floor, rest)
}

/// Refunds a bucket could not take yet ([`charge_keeping_rest`]), taken off the next
/// charges. Bounded by [`CARRY_MAX_WALL_NS`] of the share: a refund that large means the
/// estimates were far off for a long time, and giving it all back at once would be a
/// burst the ceiling does not allow.
#[derive(Debug, Default)]
pub struct Carry(std::sync::atomic::AtomicU64);

/// Most wall time of share a [`Carry`] holds.
pub const CARRY_MAX_WALL_NS: u64 = 300_000_000;

impl Carry {
    /// What of a charge of `gpu_ns` is left to apply once the carry has been spent on it
    /// (refunds pass through unchanged).
    pub fn spend(&self, gpu_ns: i64) -> i64 {
        use std::sync::atomic::Ordering::AcqRel;
        // Nothing carried (the usual case): no read-modify-write on the chunk's path.
        if gpu_ns <= 0 || self.held() == 0 {
            return gpu_ns;
        }
        let want = gpu_ns as u64;
        let had = self.0.fetch_update(AcqRel, std::sync::atomic::Ordering::Acquire, |c| Some(c - c.min(want))).unwrap_or(0);
        gpu_ns - had.min(want) as i64
    }

    /// Keeps `rest_ns` of refund for later, up to the bound at `share`.
    pub fn keep(&self, rest_ns: u64, share: u64) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        if rest_ns == 0 {
            return;
        }
        let most = (CARRY_MAX_WALL_NS as u128 * share.min(PPM) as u128 / PPM as u128) as u64;
        let _ = self.0.fetch_update(AcqRel, Acquire, |c| Some(c.saturating_add(rest_ns).min(most)));
    }

    /// GPU time held.
    pub fn held(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// GPU time the bucket holds at `now` (0 while its clock is ahead).
pub fn tokens(vclock: u64, now: u64, share: u64) -> u64 {
    let behind = now.saturating_sub(vclock).min(BURST_WALL_NS);
    (behind as u128 * share.min(PPM) as u128 / PPM as u128) as u64
}

/// GPU time the bucket must hold before a chunk is admitted: one chunk's worth, or all it
/// can hold if that is less. Waiting for a whole chunk rather than for any time at all
/// keeps chunks whole, so a throttled process runs in chunks of [`CHUNK_GPU_NS`] instead
/// of one launch per wake-up.
pub fn admit_threshold(share: u64) -> u64 {
    let most = (BURST_WALL_NS as u128 * share.min(PPM) as u128 / PPM as u128) as u64;
    CHUNK_GPU_NS.min(most).max(1)
}

/// Admits a chunk: the bucket's clock after charging `gpu_ns` at `now`, or `None` when the
/// bucket does not hold `threshold` of GPU time at `now` (nothing is charged then). The
/// test and the charge are one step of the caller's compare-and-swap, so two processes
/// never both take the last chunk's worth of a bucket they share.
pub fn admit(vclock: u64, now: u64, gpu_ns: u64, share: u64, threshold: u64) -> Option<u64> {
    (tokens(vclock, now, share) >= threshold).then(|| charge(vclock, now, gpu_ns.min(i64::MAX as u64) as i64, share))
}

/// Whether a bucket whose clock is `vclock` is overdrawn at `now`: more GPU time has been
/// charged to it than the share gives up to now (measured use above the estimates it was
/// admitted on, or one long kernel charged whole). Nothing more may run until it has
/// caught up: no chunk is admitted, and chunks already open are ended at their next launch.
pub fn overdrawn(vclock: u64, now: u64) -> bool {
    vclock > now
}

/// When a bucket whose clock is `vclock` will hold `threshold` of GPU time.
pub fn admit_at(vclock: u64, threshold: u64, share: u64) -> u64 {
    vclock.saturating_add(wall_for(threshold, share))
}

/// How many launches the next chunk gets, from the estimated GPU time of one launch
/// (`est_ns`, 0 while unknown) and the GPU time the bucket holds.
pub fn chunk_launches(est_ns: u64, tokens_ns: u64) -> u32 {
    if est_ns == 0 {
        return 1;
    }
    let grant = tokens_ns.clamp(1, CHUNK_GPU_NS);
    (grant / est_ns).clamp(1, MAX_CHUNK_LAUNCHES as u64) as u32
}

/// Whether a chunk estimated at `next_ns` may be admitted while `inflight_ns` of admitted
/// work has not been seen to complete.
pub fn inflight_allows(inflight_ns: u64, next_ns: u64) -> bool {
    inflight_ns == 0 || inflight_ns.saturating_add(next_ns) <= INFLIGHT_GPU_NS
}

/// The GPU time one launch takes, estimated from the last measured chunks (the median of
/// the last [`CostEstimate::KEPT`], so that one chunk that waited behind another context or
/// sat idle does not move it much).
#[derive(Debug, Clone, Default)]
pub struct CostEstimate {
    kept: [u64; CostEstimate::KEPT],
    len: usize,
    next: usize,
}

impl CostEstimate {
    pub const KEPT: usize = 8;

    /// A chunk of `launches` launches took `busy_ns`.
    pub fn add(&mut self, busy_ns: u64, launches: u32) {
        if launches == 0 {
            return;
        }
        self.kept[self.next] = (busy_ns / launches as u64).max(1);
        self.next = (self.next + 1) % Self::KEPT;
        self.len = (self.len + 1).min(Self::KEPT);
    }

    /// The estimate, 0 while nothing is measured.
    pub fn get(&self) -> u64 {
        if self.len == 0 {
            return 0;
        }
        let mut v = self.kept[..self.len].to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    }
}

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

/// Turns NVML's per-process utilisation samples into GPU time, for one device.
///
/// NVML answers the samples newer than the timestamp it is asked with, one per process and
/// sample period in which the process ran; `smUtil` is a percent of the period. The period
/// is not in the answer: it is the smallest gap between two samples of one process (any
/// process's, so one busy neighbour is enough to learn it), within the documented 1/6 s to
/// 1 s. One process's samples are a whole number of periods apart, whereas samples of
/// different processes need not be stamped at the same instants. Time is counted as the sum of the percents times the period, so when the period
/// learned changes, what was counted before is corrected (the correction is part of the
/// next answer's figure). What NVML has answered for is "covered": work that ended before
/// the newest timestamp answered is in its samples.
///
/// **Until a gap is seen the period is unknown**, and NVML's figures cannot be turned into
/// time: anywhere from 1/6 s to 1 s per sample. The book then reports nothing and covers
/// nothing, so the caller keeps charging its own upper bounds (the chunks' events), and
/// counts the samples once the period is known. Guessing instead would break the ceiling
/// one way or the other: the shortest period counts a 1 s product's samples at a sixth of
/// their time (the container runs unthrottled until the period is learned), the longest
/// counts a 1/6 s product's six times over (a refund the bucket cannot hold is lost).
#[derive(Debug, Clone)]
pub struct UtilisationBook {
    start_us: u64,
    last_seen_us: u64,
    covered_us: u64,
    period_us: Option<u64>,
    /// The newest timestamp seen of each process (the most recent [`PIDS_KEPT`]).
    newest_of: Vec<(u32, u64)>,
    /// Sum of the percents counted, and the GPU time reported for them so far.
    percent_sum: u64,
    reported_ns: u64,
    primed: bool,
}

impl UtilisationBook {
    /// A book for a process that began using the device at `start_us` (CPU time, µs since
    /// the epoch): samples before that are not its.
    pub fn new(start_us: u64) -> UtilisationBook {
        UtilisationBook {
            start_us,
            last_seen_us: 0,
            covered_us: start_us,
            period_us: None,
            newest_of: Vec::new(),
            percent_sum: 0,
            reported_ns: 0,
            primed: false,
        }
    }

    /// The `lastSeenTimeStamp` to ask NVML with: 0 the first time (the whole buffer, to
    /// learn the period), then the newest timestamp seen.
    pub fn ask_after(&self) -> u64 {
        if self.primed {
            self.last_seen_us
        } else {
            0
        }
    }

    /// The sample period as learned so far (the shortest documented one until then, for
    /// deciding when to ask again).
    pub fn period_us(&self) -> u64 {
        self.period_us.unwrap_or(MIN_PERIOD_US)
    }

    /// Whether the period is known, i.e. NVML's figures are being counted.
    pub fn measuring(&self) -> bool {
        self.period_us.is_some()
    }

    /// Everything that ended before this time (CPU µs since the epoch) is in the samples.
    pub fn covered_us(&self) -> u64 {
        self.covered_us
    }

    /// Takes one answer; returns the GPU time (ns) that processes `pids` used in periods
    /// not counted before, plus the correction of earlier figures if the period learned
    /// changed (so it can be negative). `now_us` is the CPU time of the question.
    pub fn ingest(&mut self, samples: &[Sample], pids: &[u32], now_us: u64) -> i64 {
        let floor = if self.primed { self.last_seen_us } else { 0 };
        let mut fresh: Vec<(u32, u64)> = samples.iter().filter(|s| s.timestamp_us > floor).map(|s| (s.pid, s.timestamp_us)).collect();
        fresh.sort_unstable();
        fresh.dedup();
        for &(pid, t) in &fresh {
            let known = self.newest_of.iter_mut().find(|(p, _)| *p == pid);
            if let Some((_, previous)) = known {
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
        let newest = fresh.iter().map(|(_, t)| *t).max();
        let counted_after = floor.max(self.start_us);
        self.percent_sum += samples.iter().filter(|s| s.timestamp_us > counted_after && pids.contains(&s.pid)).map(|s| s.sm_util.min(100) as u64).sum::<u64>();
        self.primed = true;
        if let Some(newest) = newest {
            self.last_seen_us = self.last_seen_us.max(newest);
        }
        let Some(period_us) = self.period_us else {
            return 0; // nothing counted, nothing covered: see the type's documentation
        };
        match newest {
            Some(_) => self.covered_us = self.covered_us.max(self.last_seen_us),
            // Nothing new: no process ran in any period completed since; those periods are
            // complete once a whole period (and one more for slack) has passed.
            None => self.covered_us = self.covered_us.max(now_us.saturating_sub(2 * period_us)),
        }
        // percent x period (us) x 10 = ns.
        let total = self.percent_sum * period_us * 10;
        let delta = total as i64 - self.reported_ns as i64;
        self.reported_ns = total;
        delta
    }
}

#[cfg(test)]
mod tests;
