//! Reading a device's history: the ground truth ([`SimState::device_busy`]) and NVML's
//! utilisation samples ([`SimState::utilisation_periods`]).

use super::engine::Engine;
use super::*;
use crate::SimState;
use std::ptr::addr_of;
use std::sync::atomic::Ordering;

/// A sample period's end and the busy ns of each context record incarnation in it.
type RawPeriod = (u64, Vec<(u32, u64)>);

impl SimState {
    /// Every interval that ran on the timeline and overlaps `[from, to)`, clipped, with the
    /// incarnation that ran it: history ring, the open interval and the running kernel.
    pub(super) fn intervals(&self, e: &Engine, s: &Sched, from: u64, to: u64, mut f: impl FnMut(u32, u64, u64)) {
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
        let (p, raw) = self.raw_periods(device, after_us, delivery);
        raw.into_iter()
            .map(|(end_ns, per)| {
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
    }

    /// The completed, retained sample periods of timeline `device` after `after_us` (as
    /// `delivery` lets the caller see them): the period length, and each period's end with
    /// the busy ns of each context record incarnation that ran in it.
    fn raw_periods(&self, device: usize, after_us: u64, delivery: Option<Delivery>) -> (u64, Vec<RawPeriod>) {
        let p = self.sample_period_ns();
        let periods = self.with_timeline(device, |e, s, now| {
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
            busy.into_iter().enumerate().map(|(k, per)| (first_start + (k as u64 + 1) * p, per)).collect()
        });
        (p, periods)
    }

    /// NVML's per-process utilisation (`nvmlDeviceGetProcessUtilization`) of GPU `device`
    /// for samples newer than `after_us`, as this process sees them: what the NVML
    /// reference describes, one sample per process running on the device that ran kernels
    /// in those periods, its `smUtil` the percent of them its kernels ran (so a query over
    /// several periods answers their average) and its timestamp the end of the newest
    /// period it ran in; `running` is the number of processes running on the device (the
    /// count a size query answers). Processes that exited have no sample.
    pub fn process_utilisation(&self, device: usize, after_us: u64) -> ProcessUtilisation {
        let running = self.processes().iter().filter(|p| p.per_device_contexts.get(device).copied().unwrap_or(0) > 0).count();
        let tl = self.timeline(device);
        let (p, periods) = self.raw_periods(device, after_us, Delivery::of_this_process().ok().flatten());
        let key = crate::owner_key();
        // (slot, generation) -> (pid as reported, busy ns, newest end it ran in)
        let mut per: Vec<((u32, u32), u32, u64, u64)> = Vec::new();
        for (end, incs) in &periods {
            for &(inc, ns) in incs {
                let Some(id) = self.identity(tl, inc) else { continue };
                let owner = (id.slot.load(Ordering::Acquire), id.gen.load(Ordering::Acquire));
                if !self.owner_alive(owner.0 as usize, owner.1, key) {
                    continue;
                }
                match per.iter_mut().find(|x| x.0 == owner) {
                    Some(x) => {
                        x.2 += ns;
                        x.3 = x.3.max(*end);
                    }
                    None => per.push((owner, self.identity_reported_pid(id), ns, *end)),
                }
            }
        }
        let window = (periods.len() as u64 * p).max(1) as u128;
        let samples = per
            .into_iter()
            .filter(|x| x.1 != 0 && x.2 > 0)
            .map(|(_, pid, ns, end)| ProcessSample {
                pid,
                timestamp_us: self.timestamp_us(end),
                sm_util: ((ns as u128 * 100 + window / 2) / window).min(100) as u32,
            })
            .collect();
        ProcessUtilisation { running, samples }
    }
}
