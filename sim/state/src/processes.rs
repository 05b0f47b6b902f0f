//! The process table of [`SimState`]: live and dead processes, host PIDs, what NVML lists,
//! registration, and the memory each process allocates and frees.

use crate::*;

impl SimState {
    /// Whether slot `s` belongs to a process that died less than the exit free delay ago
    /// (its death is timed from when it is first seen): the driver still holds its memory.
    pub(crate) fn slot_dying(&self, s: usize) -> bool {
        let delay = self.header().exit_free_delay_ns;
        let slot = self.slot(s);
        if delay == 0 || st_kind(slot.state.load(Ordering::Acquire)) != ST_LIVE {
            return false;
        }
        match flock(self.fd, libc::F_GETLK, libc::F_WRLCK, Self::lock_byte(s)) {
            Ok(fl) if fl.l_type as i32 == libc::F_UNLCK => {}
            _ => return false, // alive (or unknown)
        }
        let now = now_ns().max(1);
        let died = match slot.died_ns.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => now,
            Err(earlier) => earlier,
        };
        now.saturating_sub(died) < delay
    }

    /// Bytes of device `i` the driver holds for processes: live ones, and dead ones whose
    /// memory is not freed yet (`FGPU_SIM_EXIT_FREE_DELAY`); other dead ones are skipped,
    /// not reclaimed.
    pub fn device_used(&self, i: usize) -> u64 {
        let mut sum = 0u64;
        let key = owner_key();
        for s in 0..MAX_PROCESSES {
            if self.slot_alive(s, key).is_some() || self.slot_dying(s) {
                sum = sum.saturating_add(self.slot(s).used[i.min(MAX_DEVICES - 1)].load(Ordering::Acquire));
            }
        }
        sum
    }

    /// Free memory of device `i` as the driver reports it: usable less live usage.
    pub fn device_free(&self, i: usize) -> u64 {
        self.device_usable(i).saturating_sub(self.device_used(i))
    }

    /// `Some(visible_pid)` when slot `s` is held by a live process (`visible_pid` is the
    /// holder's pid in the caller's namespace, 0 if not visible or if it is the caller).
    pub(crate) fn slot_alive(&self, s: usize, key: u64) -> Option<u32> {
        let slot = self.slot(s);
        let st = slot.state.load(Ordering::Acquire);
        if st_kind(st) != ST_LIVE {
            return None;
        }
        if st_tag(st) == tag_of(key) && slot.owner_key.load(Ordering::Acquire) == key {
            return Some(getpid());
        }
        match flock(self.fd, libc::F_GETLK, libc::F_WRLCK, Self::lock_byte(s)) {
            Ok(fl) if fl.l_type as i32 == libc::F_UNLCK => None,
            Ok(fl) => Some(fl.l_pid.max(0) as u32),
            Err(_) => Some(0),
        }
    }

    /// Live processes, with their usage. A querier in the initial PID namespace records
    /// the host pid of processes that could not know it themselves.
    pub fn processes(&self) -> Vec<SimProcess> {
        let n = self.device_count();
        let init_ns = in_init_pid_namespace();
        let mut out = Vec::new();
        let key = owner_key();
        for s in 0..MAX_PROCESSES {
            // A dead process whose memory is not freed yet is still listed, as the driver
            // lists a process until its client is freed.
            let visible = match self.slot_alive(s, key) {
                Some(visible) => visible,
                None if self.slot_dying(s) => 0,
                None => continue,
            };
            let slot = self.slot(s);
            let mut host = slot.host_pid.load(Ordering::Acquire);
            if host == 0 && init_ns && visible != 0 {
                let _ = slot.host_pid.compare_exchange(0, visible, Ordering::AcqRel, Ordering::Acquire);
                host = slot.host_pid.load(Ordering::Acquire);
            }
            out.push(SimProcess {
                slot: s,
                pid: slot.pid.load(Ordering::Acquire),
                host_pid: host,
                visible_pid: visible,
                per_device_used: (0..n).map(|d| slot.used[d].load(Ordering::Acquire)).collect(),
                per_device_contexts: (0..n).map(|d| slot.contexts[d].load(Ordering::Acquire)).collect(),
                kinds: slot.kinds.load(Ordering::Acquire),
                mig: (0..n).map(|d| mig::unbinding(slot.mig[d].load(Ordering::Acquire))).collect(),
            });
        }
        out
    }

    /// Fills in the host PID of every live process that could not know its own, as the kernel
    /// driver knows every client's: call it from a process of the host's PID namespace, every
    /// few milliseconds, for as long as processes of nested namespaces should be given their
    /// host PIDs at once (tests do, `Env::driver_watch`). Returns false outside the host's
    /// namespace, where it can do nothing.
    pub fn watch_host_pids(&self) -> bool {
        if !in_init_pid_namespace() {
            return false;
        }
        let _ = self.processes();
        self.header().host_watch_ns.store(now_ns().max(1), Ordering::Release);
        true
    }

    /// The PID NVML's process lists give `p` to the calling process, or `None` when they
    /// leave it out (see [`NvmlPidsMode`]). A caller in the host's PID namespace gets host
    /// PIDs in every mode.
    pub fn nvml_list_pid(&self, p: &SimProcess) -> Option<u32> {
        let host = (p.host_pid != 0).then_some(p.host_pid);
        if in_init_pid_namespace() {
            return host.or((p.visible_pid != 0).then_some(p.visible_pid));
        }
        match self.nvml_pids() {
            // The real driver always knows a host PID; the simulator learns a namespaced
            // process's only when a process of the host's namespace looks (docs/simulator.md),
            // and leaves it out until then rather than give a PID it does not have.
            NvmlPidsMode::Host => host,
            NvmlPidsMode::Caller | NvmlPidsMode::CallerNoMemory => (p.visible_pid != 0).then_some(p.visible_pid),
            NvmlPidsMode::None => None,
        }
    }

    /// The memory NVML's lists give for the entry `listed` (a PID from
    /// [`SimState::nvml_list_pid`]) of process `p` on device `dev`. Under
    /// [`NvmlPidsMode::CallerNoMemory`], outside the host's namespace, the driver looks the
    /// listed number up among raw host PIDs: the memory of the process whose host PID it
    /// is, usually none.
    pub fn nvml_list_memory(&self, p: &SimProcess, listed: u32, dev: usize, all: &[SimProcess]) -> u64 {
        if self.nvml_pids() == NvmlPidsMode::CallerNoMemory && !in_init_pid_namespace() {
            return all.iter().filter(|q| q.host_pid == listed && q.host_pid != 0).map(|q| q.per_device_used.get(dev).copied().unwrap_or(0)).sum();
        }
        p.per_device_used.get(dev).copied().unwrap_or(0)
    }

    /// The PID a utilisation sample of the process in `slot` (generation `gen`) carries for
    /// the calling process: in the caller modes its PID here
    /// when the caller can see it, else its raw host PID; in the others its host PID. 0 when
    /// the simulator does not know the host PID it would need. `host` caches the host PID.
    pub(crate) fn sample_pid(&self, slot: usize, gen: u32, host: &AtomicU32) -> u32 {
        let rec = self.slot(slot);
        let same = st_gen(rec.state.load(Ordering::Acquire)) == gen;
        if host.load(Ordering::Acquire) == 0 && same {
            let known = rec.host_pid.load(Ordering::Acquire);
            if known != 0 {
                host.store(known, Ordering::Release);
            }
        }
        let visible = if same { self.slot_alive(slot, owner_key()).unwrap_or(0) } else { 0 };
        if in_init_pid_namespace() {
            if host.load(Ordering::Acquire) == 0 && visible != 0 {
                let _ = rec.host_pid.compare_exchange(0, visible, Ordering::AcqRel, Ordering::Acquire);
                host.store(visible, Ordering::Release);
            }
            return host.load(Ordering::Acquire);
        }
        match self.nvml_pids() {
            NvmlPidsMode::Caller | NvmlPidsMode::CallerNoMemory if visible != 0 => visible,
            _ => host.load(Ordering::Acquire),
        }
    }

    /// Frees the memory of every process that died (its slot byte can be locked). Returns
    /// how many slots were reclaimed.
    pub fn reclaim_dead(&self) -> usize {
        let _g = SLOT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim_dead_locked()
    }

    fn reclaim_dead_locked(&self) -> usize {
        let mytag = tag_of(owner_key());
        let mut n = 0;
        for s in 0..MAX_PROCESSES {
            let slot = self.slot(s);
            let st = slot.state.load(Ordering::Acquire);
            let kind = st_kind(st);
            if kind != ST_LIVE && kind != ST_CLAIMING {
                continue;
            }
            if st_tag(st) == mytag {
                continue; // ours (from any copy of this crate in this process)
            }
            if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                continue; // alive
            }
            let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
            if self.slot_dying(s) {
                continue; // dead, but its memory is not freed yet
            }
            if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                continue;
            }
            let rec = pack(st_tag(st), st_gen(st), ST_RECLAIMING);
            if slot.state.compare_exchange(st, rec, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                for d in 0..MAX_DEVICES {
                    let u = slot.used[d].swap(0, Ordering::AcqRel);
                    let bound = mig::unbinding(slot.mig[d].swap(0, Ordering::AcqRel));
                    if u > 0 {
                        sat_sub(&self.dev(d).used, u);
                        if let Some((gi, _)) = bound {
                            sat_sub(self.gi_used_counter(d, gi), u);
                        }
                    }
                    slot.contexts[d].store(0, Ordering::Release);
                }
                slot.owner_key.store(0, Ordering::Release);
                slot.pid.store(0, Ordering::Release);
                slot.host_pid.store(0, Ordering::Release);
                slot.pidns_ino.store(0, Ordering::Release);
                slot.died_ns.store(0, Ordering::Release);
                slot.kinds.store(0, Ordering::Release);
                slot.state.store(pack(0, st_gen(st).wrapping_add(1), ST_FREE), Ordering::Release);
                n += 1;
            }
            let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
        }
        n
    }

    /// Claims a process slot for the calling process and locks its byte for the rest of
    /// the process's life. Call once per process.
    ///
    /// A process of a nested PID namespace whose host PID the simulator does not know then
    /// waits (up to [`HOST_PID_WAIT_NS`]), while a watcher runs ([`SimState::watch_host_pids`]),
    /// until the watcher has filled it in: the real driver knows every client's host PID from
    /// the start, and gives it in host-PID lists, samples and accounting (docs/simulator.md).
    pub fn register(&self) -> io::Result<usize> {
        let slot = self.claim_slot()?;
        let watched = now_ns().saturating_sub(self.header().host_watch_ns.load(Ordering::Acquire)) < WATCH_FRESH_NS;
        if watched && self.slot(slot).host_pid.load(Ordering::Acquire) == 0 {
            let deadline = now_ns() + HOST_PID_WAIT_NS;
            while self.slot(slot).host_pid.load(Ordering::Acquire) == 0 && now_ns() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(slot)
    }

    fn claim_slot(&self) -> io::Result<usize> {
        let _g = SLOT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let key = owner_key();
        let tag = tag_of(key);
        for pass in 0..2 {
            for s in 0..MAX_PROCESSES {
                let slot = self.slot(s);
                let st = slot.state.load(Ordering::Acquire);
                if st_kind(st) != ST_FREE {
                    continue;
                }
                let gen = st_gen(st).wrapping_add(1);
                let claiming = pack(tag, gen, ST_CLAIMING);
                if slot.state.compare_exchange(st, claiming, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    continue;
                }
                slot.owner_key.store(key, Ordering::Release);
                slot.pid.store(getpid(), Ordering::Release);
                slot.host_pid.store(own_host_pid(), Ordering::Release);
                slot.pidns_ino.store(ns_inode("/proc/self/ns/pid").unwrap_or(0), Ordering::Release);
                slot.died_ns.store(0, Ordering::Release);
                slot.kinds.store(own_kinds(), Ordering::Release);
                for d in 0..MAX_DEVICES {
                    slot.used[d].store(0, Ordering::Release);
                    slot.contexts[d].store(0, Ordering::Release);
                    slot.mig[d].store(0, Ordering::Release);
                }
                if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                    let _ = slot.state.compare_exchange(claiming, pack(0, gen, ST_FREE), Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
                if slot.state.compare_exchange(claiming, pack(tag, gen, ST_LIVE), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return Ok(s);
                }
                let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
            }
            if pass == 0 {
                self.reclaim_dead_locked();
            }
        }
        Err(io::Error::other("simulated driver: process table full"))
    }

    /// Takes `bytes` of device `dev` for the process in `slot`. Never lets the device's
    /// usage pass its usable memory; reclaims dead processes once before failing.
    /// Returns false when the memory is not there (CUDA_ERROR_OUT_OF_MEMORY).
    #[inline]
    pub fn try_alloc(&self, slot: usize, dev: usize, bytes: u64) -> bool {
        if dev >= self.device_count() {
            return false;
        }
        // A process bound to a MIG device takes from its GPU instance's memory; the GPU's
        // counter follows (it is then the sum of its GPU instances').
        let bound = mig::unbinding(self.slot(slot).mig[dev].load(Ordering::Acquire));
        let (counter, limit) = match bound {
            Some((gi, _)) => (self.gi_used_counter(dev, gi), self.gi_memory(dev, gi)),
            None => (&self.dev(dev).used, self.device_usable(dev)),
        };
        let mut reclaimed = false;
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            match cur.checked_add(bytes) {
                Some(next) if next <= limit => match counter.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        if bound.is_some() {
                            self.dev(dev).used.fetch_add(bytes, Ordering::AcqRel);
                        }
                        self.slot(slot).used[dev].fetch_add(bytes, Ordering::AcqRel);
                        return true;
                    }
                    Err(actual) => cur = actual,
                },
                _ => {
                    if reclaimed {
                        return false;
                    }
                    reclaimed = true;
                    if self.reclaim_dead() == 0 {
                        return false;
                    }
                    cur = counter.load(Ordering::Relaxed);
                }
            }
        }
    }

    /// Gives back `bytes` of device `dev` taken by the process in `slot`.
    #[inline]
    pub fn release(&self, slot: usize, dev: usize, bytes: u64) {
        if dev >= MAX_DEVICES || bytes == 0 {
            return;
        }
        sat_sub(&self.slot(slot).used[dev], bytes);
        sat_sub(&self.dev(dev).used, bytes);
        if let Some((gi, _)) = mig::unbinding(self.slot(slot).mig[dev].load(Ordering::Acquire)) {
            sat_sub(self.gi_used_counter(dev, gi), bytes);
        }
    }

    /// Records a CUDA context created (`+1`) or destroyed (`-1`) on `dev` by `slot`.
    pub fn count_context(&self, slot: usize, dev: usize, created: bool) {
        if dev >= MAX_DEVICES {
            return;
        }
        let c = &self.slot(slot).contexts[dev];
        if created {
            c.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(1)));
        }
    }

    /// Bytes of `dev` the process in `slot` holds.
    pub fn slot_used(&self, slot: usize, dev: usize) -> u64 {
        self.slot(slot).used[dev.min(MAX_DEVICES - 1)].load(Ordering::Acquire)
    }
}

pub(crate) fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| Some(x.saturating_sub(v)));
}
