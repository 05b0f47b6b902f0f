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
//! ([`SimState::device_busy`]) and NVML's utilisation samples
//! ([`SimState::utilisation_periods`]) are computed.
//!
//! Crash safety: the scheduler's state (which context holds the device, each context's
//! completed count, the open history interval) is double-buffered. An advance copies the
//! current copy, computes, writes the other copy and flips one word. A process killed in
//! the middle leaves the previous state in force; anything it wrote beyond (history
//! entries past the committed head, item end times) is rewritten identically next time.

use super::*;
use std::ptr::{addr_of, addr_of_mut};

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
/// ([`SimState::sample_period_ns`]). Periods are aligned on multiples of it on
/// `CLOCK_MONOTONIC`.
pub const SAMPLE_PERIOD_NS: u64 = 1_000_000_000 / 6;
/// How far back NVML's sample buffer reaches, in periods.
pub const SAMPLE_RETENTION_PERIODS: u64 = 120;
/// Longest a waiter sleeps before looking again (bounds how late it notices that a dead
/// process's work was dropped).
const MAX_NAP_NS: u64 = 10_000_000;
/// Duration value of a marker item.
const MARKER: u64 = u64::MAX;
/// Lock byte of device `d`'s timeline: `TIMELINE_LOCK_BYTE + d` (inside the header).
const TIMELINE_LOCK_BYTE: i64 = 64;

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

/// A context's record on a device timeline (returned by [`SimState::timeline_open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimelineContext {
    /// Physical device index.
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

/// Process-local half of a timeline lock: fcntl locks belong to the process, so threads of
/// one process also have to exclude each other.
static LOCAL_LOCKS: [Mutex<()>; MAX_DEVICES] = [const { Mutex::new(()) }; MAX_DEVICES];

struct TimelineLock<'a> {
    state: &'a SimState,
    device: usize,
    _local: std::sync::MutexGuard<'static, ()>,
}

impl Drop for TimelineLock<'_> {
    fn drop(&mut self) {
        let _ = flock(self.state.fd, libc::F_SETLK, libc::F_UNLCK, TIMELINE_LOCK_BYTE + self.device as i64);
    }
}

/// The scheduler working on a copy of the state. `commit` says whether what it computes is
/// written to the shared history and items (an advance) or thrown away (a projection).
struct Engine {
    tl: *mut DeviceTimeline,
    submitted: [u64; MAX_TIMELINE_CONTEXTS],
    slice: u64,
    commit: bool,
}

impl Engine {
    fn item(&self, i: usize, seq: u64) -> Item {
        let k = ((seq - 1) % QUEUE_DEPTH) as usize;
        // SAFETY: tl points to a device timeline inside the mapping; i and k are in range.
        unsafe { std::ptr::read_volatile(addr_of!((*self.tl).rings[i][k])) }
    }

    fn pending(&self, s: &Sched, i: usize) -> bool {
        s.ctx[i].active != 0 && s.ctx[i].completed < self.submitted[i]
    }

    /// The submission time of context `i`'s next kernel, if its next item is a kernel.
    fn head_kernel(&self, s: &Sched, i: usize) -> Option<u64> {
        if !self.pending(s, i) {
            return None;
        }
        let it = self.item(i, s.ctx[i].completed + 1);
        (it.dur != MARKER).then_some(it.submit)
    }

    fn complete(&self, s: &mut Sched, i: usize, end: u64) {
        let seq = s.ctx[i].completed + 1;
        s.ctx[i].completed = seq;
        s.ctx[i].last_end = end;
        if self.commit {
            let k = ((seq - 1) % QUEUE_DEPTH) as usize;
            // SAFETY: as in `item`; the caller holds the timeline lock.
            unsafe { std::ptr::write_volatile(addr_of_mut!((*self.tl).rings[i][k].end), end) };
        }
    }

    /// Adds `[start, end)` run by `incarnation` to the history.
    fn record(&self, s: &mut Sched, incarnation: u32, start: u64, end: u64) {
        if end <= start {
            return;
        }
        if s.open_valid != 0 && s.open_incarnation == incarnation && s.open_end == start {
            s.open_end = end;
            return;
        }
        if s.open_valid != 0 {
            if self.commit {
                let k = (s.hist_head % HISTORY_LEN) as usize;
                // SAFETY: k < HISTORY_LEN; the caller holds the timeline lock.
                unsafe {
                    let slot = addr_of_mut!((*self.tl).history[k]);
                    if s.hist_head >= HISTORY_LEN {
                        s.hist_floor = s.hist_floor.max(std::ptr::read_volatile(slot).end);
                    }
                    std::ptr::write_volatile(
                        slot,
                        Interval { start: s.open_start, end: s.open_end, incarnation: s.open_incarnation, _pad: 0 },
                    );
                }
            }
            s.hist_head += 1;
        }
        s.open_start = start;
        s.open_end = end;
        s.open_incarnation = incarnation;
        s.open_valid = 1;
    }

    /// The context to run at time `t` (device free), updating the turn; None if no
    /// context has a kernel submitted by `t`.
    /// `active` lists the active records in index order.
    fn pick(&self, s: &mut Sched, active: &[usize], t: u64) -> Option<usize> {
        let runnable = |s: &Sched, i: usize| self.head_kernel(s, i).is_some_and(|sub| sub <= t);
        let cur = s.cur as usize;
        if cur < MAX_TIMELINE_CONTEXTS && runnable(s, cur) {
            if t.saturating_sub(s.slice_start) < self.slice {
                return Some(cur);
            }
            if !active.iter().any(|&j| j != cur && runnable(s, j)) {
                // Alone: a new slice.
                s.slice_start = t;
                return Some(cur);
            }
        }
        // Round robin: the first runnable record after the current one, wrapping around.
        let after = active.iter().position(|&j| j > cur).unwrap_or(active.len());
        for k in 0..active.len() {
            let j = active[(after + k) % active.len()];
            if runnable(s, j) {
                s.cur = j as u32;
                s.slice_start = t;
                return Some(j);
            }
        }
        None
    }

    /// Runs the schedule forward to `to`. With `stop = Some((i, seq))` it returns as soon
    /// as context `i` has completed `seq` items, with the time that happened.
    fn advance(&self, s: &mut Sched, to: u64, stop: Option<(usize, u64)>) -> Option<u64> {
        let hit = |s: &Sched| stop.is_some_and(|(i, seq)| s.ctx[i].completed >= seq);
        let mut list = [0usize; MAX_TIMELINE_CONTEXTS];
        let mut n = 0;
        for i in 0..MAX_TIMELINE_CONTEXTS {
            if s.ctx[i].active != 0 {
                list[n] = i;
                n += 1;
            }
        }
        let active = &list[..n];
        let mut t = s.sim_time;
        loop {
            // Markers complete without the device, once their context's earlier work has.
            for &i in active {
                if s.running != 0 && s.cur as usize == i {
                    continue;
                }
                while self.pending(s, i) {
                    let it = self.item(i, s.ctx[i].completed + 1);
                    if it.dur != MARKER {
                        break;
                    }
                    let end = it.submit.max(s.ctx[i].last_end);
                    if end > to {
                        break;
                    }
                    self.complete(s, i, end);
                    if hit(s) {
                        return Some(end);
                    }
                }
            }
            if s.running != 0 {
                if s.run_end > to {
                    s.sim_time = s.sim_time.max(to);
                    return None;
                }
                let i = s.cur as usize;
                let (start, end) = (s.run_start, s.run_end);
                s.running = 0;
                let incarnation = s.ctx[i].incarnation;
                self.record(s, incarnation, start, end);
                s.ctx[i].busy += end - start;
                self.complete(s, i, end);
                t = end;
                s.sim_time = end;
                if hit(s) {
                    return Some(end);
                }
                continue;
            }
            match self.pick(s, active, t) {
                Some(i) => {
                    let it = self.item(i, s.ctx[i].completed + 1);
                    s.running = 1;
                    s.run_start = t;
                    s.run_end = t.saturating_add(it.dur);
                }
                None => {
                    let next = active.iter().filter_map(|&i| self.head_kernel(s, i)).min();
                    match next {
                        Some(n) if n <= to => {
                            t = n.max(t);
                            s.sim_time = t;
                        }
                        _ => {
                            if to != u64::MAX {
                                s.sim_time = s.sim_time.max(to);
                            }
                            return None;
                        }
                    }
                }
            }
        }
    }
}

impl SimState {
    fn timeline(&self, device: usize) -> *mut DeviceTimeline {
        let d = device.min(MAX_DEVICES - 1);
        // SAFETY: the timelines lie inside the mapping, FILE_SIZE bytes long.
        unsafe { self.base.add(TIMELINE_OFF + d * DEVICE_TIMELINE_SIZE) as *mut DeviceTimeline }
    }

    fn lock_timeline(&self, device: usize) -> TimelineLock<'_> {
        let d = device.min(MAX_DEVICES - 1);
        let local = LOCAL_LOCKS[d].lock().unwrap_or_else(|e| e.into_inner());
        // Blocking; a holder that dies releases it (the kernel drops its locks).
        let _ = flock(self.fd, libc::F_SETLKW, libc::F_WRLCK, TIMELINE_LOCK_BYTE + d as i64);
        TimelineLock { state: self, device: d, _local: local }
    }

    fn committed(&self, tl: *mut DeviceTimeline) -> Sched {
        // SAFETY: tl lies inside the mapping; the caller holds the timeline lock.
        unsafe {
            let i = (*tl).commit.load(Ordering::Acquire) as usize & 1;
            std::ptr::read_volatile(addr_of!((*tl).sched[i]))
        }
    }

    fn commit(&self, tl: *mut DeviceTimeline, s: &Sched) {
        // SAFETY: as above; the copy not in force is written, then made the one in force.
        unsafe {
            let next = 1 - ((*tl).commit.load(Ordering::Acquire) as usize & 1);
            std::ptr::write_volatile(addr_of_mut!((*tl).sched[next]), *s);
            (*tl).commit.store(next as u32, Ordering::Release);
        }
    }

    fn engine(&self, tl: *mut DeviceTimeline, commit: bool) -> Engine {
        let mut submitted = [0u64; MAX_TIMELINE_CONTEXTS];
        for (i, v) in submitted.iter_mut().enumerate() {
            // SAFETY: tl lies inside the mapping.
            *v = unsafe { (*tl).submitted[i].load(Ordering::Acquire) };
        }
        Engine { tl, submitted, slice: self.timeslice_ns(), commit }
    }

    /// Slot generation of a live slot (what a context record remembers of its owner).
    fn slot_generation(&self, slot: usize) -> u32 {
        st_gen(self.slot(slot).state.load(Ordering::Acquire))
    }

    /// Whether the process that held `slot` at generation `gen` is still alive.
    fn owner_alive(&self, slot: usize, gen: u32, key: u64) -> bool {
        let rec = self.slot(slot);
        let st = rec.state.load(Ordering::Acquire);
        if st_kind(st) != ST_LIVE || st_gen(st) != gen {
            return false;
        }
        if st_tag(st) == tag_of(key) && rec.owner_key.load(Ordering::Acquire) == key {
            return true;
        }
        match flock(self.fd, libc::F_GETLK, libc::F_WRLCK, Self::lock_byte(slot)) {
            Ok(fl) => fl.l_type as i32 != libc::F_UNLCK,
            Err(_) => true,
        }
    }

    /// Drops the records (and pending work) of processes that died. A kernel such a
    /// process had running ends at the last time the timeline was advanced to.
    fn reap(&self, e: &Engine, s: &mut Sched) {
        let key = owner_key();
        let mut seen: Vec<(u32, u32, bool)> = Vec::new();
        for i in 0..MAX_TIMELINE_CONTEXTS {
            let c = s.ctx[i];
            if c.active == 0 {
                continue;
            }
            let alive = match seen.iter().find(|x| x.0 == c.owner_slot && x.1 == c.owner_gen) {
                Some(x) => x.2,
                None => {
                    let a = self.owner_alive(c.owner_slot as usize, c.owner_gen, key);
                    seen.push((c.owner_slot, c.owner_gen, a));
                    a
                }
            };
            if alive {
                continue;
            }
            if s.running != 0 && s.cur as usize == i {
                let cut = s.sim_time.max(s.run_start);
                e.record(s, c.incarnation, s.run_start, cut);
                s.ctx[i].busy += cut - s.run_start;
                s.running = 0;
                s.sim_time = cut;
            }
            s.ctx[i].active = 0;
        }
    }

    /// Locks device `device`'s timeline, brings it up to now (dropping dead processes'
    /// work), runs `f` on the state and commits it.
    fn with_timeline<R>(&self, device: usize, f: impl FnOnce(&Engine, &mut Sched, u64) -> R) -> R {
        let _g = self.lock_timeline(device);
        let tl = self.timeline(device);
        let e = self.engine(tl, true);
        let mut s = self.committed(tl);
        self.reap(&e, &mut s);
        let now = now_ns();
        e.advance(&mut s, now, None);
        let r = f(&e, &mut s, now);
        self.commit(tl, &s);
        r
    }

    /// Gives the CUDA context `context` (a handle of the process in `slot`) a record on
    /// device `device`'s timeline.
    pub fn timeline_open(&self, device: usize, slot: usize, context: u64) -> Result<TimelineContext, TimelineError> {
        let gen = self.slot_generation(slot);
        let (pid, host_pid) = {
            let rec = self.slot(slot);
            (rec.pid.load(Ordering::Acquire), rec.host_pid.load(Ordering::Acquire))
        };
        let tl = self.timeline(device);
        self.with_timeline(device, |_, s, now| {
            let i = (0..MAX_TIMELINE_CONTEXTS).find(|&i| s.ctx[i].active == 0).ok_or(TimelineError::Full)?;
            let incarnation = s.next_incarnation.max(1);
            s.next_incarnation = incarnation.wrapping_add(1).max(1);
            s.ctx[i] = CtxSched {
                active: 1,
                incarnation,
                owner_slot: slot as u32,
                owner_gen: gen,
                completed: 0,
                last_end: now,
                busy: 0,
            };
            // SAFETY: tl lies inside the mapping; the timeline lock is held.
            unsafe {
                (*tl).submitted[i].store(0, Ordering::Release);
                let id = &(*tl).identities[incarnation as usize % IDENTITIES];
                id.incarnation.store(0, Ordering::Release);
                id.slot.store(slot as u32, Ordering::Release);
                id.gen.store(gen, Ordering::Release);
                id.pid.store(pid, Ordering::Release);
                id.host_pid.store(host_pid, Ordering::Release);
                id.context.store(context, Ordering::Release);
                id.kernels.store(0, Ordering::Relaxed);
                id.markers.store(0, Ordering::Relaxed);
                id.incarnation.store(incarnation, Ordering::Release);
            }
            Ok(TimelineContext { device, index: i, incarnation })
        })
    }

    fn check(s: &Sched, c: TimelineContext) -> Result<(), TimelineError> {
        let r = &s.ctx[c.index.min(MAX_TIMELINE_CONTEXTS - 1)];
        if r.active != 0 && r.incarnation == c.incarnation {
            Ok(())
        } else {
            Err(TimelineError::Gone)
        }
    }

    /// Queues `work` on context `c` and returns its sequence number in the context (1 for
    /// the first). Blocks (sleeping) while the context's queue holds [`QUEUE_DEPTH`] items,
    /// as a launch into a full queue does on the real driver.
    ///
    /// The new item reuses the queue entry of item `seq - QUEUE_DEPTH`; if that was a
    /// marker, `on_evicted_marker(its seq, its end)` is called first, under the timeline
    /// lock: the last moment its end can be read ([`SimState::timeline_end`] forgets it).
    pub fn timeline_submit(
        &self,
        c: TimelineContext,
        work: Work,
        mut on_evicted_marker: impl FnMut(u64, u64),
    ) -> Result<u64, TimelineError> {
        let tl = self.timeline(c.device);
        loop {
            if let Some(seq) = self.timeline_try_submit(c, work, &mut on_evicted_marker)? {
                return Ok(seq);
            }
            // Full: bring the timeline up to now; sleep until the oldest item is expected
            // to complete if it has not.
            let wake = self.with_timeline(c.device, |_, s, now| {
                Self::check(s, c)?;
                // SAFETY: tl lies inside the mapping; the timeline lock is held.
                let submitted = unsafe { (*tl).submitted[c.index].load(Ordering::Acquire) };
                if submitted - s.ctx[c.index].completed < QUEUE_DEPTH {
                    return Ok(None);
                }
                let need = submitted + 1 - QUEUE_DEPTH;
                let mut p = *s;
                let at = self.engine(tl, false).advance(&mut p, u64::MAX, Some((c.index, need)));
                Ok(Some(at.unwrap_or(u64::MAX).min(now + MAX_NAP_NS)))
            })?;
            if let Some(t) = wake {
                sleep_until(t);
            }
        }
    }

    /// [`SimState::timeline_submit`] without blocking: `Ok(None)` when the queue is full as
    /// of the last time the timeline was advanced (it is not advanced here).
    pub fn timeline_try_submit(
        &self,
        c: TimelineContext,
        work: Work,
        mut on_evicted_marker: impl FnMut(u64, u64),
    ) -> Result<Option<u64>, TimelineError> {
        let tl = self.timeline(c.device);
        let dur = match work {
            Work::Kernel(ns) => ns.min(MARKER - 1),
            Work::Marker => MARKER,
        };
        let _g = self.lock_timeline(c.device);
        let i = c.index.min(MAX_TIMELINE_CONTEXTS - 1);
        // SAFETY: tl lies inside the mapping; the timeline lock is held, so the copy in
        // force does not change while it is read.
        let (rec, submitted) = unsafe {
            let j = (*tl).commit.load(Ordering::Acquire) as usize & 1;
            (std::ptr::read_volatile(addr_of!((*tl).sched[j].ctx[i])), (*tl).submitted[i].load(Ordering::Acquire))
        };
        if rec.active == 0 || rec.incarnation != c.incarnation {
            return Err(TimelineError::Gone);
        }
        if submitted - rec.completed >= QUEUE_DEPTH {
            return Ok(None);
        }
        let seq = submitted + 1;
        let k = ((seq - 1) % QUEUE_DEPTH) as usize;
        // SAFETY: as above; the entry is free (its item completed).
        unsafe {
            let entry = addr_of_mut!((*tl).rings[i][k]);
            if seq > QUEUE_DEPTH {
                let old = std::ptr::read_volatile(entry);
                if old.dur == MARKER {
                    on_evicted_marker(seq - QUEUE_DEPTH, old.end);
                }
            }
            std::ptr::write_volatile(entry, Item { submit: now_ns(), dur, end: 0 });
            (*tl).submitted[i].store(seq, Ordering::Release);
            let id = &(*tl).identities[c.incarnation as usize % IDENTITIES];
            if id.incarnation.load(Ordering::Acquire) == c.incarnation {
                let counter = if dur == MARKER { &id.markers } else { &id.kernels };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(Some(seq))
    }

    /// Items context `c` has completed by now (the timeline advanced to now).
    pub fn timeline_completed(&self, c: TimelineContext) -> Result<u64, TimelineError> {
        self.with_timeline(c.device, |_, s, _| {
            Self::check(s, c)?;
            Ok(s.ctx[c.index].completed)
        })
    }

    /// Items context `c` has submitted.
    pub fn timeline_submitted(&self, c: TimelineContext) -> u64 {
        let tl = self.timeline(c.device);
        // SAFETY: tl lies inside the mapping.
        unsafe { (*tl).submitted[c.index.min(MAX_TIMELINE_CONTEXTS - 1)].load(Ordering::Acquire) }
    }

    /// Sleeps until context `c` has completed its item `seq` (0: returns at once).
    pub fn timeline_wait(&self, c: TimelineContext, seq: u64) -> Result<(), TimelineError> {
        let tl = self.timeline(c.device);
        loop {
            let wake = self.with_timeline(c.device, |_, s, now| {
                Self::check(s, c)?;
                if s.ctx[c.index].completed >= seq {
                    return Ok(None);
                }
                let mut p = *s;
                let at = self.engine(tl, false).advance(&mut p, u64::MAX, Some((c.index, seq)));
                Ok(Some(at.unwrap_or(u64::MAX).min(now + MAX_NAP_NS)))
            })?;
            match wake {
                None => return Ok(()),
                Some(t) => sleep_until(t),
            }
        }
    }

    /// End time of item `seq` of context `c` if it has completed and its queue entry was
    /// not reused since (see [`SimState::timeline_submit`]).
    pub fn timeline_end(&self, c: TimelineContext, seq: u64) -> Result<Option<u64>, TimelineError> {
        self.with_timeline(c.device, |e, s, _| {
            Self::check(s, c)?;
            let submitted = e.submitted[c.index];
            if seq == 0 || seq > s.ctx[c.index].completed || seq + QUEUE_DEPTH <= submitted {
                return Ok(None);
            }
            Ok(Some(e.item(c.index, seq).end))
        })
    }

    /// Waits for everything context `c` submitted, then frees its record.
    pub fn timeline_close(&self, c: TimelineContext) {
        let last = self.timeline_submitted(c);
        if self.timeline_wait(c, last).is_err() {
            return;
        }
        self.with_timeline(c.device, |_, s, _| {
            if Self::check(s, c).is_ok() {
                s.ctx[c.index].active = 0;
            }
        });
    }
}

// ---- reading the history: ground truth and NVML samples ----

/// Busy time of one context on a device over a window (see [`SimState::device_busy`]).
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

/// What a process submitted to a device's timeline ([`SimState::items_submitted`]).
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

impl UtilisationPeriod {
    /// `busy_ns` as a percent of the period, rounded (NVML's `gpu` and `smUtil`).
    pub fn percent(&self, busy_ns: u64) -> u32 {
        let p = self.period_ns.max(1) as u128;
        ((busy_ns as u128 * 100 + p / 2) / p).min(100) as u32
    }
}

impl SimState {
    /// Every interval that ran on the timeline and overlaps `[from, to)`, clipped, with the
    /// incarnation that ran it: history ring, the open interval and the running kernel.
    fn intervals(&self, e: &Engine, s: &Sched, from: u64, to: u64, mut f: impl FnMut(u32, u64, u64)) {
        let mut emit = |inc: u32, a: u64, b: u64| {
            let (a, b) = (a.max(from), b.min(to));
            if b > a {
                f(inc, a, b);
            }
        };
        let n = s.hist_head.min(HISTORY_LEN);
        let first = s.hist_head - n;
        let at = |k: u64| -> Interval {
            // SAFETY: index reduced modulo HISTORY_LEN; the caller holds the timeline lock.
            unsafe { std::ptr::read_volatile(addr_of!((*e.tl).history[(k % HISTORY_LEN) as usize])) }
        };
        // Entries are in time order: find the first that ends after `from`.
        let (mut lo, mut hi) = (first, s.hist_head);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at(mid).end <= from {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        for k in lo..s.hist_head {
            let iv = at(k);
            if iv.start >= to {
                break;
            }
            emit(iv.incarnation, iv.start, iv.end);
        }
        if s.open_valid != 0 {
            emit(s.open_incarnation, s.open_start, s.open_end);
        }
        if s.running != 0 {
            let i = (s.cur as usize).min(MAX_TIMELINE_CONTEXTS - 1);
            emit(s.ctx[i].incarnation, s.run_start, s.run_end.min(s.sim_time));
        }
    }

    fn identity(&self, tl: *mut DeviceTimeline, incarnation: u32) -> Option<&Identity> {
        // SAFETY: tl lies inside the mapping; index reduced modulo IDENTITIES.
        let id = unsafe { &(*tl).identities[incarnation as usize % IDENTITIES] };
        (id.incarnation.load(Ordering::Acquire) == incarnation).then_some(id)
    }

    /// The PID the samples of an identity carry for the calling process, learning its host
    /// pid now if its process is alive and the caller can see it ([`SimState::sample_pid`]).
    fn identity_reported_pid(&self, id: &Identity) -> u32 {
        self.sample_pid(id.slot.load(Ordering::Acquire) as usize, id.gen.load(Ordering::Acquire), &id.host_pid)
    }

    /// Ground truth: how long each context ran kernels on `device` during `[from_ns,
    /// to_ns)` (`CLOCK_MONOTONIC`, see [`now_ns`]); the window is cut at now. The timeline
    /// is first advanced to now.
    pub fn device_busy(&self, device: usize, from_ns: u64, to_ns: u64) -> BusyWindow {
        let tl = self.timeline(device);
        self.with_timeline(device, |e, s, now| {
            let to = to_ns.min(now);
            let mut per: Vec<(u32, u64)> = Vec::new();
            let mut total = 0u64;
            self.intervals(e, s, from_ns, to, |inc, a, b| {
                total += b - a;
                match per.iter_mut().find(|p| p.0 == inc) {
                    Some(p) => p.1 += b - a,
                    None => per.push((inc, b - a)),
                }
            });
            let contexts = per
                .into_iter()
                .map(|(inc, busy)| match self.identity(tl, inc) {
                    Some(id) => ContextBusy {
                        pid: id.pid.load(Ordering::Acquire),
                        host_pid: {
                            // Learns the host pid where it can (see identity_reported_pid).
                            self.identity_reported_pid(id);
                            id.host_pid.load(Ordering::Acquire)
                        },
                        slot: id.slot.load(Ordering::Acquire) as usize,
                        context: id.context.load(Ordering::Acquire),
                        incarnation: inc,
                        busy_ns: busy,
                    },
                    None => ContextBusy { pid: 0, host_pid: 0, slot: 0, context: 0, incarnation: inc, busy_ns: busy },
                })
                .collect();
            BusyWindow { device, from_ns, to_ns: to.max(from_ns), complete: from_ns >= s.hist_floor, device_busy_ns: total, contexts }
        })
    }

    /// Ground truth: the kernels and event markers that the contexts of the process with
    /// this pid (in its own namespace) submitted to `device`'s timeline, in all, as far as
    /// the last [`IDENTITIES`] contexts of the device reach back.
    pub fn items_submitted(&self, device: usize, pid: u32) -> Submitted {
        let tl = self.timeline(device);
        let _g = self.lock_timeline(device);
        let mut out = Submitted::default();
        for k in 0..IDENTITIES {
            // SAFETY: tl lies inside the mapping; k < IDENTITIES; the timeline lock is held.
            let id = unsafe { &(*tl).identities[k] };
            if id.incarnation.load(Ordering::Acquire) != 0 && id.pid.load(Ordering::Acquire) == pid {
                out.kernels += id.kernels.load(Ordering::Relaxed);
                out.markers += id.markers.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// Converts a timeline time to NVML's CPU timestamp (microseconds since the epoch).
    pub fn timestamp_us(&self, mono_ns: u64) -> u64 {
        let t = mono_ns as i128 + self.header().realtime_offset_ns as i128;
        (t.max(0) / 1000) as u64
    }

    /// NVML's sample buffer: every completed sample period of `device` that is still
    /// retained ([`SAMPLE_RETENTION_PERIODS`]) and whose timestamp is after `after_us`
    /// (microseconds since the epoch; 0 for all), oldest first. Under
    /// `FGPU_SIM_LATE_DELIVERY` ([`Delivery`]) only the periods this process has been told
    /// of by now.
    pub fn utilisation_periods(&self, device: usize, after_us: u64) -> Vec<UtilisationPeriod> {
        self.utilisation_periods_as_seen(device, after_us, Delivery::of_this_process().ok().flatten())
    }

    /// [`SimState::utilisation_periods`] as a process with `delivery` sees them (`None`:
    /// every completed period).
    pub fn utilisation_periods_as_seen(&self, device: usize, after_us: u64, delivery: Option<Delivery>) -> Vec<UtilisationPeriod> {
        let tl = self.timeline(device);
        self.with_timeline(device, |e, s, now| {
            let p = self.sample_period_ns();
            let horizon = delivery.map_or(now, |d| d.seen_until(now));
            let last_end = horizon / p * p;
            let mut first_start = last_end.saturating_sub(SAMPLE_RETENTION_PERIODS * p);
            first_start = first_start.max(s.hist_floor.div_ceil(p) * p);
            while first_start < last_end && self.timestamp_us(first_start + p) <= after_us {
                first_start += p;
            }
            if first_start >= last_end {
                return Vec::new();
            }
            let n = ((last_end - first_start) / p) as usize;
            let mut busy: Vec<Vec<(u32, u64)>> = vec![Vec::new(); n];
            self.intervals(e, s, first_start, last_end, |inc, a, b| {
                let mut t = a;
                while t < b {
                    let k = ((t - first_start) / p) as usize;
                    let cut = (first_start + (k as u64 + 1) * p).min(b);
                    match busy[k].iter_mut().find(|x| x.0 == inc) {
                        Some(x) => x.1 += cut - t,
                        None => busy[k].push((inc, cut - t)),
                    }
                    t = cut;
                }
            });
            busy.into_iter()
                .enumerate()
                .map(|(k, per)| {
                    let end_ns = first_start + (k as u64 + 1) * p;
                    let mut processes: Vec<(u32, u64)> = Vec::new();
                    let mut device_busy_ns = 0;
                    for (inc, ns) in per {
                        device_busy_ns += ns;
                        let pid = self.identity(tl, inc).map(|id| self.identity_reported_pid(id)).unwrap_or(0);
                        match processes.iter_mut().find(|x| x.0 == pid) {
                            Some(x) => x.1 += ns,
                            None => processes.push((pid, ns)),
                        }
                    }
                    UtilisationPeriod { end_ns, period_ns: p, timestamp_us: self.timestamp_us(end_ns), device_busy_ns, processes }
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests;
