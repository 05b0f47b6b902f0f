//! GPU health in the simulated driver: the events NVML's event sets deliver (an XID, an ECC
//! error), and GPUs that fell off the bus.
//!
//! Tests and tools inject them into the shared state ([`SimState::inject_xid`],
//! [`SimState::post_event`], [`SimState::lose_gpu`], [`SimState::recover_gpu`], and the
//! `fgpu-sim-ctl` command), and every process's simulated NVML sees them: its event sets
//! read each GPU's ring of recent events (`api/events.rs` of `fgpu-sim-nvml`), and a lost
//! GPU answers `NVML_ERROR_GPU_IS_LOST` on its calls.
//!
//! Layout: one record per GPU between the device records and the process table (a part of
//! the file no earlier layout used, so state files made before this module read as "no
//! event, no GPU lost"). A record holds whether the GPU is lost, how many times it was
//! lost (an event set that has not looked since still reports the loss once), and a ring of
//! the last [`RING`] events, each numbered. Writers take a number from the record's head,
//! fill the slot, then publish the number in the slot; a reader copies a slot and keeps it
//! only if the slot held the number it wanted before and after the copy. A reader that fell
//! more than [`RING`] events behind loses the oldest, as the real driver's bounded queue
//! does. Every change bumps a word of the header that waiters sleep on (a futex shared by
//! every process that maps the file).

use crate::{SimState, MAX_DEVICES};
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// `nvmlEventTypeSingleBitEccError` (nvml.h).
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypePState`.
pub const EVENT_PSTATE: u64 = 0x4;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID_CRITICAL: u64 = 0x8;
/// `nvmlEventTypeClock`.
pub const EVENT_CLOCK: u64 = 0x10;
/// `nvmlEventTypePowerSourceChange`.
pub const EVENT_POWER_SOURCE_CHANGE: u64 = 0x80;
/// `nvmlEventMigConfigChange`.
pub const EVENT_MIG_CONFIG_CHANGE: u64 = 0x100;
/// `nvmlEventTypeAll` of the CUDA 12.9 nvml.h: every type named there (the types above and
/// the ECC storm, DRAM retirement, poison, unavailable and recovery events, 0x200 to 0x8000).
pub const EVENT_ALL: u64 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000 | 0x2000 | 0x4000 | 0x8000;
/// What a simulated GPU raises (`nvmlDeviceGetSupportedEventTypes`): XIDs and ECC errors,
/// as a data-center board with ECC on.
pub const SUPPORTED_EVENTS: u64 = EVENT_XID_CRITICAL | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC;
/// `gpuInstanceId` and `computeInstanceId` of an event that concerns the whole GPU.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;
/// Events kept per GPU.
pub const RING: usize = 6;

/// Where the records start: right after the device records.
const HEALTH_OFF: usize = crate::DEVICES_OFF + MAX_DEVICES * crate::DEVICE_SIZE;
const HEALTH_SIZE: usize = 224;

#[repr(C)]
struct EventSlot {
    /// `n + 1` once the slot holds event `n` whole; 0 while empty or being written.
    seq: AtomicU64,
    event_type: AtomicU64,
    data: AtomicU64,
    /// `gpuInstanceId << 32 | computeInstanceId`.
    instances: AtomicU64,
}

#[repr(C)]
struct HealthRec {
    /// 1 while the GPU is off the bus.
    lost: AtomicU32,
    /// How many times it was lost.
    losses: AtomicU32,
    /// The number the next event gets (events `0..head` were posted).
    head: AtomicU64,
    ring: [EventSlot; RING],
    _pad: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<HealthRec>() == HEALTH_SIZE);
const _: () = assert!(HEALTH_OFF + MAX_DEVICES * HEALTH_SIZE <= crate::SLOTS_OFF);

/// One event of a GPU, as NVML's `nvmlEventData_t` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimEvent {
    pub device: usize,
    /// Its number in the GPU's sequence.
    pub seq: u64,
    /// One `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID, for [`EVENT_XID_CRITICAL`]; 0 for the others.
    pub data: u64,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// What [`SimState::read_event`] found at a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRead {
    Ready(SimEvent),
    /// The event was overwritten: the oldest one still kept has this number.
    Gone(u64),
    /// Not posted yet.
    NotYet,
}

fn futex(word: &AtomicU32, op: i32, value: u32, timeout: Option<&libc::timespec>) -> i64 {
    let ts = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: models futex(2) on a word of a MAP_SHARED mapping that lives until the process
    // exits (shared futexes, no FUTEX_PRIVATE_FLAG: other processes wake it); `ts` is null or
    // points to a live timespec; the other arguments are unused by FUTEX_WAIT and FUTEX_WAKE.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, value, ts, std::ptr::null::<u32>(), 0) }
}

impl SimState {
    fn health(&self, device: usize) -> &HealthRec {
        let d = device.min(MAX_DEVICES - 1);
        // SAFETY: index clamped; the records lie inside the mapping, which lives forever, and
        // every field is an atomic (or padding nobody reads).
        unsafe { &*(self.base.add(HEALTH_OFF + d * HEALTH_SIZE) as *const HealthRec) }
    }

    fn check_device(&self, device: usize) -> io::Result<()> {
        if device < self.device_count() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no simulated GPU {device} (this state has {})", self.device_count())))
        }
    }

    /// Changes the event word and wakes every waiter.
    fn wake_event_waiters(&self) {
        let word = &self.header().event_generation;
        word.fetch_add(1, Ordering::AcqRel);
        futex(word, libc::FUTEX_WAKE, i32::MAX as u32, None);
    }

    /// The event word: it changes whenever an event is posted or a GPU is lost or recovered.
    pub fn event_generation(&self) -> u32 {
        self.header().event_generation.load(Ordering::Acquire)
    }

    /// Sleeps until the event word is no longer `generation`, or `timeout` passed (or a
    /// signal came): the caller looks again either way.
    pub fn wait_for_events(&self, generation: u32, timeout: Duration) {
        let ts = libc::timespec { tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        futex(&self.header().event_generation, libc::FUTEX_WAIT, generation, Some(&ts));
    }

    /// Posts an event of `event_type` (one `nvmlEventType*` bit the GPU supports) on GPU
    /// `device`, as the driver would on an error; its number in the GPU's sequence. A lost
    /// GPU raises nothing.
    pub fn post_event(&self, device: usize, event_type: u64, data: u64, gpu_instance: u32, compute_instance: u32) -> io::Result<u64> {
        self.check_device(device)?;
        if event_type.count_ones() != 1 || event_type & SUPPORTED_EVENTS == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("event type {event_type:#x} is not one type a simulated GPU raises ({SUPPORTED_EVENTS:#x})"),
            ));
        }
        if self.gpu_lost(device) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("simulated GPU {device} is lost: it raises no event until it is recovered")));
        }
        let rec = self.health(device);
        let seq = rec.head.fetch_add(1, Ordering::AcqRel);
        let slot = &rec.ring[(seq % RING as u64) as usize];
        slot.seq.store(0, Ordering::Release);
        slot.event_type.store(event_type, Ordering::Release);
        slot.data.store(if event_type == EVENT_XID_CRITICAL { data } else { 0 }, Ordering::Release);
        slot.instances.store(((gpu_instance as u64) << 32) | compute_instance as u64, Ordering::Release);
        slot.seq.store(seq + 1, Ordering::Release);
        self.wake_event_waiters();
        Ok(seq)
    }

    /// An XID error on the whole of GPU `device` (`nvmlEventTypeXidCriticalError`, the
    /// XID in `eventData`).
    pub fn inject_xid(&self, device: usize, xid: u64) -> io::Result<u64> {
        self.post_event(device, EVENT_XID_CRITICAL, xid, NO_INSTANCE, NO_INSTANCE)
    }

    /// GPU `device` falls off the bus: its NVML calls answer `NVML_ERROR_GPU_IS_LOST`, and
    /// every event set that watches it reports the loss once.
    pub fn lose_gpu(&self, device: usize) -> io::Result<()> {
        self.check_device(device)?;
        let rec = self.health(device);
        if rec.lost.swap(1, Ordering::AcqRel) == 0 {
            rec.losses.fetch_add(1, Ordering::AcqRel);
            self.wake_event_waiters();
        }
        Ok(())
    }

    /// GPU `device` is back (reset, or attached again): it answers again.
    pub fn recover_gpu(&self, device: usize) -> io::Result<()> {
        self.check_device(device)?;
        if self.health(device).lost.swap(0, Ordering::AcqRel) != 0 {
            self.wake_event_waiters();
        }
        Ok(())
    }

    /// Whether GPU `device` is off the bus.
    pub fn gpu_lost(&self, device: usize) -> bool {
        device < MAX_DEVICES && self.health(device).lost.load(Ordering::Acquire) != 0
    }

    /// How many times GPU `device` was lost.
    pub fn gpu_losses(&self, device: usize) -> u32 {
        self.health(device).losses.load(Ordering::Acquire)
    }

    /// The number GPU `device`'s next event will get: an event set made now reads from here.
    pub fn event_head(&self, device: usize) -> u64 {
        self.health(device).head.load(Ordering::Acquire)
    }

    /// Event `seq` of GPU `device`.
    pub fn read_event(&self, device: usize, seq: u64) -> EventRead {
        let rec = self.health(device);
        let head = rec.head.load(Ordering::Acquire);
        if seq >= head {
            return EventRead::NotYet;
        }
        let oldest = head.saturating_sub(RING as u64);
        if seq < oldest {
            return EventRead::Gone(oldest);
        }
        let slot = &rec.ring[(seq % RING as u64) as usize];
        let before = slot.seq.load(Ordering::Acquire);
        let event = SimEvent {
            device,
            seq,
            event_type: slot.event_type.load(Ordering::Acquire),
            data: slot.data.load(Ordering::Acquire),
            gpu_instance: (slot.instances.load(Ordering::Acquire) >> 32) as u32,
            compute_instance: slot.instances.load(Ordering::Acquire) as u32,
        };
        let after = slot.seq.load(Ordering::Acquire);
        match (before == seq + 1, after == seq + 1) {
            (true, true) => EventRead::Ready(event),
            // Being written: either this one (not published yet) or a newer one over it.
            _ if before > seq + 1 || after > seq + 1 || rec.head.load(Ordering::Acquire) > seq + RING as u64 => {
                EventRead::Gone(rec.head.load(Ordering::Acquire).saturating_sub(RING as u64))
            }
            _ => EventRead::NotYet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::temp_state::{TempSim, TempState};
    use crate::SimConfig;

    fn state(name: &str, devices: u32) -> TempSim {
        TempState::new(&format!("events-{name}")).open_with(&SimConfig { devices, ..Default::default() })
    }

    #[test]
    fn events_are_numbered_per_gpu_and_kept_in_a_ring() {
        let s = state("ring", 2);
        assert_eq!((s.event_head(0), s.read_event(0, 0)), (0, EventRead::NotYet));
        let g = s.event_generation();
        assert_eq!(s.inject_xid(0, 79).unwrap(), 0);
        assert_ne!(s.event_generation(), g, "a post wakes waiters");
        assert_eq!(s.post_event(1, EVENT_DOUBLE_BIT_ECC, 5, 1, 2).unwrap(), 0, "each GPU numbers its own");
        match s.read_event(0, 0) {
            EventRead::Ready(e) => assert_eq!((e.event_type, e.data, e.gpu_instance, e.compute_instance), (EVENT_XID_CRITICAL, 79, NO_INSTANCE, NO_INSTANCE)),
            other => panic!("{other:?}"),
        }
        match s.read_event(1, 0) {
            EventRead::Ready(e) => {
                assert_eq!((e.event_type, e.data, e.gpu_instance, e.compute_instance), (EVENT_DOUBLE_BIT_ECC, 0, 1, 2), "ECC events carry no data")
            }
            other => panic!("{other:?}"),
        }
        for xid in 1..=RING as u64 {
            s.inject_xid(0, xid).unwrap();
        }
        assert_eq!(s.read_event(0, 0), EventRead::Gone(1), "the oldest is overwritten past {RING}");
        assert!(matches!(s.read_event(0, RING as u64), EventRead::Ready(e) if e.data == RING as u64));
        assert!(s.post_event(0, EVENT_PSTATE, 0, NO_INSTANCE, NO_INSTANCE).is_err(), "not a type it raises");
        assert!(s.post_event(0, EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC, 0, NO_INSTANCE, NO_INSTANCE).is_err(), "one type per event");
        assert!(s.inject_xid(2, 79).is_err(), "no GPU 2");
    }

    #[test]
    fn a_lost_gpu_raises_nothing_until_it_is_recovered() {
        let s = state("lost", 1);
        assert!(!s.gpu_lost(0));
        s.lose_gpu(0).unwrap();
        s.lose_gpu(0).unwrap();
        assert!(s.gpu_lost(0));
        assert_eq!(s.gpu_losses(0), 1, "losing a lost GPU is no new loss");
        assert!(s.inject_xid(0, 79).is_err());
        s.recover_gpu(0).unwrap();
        assert!(!s.gpu_lost(0));
        s.inject_xid(0, 48).unwrap();
        s.lose_gpu(0).unwrap();
        assert_eq!(s.gpu_losses(0), 2);
    }

    #[test]
    fn a_waiter_wakes_when_an_event_is_posted() {
        let sim = state("wake", 1);
        let s = *sim;
        let g = s.event_generation();
        let t0 = std::time::Instant::now();
        let poster = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            s.inject_xid(0, 31).unwrap();
        });
        s.wait_for_events(g, Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(9), "woken by the post, not the timeout");
        poster.join().unwrap();
        let t0 = std::time::Instant::now();
        s.wait_for_events(s.event_generation(), Duration::from_millis(30));
        assert!(t0.elapsed() >= Duration::from_millis(25), "nothing posted: the timeout");
    }
}
