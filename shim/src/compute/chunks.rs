//! Chunks of launches, the markers that bound them, and what the process has in flight.
//!
//! A chunk belongs to one thread and one stream (and one kind of launch: kernels or
//! graphs). Its first launch is admitted here, in [`admit_slow`]: it waits until the
//! ledger's bucket holds a chunk's worth of GPU time and the process's admitted work that
//! has not completed is under `INFLIGHT_GPU_NS`, then charges the chunk's estimated cost
//! and records a marker (an event) on the stream before the launch. The next chunk's
//! marker on that stream ends it. The launches in between cost the thread a few loads and
//! stores on its own data ([`admit_fast`]).
//!
//! When a chunk's end marker completes (`cuEventQuery`), its work is done; the time between
//! its two markers (`cuEventElapsedTime`) is how long the GPU took for it, which includes
//! other contexts' time slices when the GPU is shared: an upper bound of its own time.
//! That bound sizes the next chunks (`CostEstimate`), and is what is charged when NVML
//! cannot measure the process (see `sampler.rs`).
//!
//! A chunk can end without a usable marker: the thread exited, its context was destroyed,
//! its stream was being captured into a graph, or the thread stopped launching without
//! synchronising (the chunk is then ended "late" at its next launch, and its time includes
//! the idle wait, so it is not used as a measure). Such chunks are settled by time.

use crate::driver::instance::driver;
use crate::driver::seam::{relaxed, Capture, CudaDriver, EventState};
use super::{DevShare, Limiter};
use crate::abi::cuda::*;
use fgpu_core::compute::{admit_at, admit_threshold, chunk_launches, inflight_allows, tokens, CostEstimate};
use fgpu_core::log::monotonic_ns;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

/// What a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Unit {
    /// One kernel (`cuLaunchKernel` and its kin).
    Kernel = 0,
    /// A whole graph (`cuGraphLaunch`): its cost is estimated apart from single kernels.
    Graph = 1,
}

/// Cost assumed for a chunk's launch before anything was measured (the first chunk holds
/// one launch; its marker measures it).
const FIRST_GUESS_NS: u64 = 1_000_000;
/// An open chunk with no launch for this long is ended at its next launch, as "late".
const IDLE_NS: u64 = 20_000_000;
/// A late chunk still open this long after is given up on: settled by time.
const ABANDON_NS: u64 = 2_000_000_000;
/// Longest single nap while waiting for the share or for work in flight.
const MAX_NAP_NS: u64 = 2_000_000;
/// Nap while waiting for work in flight to complete.
const INFLIGHT_NAP_NS: u64 = 200_000;

/// A context the limiter has made markers in.
pub struct CtxRec {
    pub handle: usize,
    pub ordinal: CUdevice,
    /// Destroyed (or released): its markers are never touched again.
    pub gone: AtomicBool,
}

/// One event of the limiter's, recorded on a stream of the program.
pub struct Marker {
    event: usize,
    ctx: Arc<CtxRec>,
}

impl Marker {
    fn event(&self) -> CUevent {
        self.event as CUevent
    }

    fn usable(&self) -> bool {
        !self.ctx.gone.load(Ordering::Acquire)
    }

    fn query(&self) -> EventState {
        if self.usable() { driver().event_query(self.event()) } else { EventState::Failed }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        if self.usable() {
            driver().event_destroy(self.event());
        }
    }
}

// SAFETY: an event handle is an opaque token the driver accepts from any thread.
unsafe impl Send for Marker {}
// SAFETY: as above; it is never dereferenced by fgpu.
unsafe impl Sync for Marker {}

/// [`ChunkShared::revoked`]: the chunk sat idle (its time would include the wait).
const REVOKED_IDLE: u8 = 1;
/// [`ChunkShared::revoked`]: the ledger is overdrawn; the rest of the chunk's credit must
/// wait for the share like a new chunk.
const REVOKED_OVERDRAWN: u8 = 2;

/// What the owning thread and the sampler both see of an open chunk.
#[derive(Default)]
pub struct ChunkShared {
    /// Set by the sampler (`REVOKED_*` bits): the next launch must end this chunk.
    revoked: AtomicU8,
    /// Set when the owning thread exits with the chunk open.
    orphaned: AtomicBool,
    /// Launches so far (the owner's count, published for idle detection).
    launches: AtomicU32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Ended by its end marker (if any) at `at`; `late`: it sat idle before it ended.
    Closed { at: u64, late: bool },
    /// Its work completed; seen at `at`. `busy`: the time between its markers, if usable.
    Done { at: u64, busy: Option<u64> },
    /// No marker can tell when its work completed; given up on at `at`.
    Orphan { at: u64 },
}

/// A chunk as the process-wide registry keeps it until it is settled.
pub struct ChunkRec {
    shared: Arc<ChunkShared>,
    ordinal: CUdevice,
    unit: Unit,
    /// The estimate charged when it was admitted.
    provisional: u64,
    start: Option<Arc<Marker>>,
    end: Option<Arc<Marker>>,
    launches: u32,
    state: State,
    seen_launches: u32,
    seen_at: u64,
}

/// Per device: the cost estimates and the measurement by NVML (`sampler.rs`).
pub struct DevBook {
    est: [CostEstimate; 2],
    pub nvml: Option<super::sampler::NvmlState>,
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
    fn calibrate(&mut self) {
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
    fn estimate(&self, unit: Unit) -> u64 {
        (self.est[unit as usize].get() as f64 * self.calibration) as u64
    }
}

/// Everything the limiter knows of the process's chunks, under one lock.
#[derive(Default)]
pub struct Registry {
    chunks: Vec<ChunkRec>,
    contexts: HashMap<usize, Arc<CtxRec>>,
    pub books: HashMap<CUdevice, DevBook>,
    /// Markers of threads that exited, destroyed by the sampler rather than in a thread's
    /// exit path.
    pub deferred: Vec<Arc<Marker>>,
}

/// What settling found, for the caller to charge (outside the registry's lock).
#[derive(Default)]
pub struct Settled {
    /// (device, GPU time to charge (negative: refund), GPU time measured to record).
    pub charges: Vec<(CUdevice, i64, i64)>,
}

impl Registry {
    pub fn book(&mut self, ordinal: CUdevice) -> &mut DevBook {
        self.books.entry(ordinal).or_default()
    }

    fn context(&mut self, handle: usize, ordinal: CUdevice) -> Arc<CtxRec> {
        self.contexts.entry(handle).or_insert_with(|| Arc::new(CtxRec { handle, ordinal, gone: AtomicBool::new(false) })).clone()
    }

    /// Marks contexts gone (before the driver destroys them) and forgets them.
    pub fn context_gone(&mut self, which: impl Fn(&CtxRec) -> bool) {
        self.contexts.retain(|_, c| {
            if which(c) {
                c.gone.store(true, Ordering::Release);
                false
            } else {
                true
            }
        });
    }

    /// Estimated GPU time of the chunks on `ordinal` whose work may not have completed.
    fn inflight(&self, ordinal: CUdevice) -> u64 {
        self.chunks
            .iter()
            .filter(|c| c.ordinal == ordinal && matches!(c.state, State::Open | State::Closed { .. }))
            .map(|c| c.provisional)
            .sum()
    }

    /// Ends every open chunk of `ordinal` at its next launch: the ledger is overdrawn, so
    /// the rest of their credit waits for the share like a new chunk (what they did not use
    /// is given back when they end).
    pub fn revoke_open(&self, ordinal: CUdevice) {
        for c in self.chunks.iter().filter(|c| c.ordinal == ordinal && c.state == State::Open) {
            c.shared.revoked.fetch_or(REVOKED_OVERDRAWN, Ordering::Release);
        }
    }

    fn estimate(&mut self, ordinal: CUdevice, unit: Unit) -> u64 {
        self.book(ordinal).estimate(unit)
    }

    /// Looks at every chunk: open ones that sit idle are revoked, ended ones whose marker
    /// completed are measured, and those whose work is fully accounted for are settled.
    /// `covered(ordinal)` is the CLOCK_MONOTONIC time up to which NVML has measured the
    /// device for this process (`None`: NVML does not measure it; events do).
    pub fn settle(&mut self, now: u64, covered: impl Fn(CUdevice) -> Option<u64>) -> Settled {
        let mut settled = Settled::default();
        let mut keep = Vec::with_capacity(self.chunks.len());
        for mut c in std::mem::take(&mut self.chunks) {
            if c.state == State::Open {
                let launches = c.shared.launches.load(Ordering::Relaxed);
                if c.shared.orphaned.load(Ordering::Acquire) {
                    c.state = State::Orphan { at: now };
                } else if launches != c.seen_launches {
                    (c.seen_launches, c.seen_at) = (launches, now);
                } else if now.saturating_sub(c.seen_at) >= ABANDON_NS {
                    c.state = State::Orphan { at: now };
                } else if now.saturating_sub(c.seen_at) >= IDLE_NS {
                    c.shared.revoked.fetch_or(REVOKED_IDLE, Ordering::Release);
                }
            }
            if let State::Closed { late, .. } = c.state {
                match c.end.as_ref().map(|m| m.query()) {
                    Some(EventState::Pending) => {}
                    Some(EventState::Done) => {
                        // How long the GPU took between the chunk's markers; not for a
                        // chunk that sat idle (the wait would be in it).
                        let busy = match (&c.start, &c.end) {
                            (Some(s), Some(e)) if !late && s.usable() => driver().event_elapsed_ns(s.event(), e.event()),
                            _ => None,
                        };
                        if let Some(busy) = busy {
                            self.books.entry(c.ordinal).or_default().est[c.unit as usize].add(busy, c.launches);
                        }
                        c.state = State::Done { at: now, busy };
                    }
                    Some(EventState::Failed) | None => c.state = State::Orphan { at: now },
                }
            }
            match (c.state, covered(c.ordinal)) {
                // NVML measures the process: the estimate is refunded once NVML has answered
                // for the time the work was seen done by (orphans: a while after they were
                // given up); NVML's own figures are charged by the sampler.
                (State::Done { at, .. }, Some(covered)) if covered >= at => {
                    self.books.entry(c.ordinal).or_default().refunded_since += c.provisional;
                    settled.charges.push((c.ordinal, -(c.provisional as i64), 0));
                }
                (State::Orphan { at }, Some(covered)) if covered >= at + ABANDON_NS / 2 => settled.charges.push((c.ordinal, -(c.provisional as i64), 0)),
                // Events measure it: the time between the chunk's markers replaces the
                // estimate; without that, the estimate stands.
                (State::Done { busy, .. }, None) => {
                    let busy = busy.unwrap_or(c.provisional);
                    settled.charges.push((c.ordinal, busy as i64 - c.provisional as i64, busy as i64));
                }
                (State::Orphan { .. }, None) => settled.charges.push((c.ordinal, 0, c.provisional as i64)),
                _ => keep.push(c),
            }
        }
        self.chunks = keep;
        for book in self.books.values_mut() {
            book.calibrate();
        }
        settled
    }
}

/// Applies what [`Registry::settle`] found to the ledger.
pub fn apply(limiter: &Limiter, settled: Settled, now: u64) {
    for (ordinal, charge, measured) in settled.charges {
        if let Some(dev) = limiter.known(ordinal) {
            dev.charge(limiter, charge, now);
            if measured != 0 {
                limiter.account.ledger.compute_record(limiter.slot, dev.id, measured, now);
            }
        }
    }
}

/// Settles the registry now and applies it; the sampler and waiting launches call this.
pub fn settle_now(limiter: &Limiter) {
    let now = monotonic_ns();
    let settled = relaxed(driver(), || {
        let mut registry = limiter.registry.lock();
        let covered: Vec<(CUdevice, Option<u64>)> = registry.books.iter().map(|(o, b)| (*o, b.nvml.as_ref().and_then(|n| n.covered_mono()))).collect();
        registry.settle(now, |o| covered.iter().find(|c| c.0 == o).and_then(|c| c.1))
    });
    apply(limiter, settled, now);
}

/// A thread's chunk on one stream.
struct Entry {
    stream: usize,
    ptsz: bool,
    unit: Unit,
    /// Launches left in the open chunk (0: none open).
    credit: u32,
    launches: u32,
    ordinal: CUdevice,
    chunk: Option<Arc<ChunkShared>>,
    /// The marker that ended the last chunk on this stream (the next one may start there).
    last_end: Option<Arc<Marker>>,
    generation: u32,
}

const EMPTY: usize = usize::MAX;
const ENTRIES: usize = 4;

/// A thread's chunks, most recently used first.
struct Local {
    entries: [Entry; ENTRIES],
}

impl Drop for Local {
    fn drop(&mut self) {
        // No driver call on a thread's way out: open chunks become orphans, and markers
        // are handed to the sampler to destroy.
        let mut deferred = Vec::new();
        for e in &mut self.entries {
            if let Some(chunk) = e.chunk.take() {
                chunk.orphaned.store(true, Ordering::Release);
            }
            deferred.extend(e.last_end.take());
        }
        if deferred.is_empty() {
            return;
        }
        if let Some(limiter) = super::existing() {
            if let Some(mut registry) = limiter.registry.try_lock() {
                registry.deferred.extend(deferred);
                return;
            }
        }
        // No limiter or a busy one: leak the few events rather than call the driver here.
        std::mem::forget(deferred);
    }
}

const fn empty_entry() -> Entry {
    Entry { stream: EMPTY, ptsz: false, unit: Unit::Kernel, credit: 0, launches: 0, ordinal: -1, chunk: None, last_end: None, generation: 0 }
}

thread_local! {
    static LOCAL: UnsafeCell<Local> = const { UnsafeCell::new(Local { entries: [empty_entry(), empty_entry(), empty_entry(), empty_entry()] }) };
}

/// Runs `f` on the calling thread's chunks. Never re-entered: nothing called inside goes
/// back through a launch hook.
fn with_local<R>(f: impl FnOnce(&mut Local) -> R) -> Option<R> {
    LOCAL
        .try_with(|cell| {
            // SAFETY: the cell is this thread's own and `with_local` is never re-entered on
            // one thread (see above), so this is the only reference to it.
            f(unsafe { &mut *cell.get() })
        })
        .ok()
}

/// The launch's chunk has credit: count it, nothing else.
#[inline(always)]
pub fn admit_fast(stream: CUstream, ptsz: bool, unit: Unit) -> bool {
    with_local(|local| {
        let e = &mut local.entries[0];
        if e.credit == 0 || e.stream != stream as usize || e.ptsz != ptsz || e.unit != unit {
            return false;
        }
        if let Some(chunk) = &e.chunk {
            if chunk.revoked.load(Ordering::Relaxed) != 0 {
                return false;
            }
            chunk.launches.store(e.launches + 1, Ordering::Relaxed);
        }
        e.credit -= 1;
        e.launches += 1;
        true
    })
    .unwrap_or(false)
}

/// Everything but the fast path: another stream's chunk, a chunk's first launch (waiting
/// for the share), a device without a share.
pub fn admit_slow(limiter: &'static Limiter, stream: CUstream, ptsz: bool, unit: Unit) {
    let generation = limiter.generation;
    let admitted = with_local(|local| {
        // Another of this thread's chunks with credit: bring it to the front.
        if let Some(i) = local.entries.iter().position(|e| e.stream == stream as usize && e.ptsz == ptsz && e.unit == unit && e.generation == generation) {
            local.entries[..=i].rotate_right(1);
            let e = &mut local.entries[0];
            let revoked = e.chunk.as_ref().map_or(0, |c| c.revoked.load(Ordering::Acquire));
            if e.credit > 0 && revoked == 0 {
                e.credit -= 1;
                e.launches += 1;
                if let Some(chunk) = &e.chunk {
                    chunk.launches.store(e.launches, Ordering::Relaxed);
                }
                return true;
            }
            close(limiter, e, revoked & REVOKED_IDLE != 0);
        } else {
            // A new stream: it takes the least recently used place.
            local.entries.rotate_right(1);
            let old = std::mem::replace(&mut local.entries[0], empty_entry());
            retire(limiter, old);
            let e = &mut local.entries[0];
            (e.stream, e.ptsz, e.unit, e.generation) = (stream as usize, ptsz, unit, generation);
        }
        false
    })
    .unwrap_or(false);
    if admitted {
        return;
    }
    let Ok(dev) = limiter.account.current_device() else { return };
    let Some(share) = limiter.device(dev) else {
        // No share on this device: a chunk without end.
        let _ = with_local(|local| {
            let e = &mut local.entries[0];
            (e.credit, e.ordinal) = (u32::MAX, dev.ordinal);
        });
        return;
    };
    let markers = match relaxed(driver(), || driver().stream_capturing(stream, ptsz)) {
        // Captured into a graph, not run: nothing to admit (the graph's launches are).
        Capture::Yes => return,
        Capture::No => true,
        // The driver cannot say: the launch may run, so it waits for the share like any
        // other; a marker might become part of a capture (or invalidate it), so none is
        // recorded, and the chunk is settled by time.
        Capture::Unknown => false,
    };
    limiter.start_sampler();
    let (launches, provisional) = wait_for_share(limiter, share, unit);
    open(limiter, share, stream, ptsz, unit, launches, provisional, markers);
}

/// Waits until the device's buckets hold a chunk's worth and the work in flight allows
/// one more chunk; returns the chunk's launches and its estimated cost, already charged.
fn wait_for_share(limiter: &Limiter, share: &DevShare, unit: Unit) -> (u32, u64) {
    let began = monotonic_ns();
    let mut waited = false;
    loop {
        settle_now(limiter);
        let now = monotonic_ns();
        let (inflight, est) = {
            let mut registry = limiter.registry.lock();
            (registry.inflight(share.ordinal), registry.estimate(share.ordinal, unit))
        };
        // The bucket that holds least decides the chunk.
        let mut ready_at = now;
        let mut least = u64::MAX;
        for (rate, clock) in share.buckets(limiter) {
            let threshold = admit_threshold(rate);
            let held = tokens(clock, now, rate);
            least = least.min(held);
            if held < threshold {
                ready_at = ready_at.max(admit_at(clock, threshold, rate));
            }
        }
        let launches = chunk_launches(est, least);
        let provisional = launches as u64 * if est == 0 { FIRST_GUESS_NS } else { est };
        let fits = inflight_allows(inflight, provisional);
        // The buckets are tested again as they are charged: another process of the ledger
        // may have taken what this one saw.
        if ready_at <= now && fits && share.admit(limiter, provisional, now) {
            if waited {
                limiter.account.ledger.compute_waited(share.id, now.saturating_sub(began));
            }
            return (launches, provisional);
        }
        waited = true;
        let nap = if !fits { INFLIGHT_NAP_NS } else { ready_at.saturating_sub(now).clamp(50_000, MAX_NAP_NS) };
        std::thread::sleep(std::time::Duration::from_nanos(nap));
    }
}

/// Opens a chunk of `launches` (this launch the first) on the thread's front entry, with a
/// start marker unless `markers` is false (the stream's capture state is unknown).
#[allow(clippy::too_many_arguments)]
fn open(limiter: &Limiter, share: &DevShare, stream: CUstream, ptsz: bool, unit: Unit, launches: u32, provisional: u64, markers: bool) {
    let now = monotonic_ns();
    let shared = Arc::new(ChunkShared::default());
    shared.launches.store(1, Ordering::Relaxed);
    let previous = with_local(|local| local.entries[0].last_end.take()).flatten();
    let start = if markers { relaxed(driver(), || start_marker(limiter, share.ordinal, stream, ptsz, previous)) } else { None };
    limiter.registry.lock().chunks.push(ChunkRec {
        shared: shared.clone(),
        ordinal: share.ordinal,
        unit,
        provisional,
        start,
        end: None,
        launches: 1,
        state: State::Open,
        seen_launches: 1,
        seen_at: now,
    });
    let _ = with_local(|local| {
        let e = &mut local.entries[0];
        (e.credit, e.launches, e.ordinal, e.chunk) = (launches - 1, 1, share.ordinal, Some(shared));
    });
}

/// The marker a new chunk starts at: the last chunk's end marker while it is still
/// pending (the new work queues behind it), else a new marker recorded now.
fn start_marker(limiter: &Limiter, ordinal: CUdevice, stream: CUstream, ptsz: bool, previous: Option<Arc<Marker>>) -> Option<Arc<Marker>> {
    let ctx = driver().current_context()?;
    if let Some(marker) = previous {
        if marker.ctx.handle == ctx as usize && marker.query() == EventState::Pending {
            return Some(marker);
        }
    }
    record_marker(limiter, ordinal, ctx, stream, ptsz)
}

fn record_marker(limiter: &Limiter, ordinal: CUdevice, ctx: CUcontext, stream: CUstream, ptsz: bool) -> Option<Arc<Marker>> {
    let ctx_rec = limiter.registry.lock().context(ctx as usize, ordinal);
    let event = driver().event_create()?;
    let marker = Arc::new(Marker { event: event as usize, ctx: ctx_rec });
    driver().event_record(event, stream, ptsz).then_some(marker)
}

/// Ends the open chunk of `e` (if any) with a marker on its stream; `late` when it sat idle
/// before this.
fn close(limiter: &Limiter, e: &mut Entry, late: bool) {
    let credit = std::mem::take(&mut e.credit);
    let Some(shared) = e.chunk.take() else { return };
    let end = if shared.orphaned.load(Ordering::Acquire) {
        None
    } else {
        relaxed(driver(), || {
            let stream = e.stream as CUstream;
            let ctx = driver().current_context()?;
            // Captured, or unknown (an error): no marker.
            if driver().stream_capturing(stream, e.ptsz) != Capture::No {
                return None;
            }
            record_marker(limiter, e.ordinal, ctx, stream, e.ptsz)
        })
    };
    let now = monotonic_ns();
    let mut registry = limiter.registry.lock();
    let mut unused = 0;
    if let Some(rec) = registry.chunks.iter_mut().find(|c| Arc::ptr_eq(&c.shared, &shared)) {
        if rec.state == State::Open {
            let same_context = match (&rec.start, &end) {
                (Some(s), Some(m)) => Arc::ptr_eq(&s.ctx, &m.ctx),
                _ => true,
            };
            rec.end = end.clone().filter(|_| same_context);
            rec.launches = e.launches;
            rec.state = State::Closed { at: now, late };
            // A chunk ended early (a synchronisation, another stream) ran fewer launches
            // than it was charged for: what it did not use goes back now, so the estimate
            // refunded later is what ran (and the calibration compares like with like).
            let granted = e.launches as u64 + credit as u64;
            if credit > 0 && granted > 0 {
                unused = (rec.provisional as u128 * credit as u128 / granted as u128) as u64;
                rec.provisional -= unused;
            }
        }
    }
    drop(registry);
    if unused > 0 {
        if let Some(share) = limiter.known(e.ordinal) {
            share.charge(limiter, -(unused as i64), now);
        }
    }
    e.last_end = end;
    e.launches = 0;
}

/// An entry leaving the thread's table: its open chunk ends here.
fn retire(limiter: &Limiter, mut old: Entry) {
    if old.stream != EMPTY && old.chunk.is_some() {
        close(limiter, &mut old, false);
    }
}

/// The calling thread's chunks end before a synchronisation of `stream` (all of them when
/// `None`).
pub fn close_for_sync(limiter: &Limiter, stream: Option<(CUstream, bool)>) {
    let generation = limiter.generation;
    let _ = with_local(|local| {
        for e in local.entries.iter_mut() {
            let matches = match stream {
                Some((s, ptsz)) => e.stream == s as usize && e.ptsz == ptsz,
                None => true,
            };
            if matches && e.chunk.is_some() && e.generation == generation {
                close(limiter, e, false);
            }
        }
    });
}
