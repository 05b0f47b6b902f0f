//! Chunk admission against the ledger's buckets (a real ledger in the test's own
//! directory), and chunk settlement with the fake driver's events: what is charged and
//! refunded, and when. The ground truth is the ledger's clocks and the bucket's plain
//! arithmetic: a full bucket holds `BURST_WALL_NS` of wall time at the share.

use super::book::Unit;
use super::chunks::{ChunkShared, Marker, Registry, REVOKED_IDLE};
use super::share::DevShare;
use crate::driver::fake::FAKE;
use crate::driver::instance::driver;
use crate::driver::seam::{CudaDriver, EventState};
use crate::testing::{Process, GIB};
use fgpu_core::compute::{wall_for, BURST_WALL_NS, PPM};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const MS: u64 = 1_000_000;
/// A chunk of this much GPU time (the admission threshold at these shares).
const CHUNK: u64 = 5 * MS;
/// Any instant long after the buckets' clocks started (a bucket starts full).
const NOW: u64 = 100_000 * MS;

/// Admits chunks at `now` until one is refused; returns how many went in.
fn admit_all(share: &DevShare, ledger: &fgpu_core::ledger::Ledger, now: u64) -> u64 {
    (0..).take_while(|_| share.admit(ledger, CHUNK, now)).count() as u64
}

#[test]
fn a_full_bucket_admits_its_share_of_the_burst_window_and_refunds_come_back() {
    let p = Process::new("admission", &[("FGPU_COMPUTE", "30%")], 80 * GIB);
    let account = p.active.account();
    let dev = account.device(0).unwrap();
    let share = DevShare::of(account, account.slot().unwrap(), dev).expect("a share on the device");
    let ledger = account.ledger();
    assert_eq!((share.ledger_share, share.own.is_some()), (Some(300_000), false), "the ledger's share alone, no bucket of its own");
    // 30 % of the 200 ms window: 60 ms of GPU time, twelve chunks of 5 ms, at one instant.
    let full = BURST_WALL_NS * 300_000 / PPM;
    assert_eq!(admit_all(&share, ledger, NOW), full / CHUNK);
    let clock = ledger.compute_clock(dev.id);
    assert_eq!(clock, NOW - BURST_WALL_NS + full / CHUNK * wall_for(CHUNK, 300_000), "the bucket is empty: each chunk moved its clock by its wall time");
    assert!(NOW - clock < full / CHUNK, "its clock is now, less rounding");
    assert!(!share.admit(ledger, CHUNK, NOW), "an empty bucket admits nothing");
    assert_eq!(ledger.compute_clock(dev.id), clock, "a refused chunk is charged nothing");
    // One chunk's worth of wall time later, one more chunk.
    let later = NOW + wall_for(CHUNK, 300_000);
    assert_eq!(admit_all(&share, ledger, later), 1);
    // A refund of two chunks' estimates lets two more in at once.
    share.charge(ledger, -2 * CHUNK as i64, later);
    assert_eq!(admit_all(&share, ledger, later), 2);
    // Measured use above the estimates overdraws the bucket: nothing more until it is paid.
    share.charge(ledger, 10 * MS as i64, later);
    assert!(share.overdrawn(ledger, later));
    assert!(!share.admit(ledger, CHUNK, later + wall_for(10 * MS, 300_000) - 1));
    assert!(!share.overdrawn(ledger, later + wall_for(10 * MS, 300_000)));
}

#[test]
fn a_process_asking_less_than_its_ledger_is_held_to_its_own_bucket_too() {
    let p = Process::new("own-bucket", &[("FGPU_COMPUTE", "20%")], 80 * GIB);
    // Another process of the ledger registered the device first, at 30 %.
    let other = p.another(&[("FGPU_COMPUTE", "30%")]);
    let theirs = DevShare::of(other.account(), other.account().slot().unwrap(), other.account().device(0).unwrap()).unwrap();
    let account = p.active.account();
    let dev = account.device(0).unwrap();
    let ours = DevShare::of(account, account.slot().unwrap(), dev).unwrap();
    let ledger = account.ledger();
    assert_eq!(ours.ledger_share, Some(300_000), "the ledger keeps the first share");
    let own_clock = || ours.own.as_ref().expect("a bucket of its own at 20 %").1.load(Ordering::Acquire);
    // Its own bucket (20 % of the window: 40 ms) runs out before the ledger's (60 ms).
    assert_eq!(admit_all(&ours, ledger, NOW), BURST_WALL_NS * 200_000 / PPM / CHUNK);
    assert_eq!(own_clock(), NOW);
    // The other process takes the rest of the ledger's bucket and more.
    assert_eq!(admit_all(&theirs, other.account().ledger(), NOW), (60 - 40) * MS / CHUNK);
    theirs.charge(other.account().ledger(), 20 * MS as i64, NOW);
    // 50 ms on, its own bucket holds 10 ms but the ledger's is still overdrawn: refused,
    // and the charge to its own bucket is undone.
    let later = NOW + 50 * MS;
    let ledger_clock = ledger.compute_clock(dev.id);
    assert!(!ours.admit(ledger, CHUNK, later));
    assert_eq!(own_clock(), NOW, "the own bucket's charge is undone when the ledger's refuses");
    assert_eq!(ledger.compute_clock(dev.id), ledger_clock);
    // Once both hold a chunk, it goes in, charged to both.
    let refilled = NOW + BURST_WALL_NS;
    assert!(ours.admit(ledger, CHUNK, refilled));
    assert_eq!(own_clock(), NOW + wall_for(CHUNK, 200_000));
    assert_eq!(ledger.compute_clock(dev.id), ledger_clock + wall_for(CHUNK, 300_000));
}

/// A new event of the fake driver's, in `state`.
fn event(state: EventState) -> crate::abi::cuda::CUevent {
    let event = driver().event_create().unwrap();
    FAKE.with(|s| s.events.insert(event as usize, state));
    event
}

#[test]
fn chunks_are_settled_by_their_markers_or_by_nvml() {
    let _p = Process::new("settlement", &[("FGPU_COMPUTE", "30%")], 80 * GIB);
    let mut registry = Registry::default();
    let ctx = registry.context(0x1000, 0);
    let at = |ms: u64| NOW + ms * MS;

    // A chunk charged 10 launches of 1 ms ends after 4: the 6 unused go back at once.
    let shared = Arc::new(ChunkShared::default());
    let start = Arc::new(Marker::new(event(EventState::Done), ctx.clone()));
    registry.opened(shared.clone(), 0, Unit::Kernel, 10 * MS, Some(start), at(0));
    assert_eq!(registry.inflight(0), 10 * MS);
    let end_event = event(EventState::Pending);
    let unused = registry.ended(&shared, Some(Arc::new(Marker::new(end_event, ctx.clone()))), 4, 6, false, at(1));
    assert_eq!(unused, 6 * MS);
    assert_eq!(registry.inflight(0), 4 * MS);
    // While its end marker is pending nothing is settled.
    assert!(registry.settle(at(2), |_| None).charges.is_empty());
    assert_eq!(registry.inflight(0), 4 * MS);
    // Its end marker completes, 3 ms after its start: events measure (no NVML), so the
    // 3 ms replace the 4 ms estimate, and the estimate of a launch becomes 0.75 ms.
    FAKE.with(|s| {
        s.events.insert(end_event as usize, EventState::Done);
        s.elapsed_ns = Some(3 * MS);
    });
    let settled = registry.settle(at(3), |_| None);
    assert_eq!(settled.charges, vec![(0, -(MS as i64), 3 * MS as i64)]);
    assert_eq!(registry.inflight(0), 0);
    assert_eq!(registry.estimate(0, Unit::Kernel), 3 * MS / 4);
    assert_eq!(registry.estimate(0, Unit::Graph), 0, "graphs are estimated apart");

    // Where NVML measures, the estimate is refunded once NVML has answered for the time
    // the work was seen done, and not before.
    let shared = Arc::new(ChunkShared::default());
    let start = Arc::new(Marker::new(event(EventState::Done), ctx.clone()));
    registry.opened(shared.clone(), 0, Unit::Kernel, 2 * MS, Some(start), at(10));
    let end = Arc::new(Marker::new(event(EventState::Done), ctx.clone()));
    assert_eq!(registry.ended(&shared, Some(end), 2, 0, false, at(11)), 0);
    assert!(registry.settle(at(12), |_| Some(at(5))).charges.is_empty(), "NVML has not answered for it yet");
    assert!(registry.settle(at(13), |_| Some(at(11))).charges.is_empty(), "seen done at 12 ms, NVML is at 11");
    assert_eq!(registry.settle(at(14), |_| Some(at(12))).charges, vec![(0, -2 * MS as i64, 0)]);
    assert_eq!(registry.inflight(0), 0);
}

#[test]
fn chunks_without_a_usable_marker_are_settled_by_time() {
    let _p = Process::new("by-time", &[("FGPU_COMPUTE", "30%")], 80 * GIB);
    let mut registry = Registry::default();
    let ctx = registry.context(0x1000, 0);
    let at = |ms: u64| NOW + ms * MS;

    // A chunk that sat idle before it ended: its markers' time includes the wait, so its
    // estimate stands, and is recorded as what it used.
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Kernel, 4 * MS, Some(Arc::new(Marker::new(event(EventState::Done), ctx.clone()))), at(0));
    FAKE.with(|s| s.elapsed_ns = Some(500 * MS));
    registry.ended(&shared, Some(Arc::new(Marker::new(event(EventState::Done), ctx.clone()))), 3, 0, true, at(1));
    assert_eq!(registry.settle(at(2), |_| None).charges, vec![(0, 0, 4 * MS as i64)]);
    assert_eq!(registry.estimate(0, Unit::Kernel), 0, "an idle chunk measures nothing");

    // An open chunk with no launch for 20 ms is revoked (it ends at its next launch).
    let idle = Arc::new(ChunkShared::default());
    idle.launches.store(1, Ordering::Relaxed);
    registry.opened(idle.clone(), 0, Unit::Kernel, MS, None, at(10));
    registry.settle(at(20), |_| None);
    assert_eq!(idle.revoked.load(Ordering::Relaxed), 0);
    registry.settle(at(31), |_| None);
    assert_eq!(idle.revoked.load(Ordering::Relaxed) & REVOKED_IDLE, REVOKED_IDLE);

    // A thread that exits with its chunk open leaves an orphan: charged its estimate.
    idle.orphaned.store(true, Ordering::Release);
    assert_eq!(registry.settle(at(32), |_| None).charges, vec![(0, 0, MS as i64)]);
    assert_eq!(registry.inflight(0), 0);

    // A context destroyed under a chunk: its markers are never queried again, and the
    // chunk is settled by its estimate.
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Graph, 3 * MS, Some(Arc::new(Marker::new(event(EventState::Pending), ctx.clone()))), at(40));
    registry.ended(&shared, Some(Arc::new(Marker::new(event(EventState::Pending), ctx.clone()))), 1, 0, false, at(41));
    registry.context_gone(|c| c.handle == 0x1000);
    assert_eq!(registry.settle(at(42), |_| None).charges, vec![(0, 0, 3 * MS as i64)]);
    assert_eq!(registry.inflight(0), 0);
}

/// Where events alone measure (a MIG device): a late chunk is charged the time between its
/// markers, idle wait included (an upper bound), not the estimate; a chunk that ended with
/// no marker while nothing of its kind was ever measured makes the device unmeasurable; a
/// chunk ended without a marker once an estimate exists is charged the estimate. A new
/// chunk of an unmeasured kind waits for the end marker of one that has ended.
#[test]
fn where_events_alone_measure_nothing_goes_unmeasured() {
    let _p = Process::new("events-only", &[("FGPU_COMPUTE", "30%")], 80 * GIB);
    let mut registry = Registry::default();
    registry.book(0).by_events = true;
    let ctx = registry.context(0x1000, 0);
    let at = |ms: u64| NOW + ms * MS;

    // A late chunk: 1 ms charged, 30 ms between its markers (the idle wait in them).
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Kernel, MS, Some(Arc::new(Marker::new(event(EventState::Done), ctx.clone()))), at(0));
    FAKE.with(|s| s.elapsed_ns = Some(30 * MS));
    let end = event(EventState::Pending);
    registry.ended(&shared, Some(Arc::new(Marker::new(end, ctx.clone()))), 1, 0, true, at(25));
    assert!(registry.awaiting_marker(0), "ended, its marker pending: an unmeasured kind waits for it");
    FAKE.with(|s| s.events.insert(end as usize, EventState::Done));
    let settled = registry.settle(at(31), |_| None);
    assert_eq!(settled.charges, vec![(0, 29 * MS as i64, 30 * MS as i64)], "the upper bound replaces the 1 ms guess");
    assert!(settled.unmeasurable.is_empty());
    assert!(!registry.awaiting_marker(0));
    assert_eq!(registry.estimate(0, Unit::Kernel), 0, "an upper bound is not an estimate");

    // A chunk that ended without a marker (none could be recorded), nothing measured yet.
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Kernel, MS, None, at(40));
    registry.ended(&shared, None, 1, 0, false, at(41));
    let settled = registry.settle(at(42), |_| None);
    assert_eq!(settled.unmeasurable, vec![0], "its time cannot be known");
    assert_eq!(settled.charges, vec![(0, 0, MS as i64)]);

    // Once a launch of the kind has been measured, such a chunk is charged the estimate.
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Kernel, 4 * MS, Some(Arc::new(Marker::new(event(EventState::Done), ctx.clone()))), at(50));
    FAKE.with(|s| s.elapsed_ns = Some(8 * MS));
    registry.ended(&shared, Some(Arc::new(Marker::new(event(EventState::Done), ctx.clone()))), 4, 0, false, at(51));
    assert_eq!(registry.settle(at(52), |_| None).charges, vec![(0, 4 * MS as i64, 8 * MS as i64)]);
    assert_eq!(registry.estimate(0, Unit::Kernel), 2 * MS);
    let shared = Arc::new(ChunkShared::default());
    registry.opened(shared.clone(), 0, Unit::Kernel, 2 * MS, None, at(60));
    registry.ended(&shared, None, 1, 0, false, at(61));
    let settled = registry.settle(at(62), |_| None);
    assert!(settled.unmeasurable.is_empty(), "measured before: the estimate stands");
    assert_eq!(settled.charges, vec![(0, 0, 2 * MS as i64)]);

    // Where NVML measures (or may yet), nothing is ever unmeasurable: NVML charges it.
    let mut nvml = Registry::default();
    let shared = Arc::new(ChunkShared::default());
    nvml.opened(shared.clone(), 0, Unit::Kernel, MS, None, at(70));
    nvml.ended(&shared, None, 1, 0, false, at(71));
    assert!(nvml.settle(at(72), |_| None).unmeasurable.is_empty());
}
