//! The scheduler of a device's timeline: the lock, the double-buffered state, and the
//! engine that advances it (who holds the device, when each item starts and ends); the
//! calls a context makes (open, submit, wait, close).

use super::*;
use crate::{flock, owner_key, st_gen, st_kind, st_tag, tag_of, SimState, MAX_TIMELINES, ST_LIVE, TIMELINE_OFF};
use std::ptr::{addr_of, addr_of_mut};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Process-local half of a timeline lock: fcntl locks belong to the process, so threads of
/// one process also have to exclude each other.
static LOCAL_LOCKS: [Mutex<()>; MAX_TIMELINES] = [const { Mutex::new(()) }; MAX_TIMELINES];

pub(super) struct TimelineLock<'a> {
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
pub(super) struct Engine {
    pub(super) tl: *mut DeviceTimeline,
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
                    std::ptr::write_volatile(slot, Interval { start: s.open_start, end: s.open_end, incarnation: s.open_incarnation, _pad: 0 });
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
    pub(super) fn timeline(&self, device: usize) -> *mut DeviceTimeline {
        let d = device.min(MAX_TIMELINES - 1);
        // SAFETY: the timelines lie inside the mapping, FILE_SIZE bytes long.
        unsafe { self.base.add(TIMELINE_OFF + d * DEVICE_TIMELINE_SIZE) as *mut DeviceTimeline }
    }

    pub(super) fn lock_timeline(&self, device: usize) -> TimelineLock<'_> {
        let d = device.min(MAX_TIMELINES - 1);
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
    pub(super) fn owner_alive(&self, slot: usize, gen: u32, key: u64) -> bool {
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
    pub(super) fn with_timeline<R>(&self, device: usize, f: impl FnOnce(&Engine, &mut Sched, u64) -> R) -> R {
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
            s.ctx[i] = CtxSched { active: 1, incarnation, owner_slot: slot as u32, owner_gen: gen, completed: 0, last_end: now, busy: 0 };
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
    pub fn timeline_submit(&self, c: TimelineContext, work: Work, mut on_evicted_marker: impl FnMut(u64, u64)) -> Result<u64, TimelineError> {
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
    pub fn timeline_try_submit(&self, c: TimelineContext, work: Work, mut on_evicted_marker: impl FnMut(u64, u64)) -> Result<Option<u64>, TimelineError> {
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
