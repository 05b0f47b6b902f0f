//! A thread's side of its chunks (`chunks.rs`): one open chunk per stream it launches on,
//! most recently used first, in thread-local storage. A launch inside a chunk costs a few
//! loads and stores on the thread's own data ([`admit_fast`]); a chunk's first launch waits
//! for the share, is charged, and records the marker that starts it ([`admit_slow`]).

use super::book::Unit;
use super::chunks::{ChunkShared, Marker, REVOKED_IDLE};
use super::limiter::{existing, settle_now, Limiter};
use super::share::DevShare;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::{relaxed, Capture, CudaDriver, EventState};
use fgpu_core::compute::{admit_at, admit_threshold, chunk_launches, inflight_allows, tokens};
use fgpu_core::log::monotonic_ns;
use std::cell::UnsafeCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Cost assumed for a chunk's launch before anything was measured (the first chunk holds
/// one launch; its marker measures it).
const FIRST_GUESS_NS: u64 = 1_000_000;
/// Longest single nap while waiting for the share or for work in flight.
const MAX_NAP_NS: u64 = 2_000_000;
/// Nap while waiting for work in flight to complete.
const INFLIGHT_NAP_NS: u64 = 200_000;

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
        if let Some(limiter) = existing() {
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
/// for the share), a device without a share. Answers `CUDA_SUCCESS`, or the error a launch
/// on a device whose work cannot be measured is refused with.
pub fn admit_slow(limiter: &'static Limiter, stream: CUstream, ptsz: bool, unit: Unit) -> CUresult {
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
        return CUDA_SUCCESS;
    }
    let Ok(dev) = limiter.account.current_device() else { return CUDA_SUCCESS };
    let Some(share) = limiter.device(dev) else {
        // No share on this device: a chunk without end.
        let _ = with_local(|local| {
            let e = &mut local.entries[0];
            (e.credit, e.ordinal) = (u32::MAX, dev.ordinal);
        });
        return CUDA_SUCCESS;
    };
    if share.refused() {
        return super::REFUSED;
    }
    let markers = match relaxed(driver(), || driver().stream_capturing(stream, ptsz)) {
        // Captured into a graph, not run: nothing to admit (the graph's launches are).
        Capture::Yes => return CUDA_SUCCESS,
        Capture::No => true,
        // The driver cannot say: the launch may run, so it waits for the share like any
        // other; a marker might become part of a capture (or invalidate it), so none is
        // recorded, and the chunk is settled by time.
        Capture::Unknown => false,
    };
    super::sampler::ensure_started(limiter);
    let Some((launches, provisional)) = wait_for_share(limiter, share, unit) else { return super::REFUSED };
    open(limiter, share, stream, ptsz, unit, launches, provisional, markers);
    CUDA_SUCCESS
}

/// Waits until the device's buckets hold a chunk's worth and the work in flight allows
/// one more chunk; returns the chunk's launches and its estimated cost, already charged
/// (`None`: the device's launches are refused, its work found unmeasurable meanwhile).
fn wait_for_share(limiter: &Limiter, share: &DevShare, unit: Unit) -> Option<(u32, u64)> {
    let began = monotonic_ns();
    let mut waited = false;
    loop {
        settle_now(limiter);
        if share.refused() {
            return None;
        }
        let now = monotonic_ns();
        let (inflight, est, awaiting) = {
            let mut registry = limiter.registry.lock();
            (registry.inflight(share.ordinal), registry.estimate(share.ordinal, unit), registry.awaiting_marker(share.ordinal))
        };
        // The bucket that holds least decides the chunk.
        let mut ready_at = now;
        let mut least = u64::MAX;
        for (rate, clock) in share.buckets(limiter.ledger()) {
            let threshold = admit_threshold(rate);
            let held = tokens(clock, now, rate);
            least = least.min(held);
            if held < threshold {
                ready_at = ready_at.max(admit_at(clock, threshold, rate));
            }
        }
        let launches = chunk_launches(est, least);
        let provisional = launches as u64 * if est == 0 { FIRST_GUESS_NS } else { est };
        // Until a launch of this kind has been measured its cost is a guess: a chunk that has
        // ended is waited for (its markers measure it) before another one starts, so that
        // launches of unknown length do not queue up ahead of their measure.
        let fits = inflight_allows(inflight, provisional) && !(est == 0 && awaiting);
        // The buckets are tested again as they are charged: another process of the ledger
        // may have taken what this one saw.
        if ready_at <= now && fits && share.admit(limiter.ledger(), provisional, now) {
            if waited {
                limiter.ledger().compute_waited(share.id, now.saturating_sub(began));
            }
            return Some((launches, provisional));
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
    limiter.registry.lock().opened(shared.clone(), share.ordinal, unit, provisional, start, now);
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
    let marker = Arc::new(Marker::new(event, ctx_rec));
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
    let unused = limiter.registry.lock().ended(&shared, end.clone(), e.launches, credit, late, now);
    if unused > 0 {
        if let Some(share) = limiter.known(e.ordinal) {
            share.charge(limiter.ledger(), -(unused as i64), now);
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
