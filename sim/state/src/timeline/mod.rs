//! The device timeline: when the simulated GPU runs each process's work.
//!
//! Without MPS, an NVIDIA GPU time-slices between contexts: one context's work runs at a
//! time, and the others wait for their turn. Each device here has one timeline shared by
//! every process through the state file:
//!
//! - every CUDA context that submits work gets a record with a FIFO of [`QUEUE_DEPTH`]
//!   items (kernels with a duration, and zero-length markers for events); the context's
//!   work runs in submission order, one item at a time;
//! - the device runs one context at a time, round robin over the contexts with pending
//!   work, in turns of at least one time slice (`FGPU_SIM_TIMESLICE`, default
//!   [`DEFAULT_TIMESLICE_NS`]): at the end of each kernel whose turn has used up its
//!   slice, the next context with work gets the device. A kernel is never cut short
//!   (no preemption inside a kernel), and the turn ends only at a kernel boundary;
//! - times are `CLOCK_MONOTONIC` nanoseconds. Nothing executes: each item's start and end
//!   follow from the submissions, computed when anyone looks ("advancing" the timeline to
//!   now) under a lock the kernel drops if its holder dies. No thread of any process
//!   runs the GPU, so a loaded CPU changes when the host notices, never the shares;
//! - the pending work of a process that died is dropped the next time anyone advances the
//!   timeline; a kernel it had running ends there.
//!
//! Every interval a context ran is kept in a history ring of [`HISTORY_LEN`] entries
//! (consecutive kernels of one context merged), from which the ground truth
//! ([`crate::SimState::device_busy`]) and NVML's utilisation samples
//! ([`crate::SimState::utilisation_periods`]) are computed.
//!
//! Crash safety: the scheduler's state (which context holds the device, each context's
//! completed count, the open history interval) is double-buffered. An advance copies the
//! current copy, computes, writes the other copy and flips one word. A process killed in
//! the middle leaves the previous state in force; anything it wrote beyond (history
//! entries past the committed head, item end times) is rewritten identically next time.
//!
//! This file holds the timeline's constants, its layout in the state file, the clock and
//! the types callers see; `engine.rs` the scheduler and the calls a context makes,
//! `history.rs` what is read back from the history.

use crate::duration::parse_duration;
use std::sync::atomic::{AtomicU32, AtomicU64};

mod engine;
mod history;

/// Pending items (kernels and event markers) one context can have queued; a launch into a
/// full queue blocks until the oldest completes, as the real driver's does (its depth is
/// not documented; about a thousand launches is what users observe).
pub const QUEUE_DEPTH: u64 = 1024;
/// Contexts that can have work on one device's timeline at once (all processes together).
pub const MAX_TIMELINE_CONTEXTS: usize = 64;
/// Intervals of history kept per device (about 65 s of two contexts alternating in 2 ms
/// turns; less when contexts leave idle gaps between kernels).
pub const HISTORY_LEN: u64 = 1 << 16;
/// Identities of past contexts kept per device, so that history can name its processes.
const IDENTITIES: usize = 1024;
/// Default time slice: NVIDIA does not publish the one its GPUs use; "a few ms".
pub const DEFAULT_TIMESLICE_NS: u64 = 2_000_000;
/// NVML sample period: NVML documents 1/6 s to 1 s depending on the product; this
/// simulator takes 1/6 s unless `FGPU_SIM_SAMPLE_PERIOD` says otherwise
/// ([`crate::SimState::sample_period_ns`]). Periods are aligned on multiples of it on
/// `CLOCK_MONOTONIC`.
pub const SAMPLE_PERIOD_NS: u64 = 1_000_000_000 / 6;
/// How far back NVML's sample buffer reaches, in periods.
pub const SAMPLE_RETENTION_PERIODS: u64 = 120;
/// Longest a waiter sleeps before looking again (bounds how late it notices that a dead
/// process's work was dropped).
const MAX_NAP_NS: u64 = 10_000_000;
/// Duration value of a marker item.
const MARKER: u64 = u64::MAX;
/// Lock byte of timeline `d`: `TIMELINE_LOCK_BYTE + d` (inside the header, below the MIG
/// locks at 192).
pub(crate) const TIMELINE_LOCK_BYTE: i64 = 64;

/// How late, and in what bursts, one process learns what the device did: the completion of
/// its work (events, stream and context synchronisation) and NVML's utilisation samples
/// (`FGPU_SIM_LATE_DELIVERY`, read by each process for itself; unset: at once).
///
/// A process whose threads are starved of CPU (a host whose cores are all busy) does not
/// see a completion when it happens: its threads look, or are woken, some time after, and
/// then see everything that happened meanwhile at once. The real driver's completions and
/// NVML's samples reach such a process the same way. This models it: the process is told
/// what happened at its own delivery instants, every `every_ns` at an offset of its own
/// (`phase_ns`, so that processes are not told in step), and each instant tells it what had
/// happened `every_ns` before it. What happened at `t` thus reaches it between `every_ns`
/// and twice that later, together with everything else of the same stretch.
///
/// The device itself is not slowed: kernels start and end on the timeline as they would;
/// only what the process can know of them, and when its waits return, is late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Time between two of the process's delivery instants, and how stale each is.
    pub every_ns: u64,
    /// The process's offset of its instants (below `every_ns`).
    pub phase_ns: u64,
}

impl Delivery {
    /// A delivery every `every_ns` at offset `phase_ns`; `None` for 0 (at once).
    pub fn new(every_ns: u64, phase_ns: u64) -> Option<Delivery> {
        (every_ns > 0).then(|| Delivery { every_ns, phase_ns: phase_ns % every_ns })
    }

    /// Parses `FGPU_SIM_LATE_DELIVERY` (a duration, `0` or empty: off) for the process
    /// `pid`, whose offset follows from it.
    pub fn parse(value: &str, pid: u32) -> Result<Option<Delivery>, String> {
        let value = value.trim();
        if value.is_empty() || value == "0" {
            return Ok(None);
        }
        let every = parse_duration(value)
            .filter(|&t| t <= 10_000_000_000)
            .ok_or_else(|| format!("FGPU_SIM_LATE_DELIVERY={value:?} is not valid (a duration up to 10s: 50ms, 200ms)"))?;
        // Spread the processes' offsets over the interval (a multiplicative hash of the pid).
        let phase = (pid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        Ok(Delivery::new(every, phase))
    }

    /// This process's delivery (`FGPU_SIM_LATE_DELIVERY`, read once); an invalid value is
    /// an error, which the simulated driver's `cuInit` reports.
    pub fn of_this_process() -> Result<Option<Delivery>, String> {
        static THIS: std::sync::OnceLock<Result<Option<Delivery>, String>> = std::sync::OnceLock::new();
        THIS.get_or_init(|| Delivery::parse(&std::env::var("FGPU_SIM_LATE_DELIVERY").unwrap_or_default(), std::process::id())).clone()
    }

    /// The delivery instant at or before `t` (0 before the first).
    fn instant_at_or_before(&self, t: u64) -> u64 {
        if t < self.phase_ns {
            return 0;
        }
        (t - self.phase_ns) / self.every_ns * self.every_ns + self.phase_ns
    }

    /// Up to when the process has been told what happened, at `now`.
    pub fn seen_until(&self, now: u64) -> u64 {
        self.instant_at_or_before(now.saturating_sub(self.every_ns))
    }

    /// When the process learns of something that happened at `t`: its first delivery
    /// instant at or after `t`, plus `every_ns` (so that `seen_until` at that time is `t` or
    /// later).
    pub fn delivered_at(&self, t: u64) -> u64 {
        let first = if t <= self.phase_ns { self.phase_ns } else { self.phase_ns + (t - self.phase_ns).div_ceil(self.every_ns) * self.every_ns };
        first.saturating_add(self.every_ns)
    }
}

/// What a context submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A kernel that occupies the device for this many nanoseconds once it starts.
    Kernel(u64),
    /// An event marker: complete as soon as the context's earlier work is.
    Marker,
}

/// A context's record on a device timeline (returned by [`crate::SimState::timeline_open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimelineContext {
    /// The timeline: a GPU's index for the GPU itself, [`crate::MigDevice::timeline`] for a
    /// MIG device ([`crate::timeline_index`]).
    pub device: usize,
    /// Record index on that device.
    pub index: usize,
    /// Which use of the record this is (records are reused after their context goes).
    pub incarnation: u32,
}

/// Why a timeline call could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineError {
    /// The context's record is gone: closed, or its process was found dead.
    Gone,
    /// Every record of the device is in use.
    Full,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Item {
    submit: u64,
    dur: u64,
    end: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CtxSched {
    active: u32,
    incarnation: u32,
    owner_slot: u32,
    owner_gen: u32,
    completed: u64,
    /// End of the last completed item.
    last_end: u64,
    /// Nanoseconds this record's kernels ran, in all.
    busy: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Sched {
    /// Everything before this time is decided.
    sim_time: u64,
    slice_start: u64,
    run_start: u64,
    run_end: u64,
    /// Intervals written to the history ring so far.
    hist_head: u64,
    /// History before this time has been overwritten.
    hist_floor: u64,
    open_start: u64,
    open_end: u64,
    open_incarnation: u32,
    open_valid: u32,
    /// The record holding the device (or that held it last).
    cur: u32,
    running: u32,
    next_incarnation: u32,
    _pad: u32,
    ctx: [CtxSched; MAX_TIMELINE_CONTEXTS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Interval {
    start: u64,
    end: u64,
    incarnation: u32,
    _pad: u32,
}

#[repr(C)]
struct Identity {
    incarnation: AtomicU32,
    slot: AtomicU32,
    gen: AtomicU32,
    pid: AtomicU32,
    host_pid: AtomicU32,
    _pad: u32,
    context: AtomicU64,
    /// Kernels and event markers this incarnation submitted, in all (ground truth).
    kernels: AtomicU64,
    markers: AtomicU64,
}

#[repr(C)]
struct DeviceTimeline {
    commit: AtomicU32,
    _pad: [u32; 15],
    sched: [Sched; 2],
    submitted: [AtomicU64; MAX_TIMELINE_CONTEXTS],
    identities: [Identity; IDENTITIES],
    history: [Interval; HISTORY_LEN as usize],
    rings: [[Item; QUEUE_DEPTH as usize]; MAX_TIMELINE_CONTEXTS],
}

/// Bytes of one device's timeline in the state file (page aligned).
pub const DEVICE_TIMELINE_SIZE: usize = std::mem::size_of::<DeviceTimeline>().div_ceil(4096) * 4096;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the timeline's clock.
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC, ns.
pub(crate) fn realtime_offset_ns() -> i64 {
    let mono = now_ns() as i64;
    clock_ns(libc::CLOCK_REALTIME) as i64 - mono
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `t` (never burns CPU).
pub fn sleep_until(t: u64) {
    let ts = libc::timespec { tv_sec: (t / 1_000_000_000) as libc::time_t, tv_nsec: (t % 1_000_000_000) as libc::c_long };
    loop {
        // SAFETY: ts is a valid timespec; a NULL remainder is allowed with TIMER_ABSTIME.
        let r = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if r != libc::EINTR {
            return;
        }
    }
}

// ---- reading the history: ground truth and NVML samples ----

/// Busy time of one context on a device over a window (see [`crate::SimState::device_busy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextBusy {
    /// The process's pid in its own namespace.
    pub pid: u32,
    /// Its pid in the initial namespace (0 where unknown).
    pub host_pid: u32,
    /// Its process-table slot.
    pub slot: usize,
    /// The CUDA context handle, as the process saw it.
    pub context: u64,
    /// Which use of the timeline record this was.
    pub incarnation: u32,
    /// Nanoseconds the context's kernels ran inside the window.
    pub busy_ns: u64,
}

/// What ran on a device over `[from_ns, to_ns)` of `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyWindow {
    pub device: usize,
    pub from_ns: u64,
    /// End of the window (never later than the moment it was read).
    pub to_ns: u64,
    /// False when the history ring no longer reaches back to `from_ns`.
    pub complete: bool,
    /// Nanoseconds during which some kernel ran.
    pub device_busy_ns: u64,
    pub contexts: Vec<ContextBusy>,
}

impl BusyWindow {
    /// Length of the window, ns.
    pub fn len_ns(&self) -> u64 {
        self.to_ns.saturating_sub(self.from_ns)
    }
    /// Busy ns of the process with this pid in its own namespace.
    pub fn busy_of_pid(&self, pid: u32) -> u64 {
        self.contexts.iter().filter(|c| c.pid == pid).map(|c| c.busy_ns).sum()
    }
    /// Busy ns of the process with this host pid.
    pub fn busy_of_host_pid(&self, host_pid: u32) -> u64 {
        self.contexts.iter().filter(|c| c.host_pid == host_pid && host_pid != 0).map(|c| c.busy_ns).sum()
    }
    /// Share of the window (0..=1) the process with this pid (own namespace) ran kernels.
    pub fn share_of_pid(&self, pid: u32) -> f64 {
        self.busy_of_pid(pid) as f64 / self.len_ns().max(1) as f64
    }
    /// Share of the window during which the device ran any kernel.
    pub fn device_share(&self) -> f64 {
        self.device_busy_ns as f64 / self.len_ns().max(1) as f64
    }
}

/// What a process submitted to a device's timeline ([`crate::SimState::items_submitted`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Submitted {
    pub kernels: u64,
    /// Event markers (`cuEventRecord`), the program's and any library's alike.
    pub markers: u64,
}

/// One NVML sample period of a device: what `nvmlDeviceGetUtilizationRates` and
/// `nvmlDeviceGetProcessUtilization` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UtilisationPeriod {
    /// End of the period, `CLOCK_MONOTONIC` ns.
    pub end_ns: u64,
    /// Its length, ns (the sample period).
    pub period_ns: u64,
    /// The same instant as a CPU timestamp in microseconds since the Unix epoch (what
    /// NVML's `timeStamp` fields hold).
    pub timestamp_us: u64,
    /// Nanoseconds of the period during which some kernel ran.
    pub device_busy_ns: u64,
    /// (pid as NVML reports it, ns its kernels ran), for processes that ran any.
    pub processes: Vec<(u32, u64)>,
}

/// One process's sample in `nvmlDeviceGetProcessUtilization` ([`crate::SimState::process_utilisation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    /// As NVML reports it (`FGPU_SIM_NVML_PIDS`).
    pub pid: u32,
    pub timestamp_us: u64,
    pub sm_util: u32,
}

/// NVML's per-process utilisation of a device at one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUtilisation {
    /// Processes running on the device (a context there): what a size query answers.
    pub running: usize,
    pub samples: Vec<ProcessSample>,
}

impl UtilisationPeriod {
    /// `busy_ns` as a percent of the period, rounded (NVML's `gpu` and `smUtil`).
    pub fn percent(&self, busy_ns: u64) -> u32 {
        let p = self.period_ns.max(1) as u128;
        ((busy_ns as u128 * 100 + p / 2) / p).min(100) as u32
    }
}

#[cfg(test)]
mod tests;
