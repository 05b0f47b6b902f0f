//! The chunks of launches the process has in flight, the markers that bound them, and
//! their settlement.
//!
//! A chunk belongs to one thread and one stream (and one kind of launch: kernels or
//! graphs); the thread's side of it is `local.rs`. Its first launch is admitted there: it
//! waits until the ledger's bucket holds a chunk's worth of GPU time and the process's
//! admitted work that has not completed is under `INFLIGHT_GPU_NS`, then charges the
//! chunk's estimated cost and records a marker (an event) on the stream before the launch.
//! The next chunk's marker on that stream ends it.
//!
//! When a chunk's end marker completes (`cuEventQuery`), its work is done; the time between
//! its two markers (`cuEventElapsedTime`) is how long the GPU took for it, which includes
//! other contexts' time slices when the GPU is shared: an upper bound of its own time.
//! That bound sizes the next chunks (`book.rs`), and is what is charged when NVML cannot
//! measure the process (see `sampler.rs`).
//!
//! A chunk can end without a usable marker: the thread exited, its context was destroyed,
//! its stream was being captured into a graph, or the thread stopped launching without
//! synchronising (the chunk is then ended "late" at its next launch, and its time includes
//! the idle wait, so it is not used as a measure). Such chunks are settled by time.
//!
//! **Where events alone measure** (a MIG device, on which NVML gives no per-process
//! samples), a late chunk is charged the time between its markers, idle wait included (an
//! upper bound of its work), and a chunk that ended without a marker its estimate. A chunk
//! whose time nothing measured, on a device where no launch of its kind has been measured
//! either, means this process's work there cannot be measured at all: settling reports the
//! device ([`Settled::unmeasurable`]), and the limiter refuses its launches from then on
//! rather than run them past the share.

use super::book::{DevBook, Unit};
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::{CudaDriver, EventState};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

/// An open chunk with no launch for this long is ended at its next launch, as "late".
const IDLE_NS: u64 = 20_000_000;
/// A late chunk still open this long after is given up on: settled by time.
const ABANDON_NS: u64 = 2_000_000_000;
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
    pub(super) ctx: Arc<CtxRec>,
}

impl Marker {
    /// A marker of the limiter's: `event`, created in the context `ctx`.
    pub fn new(event: CUevent, ctx: Arc<CtxRec>) -> Marker {
        Marker { event: event as usize, ctx }
    }

    fn event(&self) -> CUevent {
        self.event as CUevent
    }

    fn usable(&self) -> bool {
        !self.ctx.gone.load(Ordering::Acquire)
    }

    pub fn query(&self) -> EventState {
        if self.usable() {
            driver().event_query(self.event())
        } else {
            EventState::Failed
        }
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
pub const REVOKED_IDLE: u8 = 1;
/// [`ChunkShared::revoked`]: the ledger is overdrawn; the rest of the chunk's credit must
/// wait for the share like a new chunk.
pub const REVOKED_OVERDRAWN: u8 = 2;

/// What the owning thread and the sampler both see of an open chunk.
#[derive(Default)]
pub struct ChunkShared {
    /// Set by the sampler (`REVOKED_*` bits): the next launch must end this chunk.
    pub revoked: AtomicU8,
    /// Set when the owning thread exits with the chunk open.
    pub orphaned: AtomicBool,
    /// Launches so far (the owner's count, published for idle detection).
    pub launches: AtomicU32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Ended by its end marker (if any) at `at`; `late`: it sat idle before it ended.
    Closed {
        at: u64,
        late: bool,
    },
    /// Its work completed; seen at `at`. `busy`: the time between its markers, if usable
    /// as a measure; `bound`: that time even when it includes an idle wait (an upper bound).
    Done {
        at: u64,
        busy: Option<u64>,
        bound: Option<u64>,
    },
    /// No marker can tell when its work completed; given up on at `at`. `unmarked`: it was
    /// ended by its thread without an end marker (none could be recorded), rather than
    /// left behind by a thread that exited, a context destroyed or a long idle.
    Orphan {
        at: u64,
        unmarked: bool,
    },
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
    /// Devices measured by events alone where a chunk's time could not be measured and
    /// nothing was measured before it: this process's work there cannot be measured.
    pub unmeasurable: Vec<CUdevice>,
}

impl Registry {
    pub fn book(&mut self, ordinal: CUdevice) -> &mut DevBook {
        self.books.entry(ordinal).or_default()
    }

    pub fn context(&mut self, handle: usize, ordinal: CUdevice) -> Arc<CtxRec> {
        self.contexts.entry(handle).or_insert_with(|| Arc::new(CtxRec { handle, ordinal, gone: AtomicBool::new(false) })).clone()
    }

    /// Records a chunk just admitted: `provisional` charged for it, its first launch run,
    /// starting at `start` (if it has a start marker).
    pub fn opened(&mut self, shared: Arc<ChunkShared>, ordinal: CUdevice, unit: Unit, provisional: u64, start: Option<Arc<Marker>>, now: u64) {
        self.chunks.push(ChunkRec { shared, ordinal, unit, provisional, start, end: None, launches: 1, state: State::Open, seen_launches: 1, seen_at: now });
    }

    /// The chunk of `shared` ended at `end` (if it has an end marker) after `launches`,
    /// with `credit` launches it was charged for left unused (`late`: it sat idle first).
    /// Returns the part of its estimate those unused launches stand for, taken off it, for
    /// the caller to refund.
    pub fn ended(&mut self, shared: &Arc<ChunkShared>, end: Option<Arc<Marker>>, launches: u32, credit: u32, late: bool, now: u64) -> u64 {
        let Some(rec) = self.chunks.iter_mut().find(|c| Arc::ptr_eq(&c.shared, shared)) else { return 0 };
        if rec.state != State::Open {
            return 0;
        }
        let same_context = match (&rec.start, &end) {
            (Some(s), Some(m)) => Arc::ptr_eq(&s.ctx, &m.ctx),
            _ => true,
        };
        rec.end = end.filter(|_| same_context);
        rec.launches = launches;
        rec.state = State::Closed { at: now, late };
        // A chunk ended early (a synchronisation, another stream) ran fewer launches than it
        // was charged for: what it did not use goes back now, so the estimate refunded
        // later is what ran (and the calibration compares like with like).
        let granted = launches as u64 + credit as u64;
        if credit == 0 || granted == 0 {
            return 0;
        }
        let unused = (rec.provisional as u128 * credit as u128 / granted as u128) as u64;
        rec.provisional -= unused;
        unused
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
    pub fn inflight(&self, ordinal: CUdevice) -> u64 {
        self.chunks.iter().filter(|c| c.ordinal == ordinal && matches!(c.state, State::Open | State::Closed { .. })).map(|c| c.provisional).sum()
    }

    /// Whether a chunk of `ordinal` has ended and its end marker has not completed yet.
    pub fn awaiting_marker(&self, ordinal: CUdevice) -> bool {
        self.chunks.iter().any(|c| c.ordinal == ordinal && matches!(c.state, State::Closed { .. }))
    }

    /// Ends every open chunk of `ordinal` at its next launch: the ledger is overdrawn, so
    /// the rest of their credit waits for the share like a new chunk (what they did not use
    /// is given back when they end).
    pub fn revoke_open(&self, ordinal: CUdevice) {
        for c in self.chunks.iter().filter(|c| c.ordinal == ordinal && c.state == State::Open) {
            c.shared.revoked.fetch_or(REVOKED_OVERDRAWN, Ordering::Release);
        }
    }

    pub fn estimate(&mut self, ordinal: CUdevice, unit: Unit) -> u64 {
        self.book(ordinal).estimate(unit)
    }

    /// Looks at every chunk: open ones that sit idle are revoked, ended ones whose marker
    /// completed are measured, and those whose work is fully accounted for are settled.
    /// `covered(ordinal)` is the CLOCK_MONOTONIC time up to which NVML has measured the
    /// device for this process (`None`: NVML does not measure it; events do, for good where
    /// its book says so, `DevBook::by_events`).
    pub fn settle(&mut self, now: u64, covered: impl Fn(CUdevice) -> Option<u64>) -> Settled {
        let mut settled = Settled::default();
        let mut keep = Vec::with_capacity(self.chunks.len());
        for mut c in std::mem::take(&mut self.chunks) {
            if c.state == State::Open {
                let launches = c.shared.launches.load(Ordering::Relaxed);
                if c.shared.orphaned.load(Ordering::Acquire) {
                    c.state = State::Orphan { at: now, unmarked: false };
                } else if launches != c.seen_launches {
                    (c.seen_launches, c.seen_at) = (launches, now);
                } else if now.saturating_sub(c.seen_at) >= ABANDON_NS {
                    c.state = State::Orphan { at: now, unmarked: false };
                } else if now.saturating_sub(c.seen_at) >= IDLE_NS {
                    c.shared.revoked.fetch_or(REVOKED_IDLE, Ordering::Release);
                }
            }
            if let State::Closed { late, .. } = c.state {
                match c.end.as_ref().map(|m| m.query()) {
                    Some(EventState::Pending) => {}
                    Some(EventState::Done) => {
                        // How long the GPU took between the chunk's markers: a measure of
                        // its work, unless it sat idle (the wait would be in it: then only
                        // an upper bound).
                        let elapsed = match (&c.start, &c.end) {
                            (Some(s), Some(e)) if s.usable() => driver().event_elapsed_ns(s.event(), e.event()),
                            _ => None,
                        };
                        let busy = elapsed.filter(|_| !late);
                        if let Some(busy) = busy {
                            self.books.entry(c.ordinal).or_default().measured(c.unit, busy, c.launches);
                        }
                        c.state = State::Done { at: now, busy, bound: elapsed };
                    }
                    Some(EventState::Failed) | None => c.state = State::Orphan { at: now, unmarked: true },
                }
            }
            match (c.state, covered(c.ordinal)) {
                // NVML measures the process: the estimate is refunded once NVML has answered
                // for the time the work was seen done by (orphans: a while after they were
                // given up); NVML's own figures are charged by the sampler.
                (State::Done { at, .. }, Some(covered)) if covered >= at => {
                    self.books.entry(c.ordinal).or_default().refunded(c.provisional);
                    settled.charges.push((c.ordinal, -(c.provisional as i64), 0));
                }
                (State::Orphan { at, .. }, Some(covered)) if covered >= at + ABANDON_NS / 2 => settled.charges.push((c.ordinal, -(c.provisional as i64), 0)),
                // Events measure it: the time between the chunk's markers replaces the
                // estimate (where events alone measure, an idle chunk's too: an upper
                // bound); without that, the estimate stands.
                (State::Done { busy, bound, .. }, None) => {
                    let book = self.books.entry(c.ordinal).or_default();
                    let time = if book.by_events { busy.or(bound) } else { busy };
                    if time.is_none() && book.by_events && book.estimate(c.unit) == 0 {
                        settled.unmeasurable.push(c.ordinal);
                    }
                    let busy = time.unwrap_or(c.provisional);
                    settled.charges.push((c.ordinal, busy as i64 - c.provisional as i64, busy as i64));
                }
                (State::Orphan { unmarked, .. }, None) => {
                    let book = self.books.entry(c.ordinal).or_default();
                    if unmarked && book.by_events && book.estimate(c.unit) == 0 {
                        settled.unmeasurable.push(c.ordinal);
                    }
                    settled.charges.push((c.ordinal, 0, c.provisional as i64))
                }
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
