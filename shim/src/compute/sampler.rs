//! The sampler: one thread per process with a compute share, started at its first chunk.
//! Every few milliseconds ([`TICK`]) it settles the chunks (`chunks.rs`, through
//! `limiter.rs`), and once each NVML sample period has ended ([`NVML_AFTER_PERIOD_NS`]
//! after its end, by the period learned so far) it asks NVML for this process's
//! utilisation samples on each device with a share (`share.rs`), charging what they
//! measure to the device's buckets; what NVML has measured is kept per device in
//! `book.rs`.
//!
//! **Which signal measures.** NVML's per-process samples say how much of each sample
//! period the process's kernels ran, keyed by the PID NVML knows the process by: its own
//! PID where the driver gives PIDs as the caller's namespace sees them (current drivers,
//! and any process in the host's namespace), its host PID where the driver gives host
//! PIDs (`process/nvml_pid.rs` finds out which). Where that PID is known, NVML measures it: every
//! chunk's estimate is refunded once NVML has answered for the time the chunk was seen
//! done, and NVML's figure is charged instead. Where it is not (host PIDs in a container
//! whose host PID nothing has told yet) or NVML has no per-process samples for the device,
//! the process's own markers measure it: the time between a chunk's markers, which
//! includes other contexts' time slices and so never reads low. The ceiling then still
//! holds; a process sharing the GPU is held below its share by the others' slices. It
//! switches to NVML as soon as the PID is known. The thread runs with stream capture in relaxed mode, so its driver calls never
//! disturb a capture under way elsewhere in the program.

use super::book::{realtime_ns, DevBook, NvmlState};
use super::limiter::{existing, settle_now, Limiter};
use super::share::DevShare;
use crate::abi::cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
use crate::abi::nvml::NvmlDevice;
use crate::driver::instance::driver;
use crate::driver::seam::{CudaDriver, NvmlDriver, SamplesError};
use fgpu_core::compute::UtilisationBook;
use fgpu_core::log::{monotonic_ns, Level};
use fgpu_core::log_at;
use std::time::Duration;

/// How often the sampler wakes.
const TICK: Duration = Duration::from_millis(5);
/// NVML is asked this long after the end of the next sample period it should have, by
/// the period learned so far (its timestamps), and again this often while that period is
/// late; never more often than that.
const NVML_AFTER_PERIOD_NS: u64 = 10_000_000;
const NVML_RETRY_NS: u64 = 30_000_000;
/// NVML's figures count from its first answer (`UtilisationBook`: each answer's window is
/// known from its timestamps), but its sample period, which says when the next answer is
/// due and how long a quiet device has been quiet, takes two timestamps of one process (at
/// most 1 s apart by NVIDIA's documentation). Should it still be unknown this long after
/// NVML was first asked (a process that ran in one period only, or samples that never name
/// it), its events measure it instead.
const LEARN_PERIOD_WITHIN_NS: u64 = 4_000_000_000;

/// Starts the sampler thread on the first chunk (once per limiter).
pub fn ensure_started(limiter: &'static Limiter) {
    limiter.sampler.call_once(|| start(limiter));
}

fn start(limiter: &'static Limiter) {
    let spawned = std::thread::Builder::new().name("fgpu-compute".into()).spawn(move || run(limiter));
    if let Err(e) = spawned {
        log_at!(Level::Error, "cannot start the compute sampler thread ({e}); the share is kept with the estimates alone");
    }
}

fn run(limiter: &'static Limiter) {
    // For good: this thread runs nothing of the program's.
    let _ = driver().exchange_capture_mode(CU_STREAM_CAPTURE_MODE_RELAXED);
    loop {
        std::thread::sleep(TICK);
        if !std::ptr::eq(existing().map_or(std::ptr::null(), |l| l as *const Limiter), limiter) {
            return;
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tick(limiter))).is_err() {
            log_at!(Level::Error, "internal error in the compute sampler (a bug in fgpu; please report it)");
        }
    }
}

fn tick(limiter: &'static Limiter) {
    let now = monotonic_ns();
    for share in limiter.shares() {
        poll(limiter, share, now);
    }
    settle_now(limiter);
    revoke_if_overdrawn(limiter);
    let deferred = std::mem::take(&mut limiter.registry.lock().deferred);
    drop(deferred);
}

/// Once what was measured and refunded is charged, a bucket ahead of now means the ledger
/// has used more than its share: the chunks this process has open on that device end at
/// their next launch, and what they still had waits for the share like a new chunk (no new
/// chunk is admitted while it is so: `DevShare::admit`). Without this an open chunk would
/// run out its credit, up to `CHUNK_GPU_NS` per thread and stream, on an overdrawn ledger.
fn revoke_if_overdrawn(limiter: &Limiter) {
    let now = monotonic_ns();
    for share in limiter.shares() {
        if share.overdrawn(limiter.ledger(), now) {
            limiter.registry.lock().revoke_open(share.ordinal);
        }
    }
}

/// The PID NVML's samples name this process by, once known (`process/nvml_pid.rs`: its own PID
/// where the driver gives PIDs as its namespace sees them, its host PID where the driver
/// gives host PIDs).
fn host_pid(limiter: &Limiter) -> Option<u32> {
    limiter.account.sampled_pid()
}

/// Asks NVML about one device when due; charges and records what it measured.
fn poll(limiter: &Limiter, share: &DevShare, now: u64) {
    let ask = {
        let mut registry = limiter.registry.lock();
        let book = registry.book(share.ordinal);
        if !book.by_events && book.nvml.is_none() {
            start_measuring(limiter, share, book, now);
        }
        match &book.nvml {
            Some(state) if now >= state.next_poll => Some((state.handle, state.book.ask_after())),
            _ => None,
        }
    };
    let Some((handle, after)) = ask else {
        // Events measure (or it is not time yet): the display window still moves.
        limiter.ledger().compute_record(limiter.slot, share.id, 0, now);
        return;
    };
    let answer = driver().nvml_process_samples(handle as NvmlDevice, after);
    let offset = realtime_ns() - monotonic_ns() as i64;
    let now_us = (realtime_ns() / 1000).max(0) as u64;
    let used = {
        let mut registry = limiter.registry.lock();
        let book = registry.book(share.ordinal);
        let Some(state) = book.nvml.as_mut() else { return };
        state.offset_ns = offset;
        let used = match answer {
            Ok(_) if !state.book.measuring() && now.saturating_sub(state.since) > LEARN_PERIOD_WITHIN_NS => {
                // The chunks NVML has not answered for yet are settled by their events from
                // here on: what NVML counted covered only the time before them.
                log_at!(
                    Level::Info,
                    "NVML's samples did not show their period within {} s on {}; the compute share is measured by this process's events",
                    LEARN_PERIOD_WITHIN_NS / 1_000_000_000,
                    share.uuid
                );
                book.nvml = None;
                book.by_events = true;
                return;
            }
            Ok(samples) => state.book.ingest(&samples, &[state.host_pid], now_us),
            Err(SamplesError::Transient(_)) => {
                state.next_poll = now + NVML_RETRY_NS;
                return;
            }
            Err(SamplesError::Unavailable(rc)) => {
                log_at!(
                    Level::Info,
                    "NVML gives no per-process utilisation for {} (NVML error {rc}); the compute share is measured by this process's events",
                    share.uuid
                );
                book.nvml = None;
                book.by_events = true;
                return;
            }
        };
        book.measured_since += used;
        // The next period should end one period after the newest one answered for.
        let expected = state.covered_mono().unwrap_or(now).saturating_add(state.book.period_us() * 1000 + NVML_AFTER_PERIOD_NS);
        state.next_poll = expected.max(now + NVML_RETRY_NS);
        used
    };
    share.charge(limiter.ledger(), used, now);
    limiter.ledger().compute_record(limiter.slot, share.id, used, now);
}

/// Sets NVML up for a device if this process's host PID is known.
fn start_measuring(limiter: &Limiter, share: &DevShare, book: &mut DevBook, now: u64) {
    let Some(pid) = host_pid(limiter) else { return };
    let uuid = share.uuid;
    let Some(handle) = driver().nvml_device_by_uuid(&share.uuid) else {
        log_at!(Level::Info, "NVML cannot find {uuid}; the compute share there is measured by this process's events");
        book.by_events = true;
        return;
    };
    let offset = realtime_ns() - now as i64;
    let start_us = ((now as i64 + offset) / 1000).max(0) as u64;
    log_at!(Level::Debug, "the compute share on {uuid} is measured by NVML (its samples under PID {pid})");
    book.nvml = Some(NvmlState { handle: handle as usize, book: UtilisationBook::new(start_us), host_pid: pid, offset_ns: offset, next_poll: 0, since: now });
}
