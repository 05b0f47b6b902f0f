//! Work on the device timelines: submitting it, waiting for it, when this process learns
//! that it completed (`FGPU_SIM_LATE_DELIVERY`), the ends of event markers, and the
//! failures `FGPU_SIM_FAIL` injects.

use super::records::*;
use crate::errors::*;
use fgpu_sim_state::timeline::Delivery;
use fgpu_sim_state::{now_ns, TimelineContext, Work};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// End times of event markers whose queue entries were reused before anyone read them
/// (see `fgpu_sim_state::SimState::timeline_submit`). Keyed by (timeline incarnation,
/// sequence number); `live` holds the markers some event still refers to.
#[derive(Default)]
pub struct MarkerBook {
    pub live: HashSet<(u32, u64)>,
    pub ends: HashMap<(u32, u64), u64>,
}

/// Lock order: the timeline lock (inside fgpu-sim-state) may be held while taking this
/// one, never the other way round; the driver's `Inner` lock is never held with it.
pub static MARKERS: Mutex<Option<MarkerBook>> = Mutex::new(None);

pub fn markers() -> MutexGuard<'static, Option<MarkerBook>> {
    MARKERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps the end of a marker of `tl` whose queue entry is being reused, if an event still
/// refers to it.
fn keep_marker_end(tl: TimelineContext, seq: u64, end: u64) {
    let mut g = markers();
    let book = g.get_or_insert_with(MarkerBook::default);
    if book.live.contains(&(tl.incarnation, seq)) {
        book.ends.insert((tl.incarnation, seq), end);
    }
}

/// Puts `work` on a context's timeline, blocking while its queue is full (call it without
/// any lock of this process held).
pub fn submit(d: &Driver, tl: TimelineContext, work: Work) -> Result<u64, CUresult> {
    d.state.timeline_submit(tl, work, |seq, end| keep_marker_end(tl, seq, end)).map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)
}

/// Puts `work` on a context's timeline if its queue has room (never blocks; may be called
/// with the driver lock held).
pub fn try_submit(d: &Driver, tl: TimelineContext, work: Work) -> Result<Option<u64>, CUresult> {
    d.state.timeline_try_submit(tl, work, |seq, end| keep_marker_end(tl, seq, end)).map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)
}

/// Calls this process's driver fails on purpose (`FGPU_SIM_FAIL`): a comma-separated list
/// of call names, each with `=CODE` (a `CUresult` number) or without (999,
/// `CUDA_ERROR_UNKNOWN`). A name covers the call's `_ptsz` form too. Lets a test see what
/// fgpu does when the driver answers an error where it never does on this simulator.
/// Calls that honour it: `cuStreamIsCapturing`.
pub(super) fn failures() -> &'static Result<Vec<(String, CUresult)>, String> {
    static FAILURES: OnceLock<Result<Vec<(String, CUresult)>, String>> = OnceLock::new();
    FAILURES.get_or_init(|| {
        let value = std::env::var("FGPU_SIM_FAIL").unwrap_or_default();
        let mut out = Vec::new();
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, code) = match item.split_once('=') {
                Some((name, code)) => {
                    (name.trim(), code.trim().parse::<CUresult>().map_err(|_| format!("FGPU_SIM_FAIL={value:?}: {code:?} is not a CUresult number"))?)
                }
                None => (item, CUDA_ERROR_UNKNOWN),
            };
            if !name.starts_with("cu") || code == CUDA_SUCCESS {
                return Err(format!("FGPU_SIM_FAIL={value:?}: {item:?} is not a call name with a non-zero CUresult"));
            }
            out.push((name.to_string(), code));
        }
        Ok(out)
    })
}

/// The error `FGPU_SIM_FAIL` makes the call `name` answer, if any.
pub fn injected_failure(name: &str) -> Option<CUresult> {
    failures().as_ref().ok()?.iter().find(|(n, _)| n == name).map(|(_, code)| *code)
}

/// How late this process learns of completions (`FGPU_SIM_LATE_DELIVERY`; checked at
/// `cuInit`, so an invalid value never gets here).
fn delivery() -> Option<Delivery> {
    Delivery::of_this_process().ok().flatten()
}

/// When this process learns that item `seq` of `tl` completed (it has): at once, or under
/// `FGPU_SIM_LATE_DELIVERY` late, with the other completions of the same stretch. An item
/// whose end is no longer kept completed long enough ago to count as known.
fn known_at(d: &Driver, tl: TimelineContext, seq: u64) -> Option<u64> {
    let delivery = delivery()?;
    let end = marker_end(d, tl, seq)?;
    Some(delivery.delivered_at(end))
}

/// Waits until item `seq` of `tl` has completed and this process knows it. A record that is
/// gone has nothing left to wait for.
pub fn wait(d: &Driver, tl: TimelineContext, seq: u64) {
    if d.state.timeline_wait(tl, seq).is_ok() {
        if let Some(at) = known_at(d, tl, seq) {
            fgpu_sim_state::timeline::sleep_until(at);
        }
    }
}

/// Whether item `seq` of `tl` has completed by now, as far as this process knows.
pub fn done(d: &Driver, tl: TimelineContext, seq: u64) -> bool {
    match d.state.timeline_completed(tl) {
        Ok(completed) if completed < seq => false,
        Ok(_) => known_at(d, tl, seq).is_none_or(|at| at <= now_ns()),
        Err(_) => true,
    }
}

/// End time of item `seq` of `tl` (a marker, or a kernel whose queue entry is still kept),
/// once completed.
pub fn marker_end(d: &Driver, tl: TimelineContext, seq: u64) -> Option<u64> {
    if let Ok(Some(t)) = d.state.timeline_end(tl, seq) {
        return Some(t);
    }
    markers().as_ref().and_then(|b| b.ends.get(&(tl.incarnation, seq)).copied())
}
