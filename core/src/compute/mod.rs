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

mod utilisation;
pub use utilisation::{Sample, UtilisationBook, MAX_PERIOD_US, MIN_PERIOD_US};

#[cfg(test)]
mod tests;
