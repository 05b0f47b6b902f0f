//! The MIG calls of [`SimState`]: modes, creation and destruction of instances under the
//! per-GPU lock, and lookups (MIG devices and the processes bound to them: `devices.rs`).

use super::placement::{default_start, gi_id, span_mask, GI_IDS};
use super::*;
use crate::{flock, splitmix, SimState, MAX_DEVICES};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

/// Process-local half of the MIG locks (fcntl locks belong to the process).
static LOCAL_LOCKS: [Mutex<()>; MAX_DEVICES] = [const { Mutex::new(()) }; MAX_DEVICES];

pub(super) struct MigLock<'a> {
    state: &'a SimState,
    device: usize,
    _local: MutexGuard<'static, ()>,
}

impl Drop for MigLock<'_> {
    fn drop(&mut self) {
        let _ = flock(self.state.fd, libc::F_SETLK, libc::F_UNLCK, MIG_LOCK_BYTE + self.device as i64);
    }
}

/// The UUID bytes of compute instance `serial` of GPU `device` in a state file made with
/// `nonce`: random-looking, new at each creation, with the RFC 4122 version-5 and variant
/// bits the driver's MIG UUIDs carry.
fn mig_uuid(nonce: u64, device: usize, serial: u32) -> [u8; 16] {
    let a = splitmix(nonce ^ ((device as u64) << 40) ^ serial as u64 ^ 0x4D49_4700_0000_0000);
    let b = splitmix(a ^ 0xA5A5_5A5A_0F0F_F0F0);
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&a.to_be_bytes());
    u[8..].copy_from_slice(&b.to_be_bytes());
    u[6] = (u[6] & 0x0F) | 0x50;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}

impl SimState {
    pub(super) fn mig_rec(&self, device: usize) -> &MigRec {
        let d = device.min(MAX_DEVICES - 1);
        // SAFETY: the MIG records lie inside the mapping (FILE_SIZE covers them); index clamped.
        unsafe { &*(self.base.add(crate::MIG_OFF + d * MIG_REC_SIZE) as *const MigRec) }
    }

    pub(super) fn mig_lock(&self, device: usize) -> MigLock<'_> {
        let d = device.min(MAX_DEVICES - 1);
        let local = LOCAL_LOCKS[d].lock().unwrap_or_else(|e| e.into_inner());
        // Blocking; a holder that dies releases it.
        let _ = flock(self.fd, libc::F_SETLKW, libc::F_WRLCK, MIG_LOCK_BYTE + d as i64);
        MigLock { state: self, device: d, _local: local }
    }

    /// The simulated product (`FGPU_SIM_PRODUCT`).
    pub fn product(&self) -> Product {
        Product::from_code(self.header().product)
    }

    fn mig_capable(&self, device: usize) -> Result<(), MigError> {
        if device >= self.device_count() || !self.product().has_mig() {
            return Err(MigError::NotSupported);
        }
        Ok(())
    }

    pub(super) fn mig_enabled(&self, device: usize) -> Result<(), MigError> {
        self.mig_capable(device)?;
        if self.mig_rec(device).current.load(Ordering::Acquire) == 0 {
            return Err(MigError::NotSupported);
        }
        Ok(())
    }

    /// (current, pending) MIG mode of GPU `device`.
    pub fn mig_mode(&self, device: usize) -> Result<(bool, bool), MigError> {
        self.mig_capable(device)?;
        let r = self.mig_rec(device);
        Ok((r.current.load(Ordering::Acquire) != 0, r.pending.load(Ordering::Acquire) != 0))
    }

    /// Whether GPU `device` is in MIG mode now.
    pub fn mig_on(&self, device: usize) -> bool {
        self.mig_mode(device).is_ok_and(|(current, _)| current)
    }

    /// Live processes (and dead ones whose memory is not freed yet) that hold GPU `device`:
    /// a context or memory there, or a MIG device bound. `(slot, binding)`.
    fn holders(&self, device: usize) -> Vec<(usize, u32)> {
        let key = crate::owner_key();
        let mut out = Vec::new();
        for s in 0..crate::MAX_PROCESSES {
            if self.slot_alive(s, key).is_none() && !self.slot_dying(s) {
                continue;
            }
            let rec = self.slot(s);
            let bound = rec.mig[device].load(Ordering::Acquire);
            if rec.contexts[device].load(Ordering::Acquire) > 0 || rec.used[device].load(Ordering::Acquire) > 0 || bound != 0 {
                out.push((s, bound));
            }
        }
        out
    }

    /// `nvmlDeviceSetMigMode`: the pending mode becomes `enable`; the outer error is the
    /// call's, the inner the activation status. Hopper activates at once unless processes
    /// hold the GPU (`IN_USE`; the change stays pending); Ampere needs a GPU reset
    /// (`RESET_REQUIRED`, pending until [`SimState::reset_gpu`]). Disabling destroys every
    /// instance.
    pub fn set_mig_mode(&self, device: usize, enable: bool) -> Result<Result<(), MigError>, MigError> {
        self.mig_capable(device)?;
        self.reclaim_dead();
        let _g = self.mig_lock(device);
        let r = self.mig_rec(device);
        r.pending.store(enable as u32, Ordering::Release);
        if (r.current.load(Ordering::Acquire) != 0) == enable {
            return Ok(Ok(()));
        }
        if !self.holders(device).is_empty() {
            return Ok(Err(MigError::InUse));
        }
        if self.product().mig_needs_reset() {
            return Ok(Err(MigError::ResetRequired));
        }
        self.apply_mode_locked(device, enable);
        Ok(Ok(()))
    }

    /// Makes `enable` the current mode, destroying every instance (caller holds the lock and
    /// has checked that nothing holds the GPU).
    fn apply_mode_locked(&self, device: usize, enable: bool) {
        let r = self.mig_rec(device);
        for gi in &r.gis {
            for ci in &gi.cis {
                ci.live.store(0, Ordering::Release);
            }
            gi.used.store(0, Ordering::Release);
            gi.live.store(0, Ordering::Release);
        }
        r.current.store(enable as u32, Ordering::Release);
        r.pending.store(enable as u32, Ordering::Release);
    }

    /// A GPU reset (`nvidia-smi -r`): refused while processes hold the GPU; destroys every
    /// instance and makes the pending MIG mode current.
    pub fn reset_gpu(&self, device: usize) -> Result<(), MigError> {
        if device >= self.device_count() {
            return Err(MigError::InvalidArgument);
        }
        self.reclaim_dead();
        if !self.product().has_mig() {
            return if self.holders(device).is_empty() { Ok(()) } else { Err(MigError::InUse) };
        }
        let _g = self.mig_lock(device);
        if !self.holders(device).is_empty() {
            return Err(MigError::InUse);
        }
        let pending = self.mig_rec(device).pending.load(Ordering::Acquire) != 0;
        self.apply_mode_locked(device, pending);
        Ok(())
    }

    /// A reboot of the machine, for what MIG keeps: every GPU reset, Ampere with its
    /// pending mode (its InfoROM keeps it), Hopper with MIG off (it does not persist).
    /// Refused while processes hold any GPU.
    pub fn reboot(&self) -> Result<(), MigError> {
        self.reclaim_dead();
        if (0..self.device_count()).any(|d| !self.holders(d).is_empty()) {
            return Err(MigError::InUse);
        }
        for d in 0..self.device_count() {
            if !self.product().has_mig() {
                continue;
            }
            let _g = self.mig_lock(d);
            let keep = self.product().mig_needs_reset() && self.mig_rec(d).pending.load(Ordering::Acquire) != 0;
            self.apply_mode_locked(d, keep);
        }
        Ok(())
    }

    /// Sets MIG mode at creation of the state file (`FGPU_SIM_MIG`), no lock needed.
    pub(crate) fn init_mig(&self, device: usize, enabled: bool) {
        let r = self.mig_rec(device);
        r.current.store(enabled as u32, Ordering::Relaxed);
        r.pending.store(enabled as u32, Ordering::Relaxed);
    }

    // ---- reading the instances (callers hold the lock) ----

    pub(super) fn gi_locked(&self, device: usize, id: u32) -> Option<GpuInstance> {
        let g = self.mig_rec(device).gis.get(id as usize)?;
        if g.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let profile = *self.product().gi_profile(g.profile.load(Ordering::Acquire))?;
        Some(GpuInstance { device, id, profile, start: g.start.load(Ordering::Acquire), size: g.size.load(Ordering::Acquire) })
    }

    pub(super) fn gis_locked(&self, device: usize) -> Vec<GpuInstance> {
        (0..GI_IDS as u32).filter_map(|id| self.gi_locked(device, id)).collect()
    }

    pub(super) fn ci_locked(&self, gi: &GpuInstance, id: u32) -> Option<ComputeInstance> {
        let c = self.mig_rec(gi.device).gis[gi.id as usize].cis.get(id as usize)?;
        if c.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let index = c.profile.load(Ordering::Acquire);
        let profile = self.product().ci_profiles(&gi.profile).into_iter().find(|p| p.index == index)?;
        let mut uuid = [0u8; 16];
        for (k, w) in c.uuid.iter().enumerate() {
            uuid[k * 4..k * 4 + 4].copy_from_slice(&w.load(Ordering::Acquire).to_be_bytes());
        }
        Some(ComputeInstance {
            device: gi.device,
            gpu_instance: gi.id,
            id,
            profile,
            start: c.start.load(Ordering::Acquire),
            size: c.size.load(Ordering::Acquire),
            serial: c.serial.load(Ordering::Acquire),
            uuid,
            lane: c.lane.load(Ordering::Acquire),
        })
    }

    pub(super) fn cis_locked(&self, gi: &GpuInstance) -> Vec<ComputeInstance> {
        (0..CI_IDS as u32).filter_map(|id| self.ci_locked(gi, id)).collect()
    }

    fn occupied_locked(&self, device: usize) -> u32 {
        self.gis_locked(device).iter().fold(0, |m, g| m | span_mask(g.start, g.size))
    }

    // ---- GPU instances ----

    /// The GPU instances of GPU `device`, by ID.
    pub fn gpu_instances(&self, device: usize) -> Result<Vec<GpuInstance>, MigError> {
        self.mig_enabled(device)?;
        let _g = self.mig_lock(device);
        Ok(self.gis_locked(device))
    }

    /// The GPU instance `id` of GPU `device`.
    pub fn gpu_instance(&self, device: usize, id: u32) -> Result<GpuInstance, MigError> {
        self.mig_enabled(device)?;
        let _g = self.mig_lock(device);
        self.gi_locked(device, id).ok_or(MigError::NotFound)
    }

    fn gi_profile_checked(&self, device: usize, profile_id: u32) -> Result<GiProfile, MigError> {
        self.mig_enabled(device)?;
        self.product().gi_profile_by_id(profile_id).copied().ok_or(MigError::InvalidArgument)
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement of the profile,
    /// free or not (start, size).
    pub fn gpu_instance_placements(&self, device: usize, profile_id: u32) -> Result<Vec<(u32, u32)>, MigError> {
        let p = self.gi_profile_checked(device, profile_id)?;
        Ok(p.placement_starts().iter().map(|&s| (s, p.memory_slices)).collect())
    }

    /// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more instances of the profile
    /// fit now (its placements are disjoint, so: the free ones, up to its instance count).
    pub fn gpu_instance_capacity(&self, device: usize, profile_id: u32) -> Result<u32, MigError> {
        let p = self.gi_profile_checked(device, profile_id)?;
        let _g = self.mig_lock(device);
        let occupied = self.occupied_locked(device);
        let free = p.placement_starts().iter().filter(|&&s| span_mask(s, p.memory_slices) & occupied == 0).count() as u32;
        let existing = self.gis_locked(device).iter().filter(|g| g.profile.id == profile_id).count() as u32;
        Ok(free.min(p.count.saturating_sub(existing)))
    }

    /// `nvmlDeviceCreateGpuInstance(WithPlacement)`: a GPU instance of profile `profile_id`
    /// at `start` (a memory slice), or where the driver's rule puts it
    /// ([`placement::default_start`]). `INSUFFICIENT_RESOURCES` when the placement is taken
    /// or none is free, or the profile has all its instances.
    pub fn create_gpu_instance(&self, device: usize, profile_id: u32, start: Option<u32>) -> Result<GpuInstance, MigError> {
        let p = self.gi_profile_checked(device, profile_id)?;
        if let Some(s) = start {
            if !p.placement_starts().contains(&s) {
                return Err(MigError::InvalidArgument);
            }
        }
        let _g = self.mig_lock(device);
        let occupied = self.occupied_locked(device);
        let existing = self.gis_locked(device).iter().filter(|g| g.profile.id == profile_id).count() as u32;
        if existing >= p.count {
            return Err(MigError::InsufficientResources);
        }
        let s = match start {
            Some(s) if span_mask(s, p.memory_slices) & occupied != 0 => return Err(MigError::InsufficientResources),
            Some(s) => s,
            None => default_start(self.product().gi_profiles(), &p, occupied).ok_or(MigError::InsufficientResources)?,
        };
        let id = gi_id(s, p.memory_slices).ok_or(MigError::InvalidArgument)?;
        let g = &self.mig_rec(device).gis[id as usize];
        for ci in &g.cis {
            ci.live.store(0, Ordering::Release);
        }
        g.profile.store(p.index, Ordering::Release);
        g.start.store(s, Ordering::Release);
        g.size.store(p.memory_slices, Ordering::Release);
        g.used.store(0, Ordering::Release);
        g.live.store(1, Ordering::Release);
        Ok(GpuInstance { device, id, profile: p, start: s, size: p.memory_slices })
    }

    /// `nvmlGpuInstanceDestroy`: `IN_USE` while it has compute instances or processes.
    pub fn destroy_gpu_instance(&self, device: usize, id: u32) -> Result<(), MigError> {
        self.mig_enabled(device)?;
        self.reclaim_dead();
        let _g = self.mig_lock(device);
        let gi = self.gi_locked(device, id).ok_or(MigError::NotFound)?;
        let bound = self.holders(device).iter().any(|(_, b)| unbinding(*b).is_some_and(|(g, _)| g == id));
        if !self.cis_locked(&gi).is_empty() || bound {
            return Err(MigError::InUse);
        }
        self.mig_rec(device).gis[id as usize].live.store(0, Ordering::Release);
        Ok(())
    }

    // ---- compute instances ----

    fn ci_profile_checked(&self, gi: &GpuInstance, profile: u32) -> Result<CiProfile, MigError> {
        self.product().ci_profiles(&gi.profile).into_iter().find(|p| p.index == profile).ok_or(MigError::NotSupported)
    }

    /// The compute instance profiles of GPU instance `gi` (`nvmlGpuInstanceGetComputeInstanceProfileInfo`).
    pub fn compute_instance_profiles(&self, device: usize, gi: u32) -> Result<Vec<CiProfile>, MigError> {
        let gi = self.gpu_instance(device, gi)?;
        Ok(self.product().ci_profiles(&gi.profile))
    }

    /// The compute instances of GPU instance `gi`, by ID.
    pub fn compute_instances(&self, device: usize, gi: u32) -> Result<Vec<ComputeInstance>, MigError> {
        self.mig_enabled(device)?;
        let _g = self.mig_lock(device);
        let gi = self.gi_locked(device, gi).ok_or(MigError::NotFound)?;
        Ok(self.cis_locked(&gi))
    }

    fn ci_occupied(cis: &[ComputeInstance]) -> u32 {
        cis.iter().fold(0, |m, c| m | (((1u32 << c.size) - 1) << c.start))
    }

    /// Placements of compute instance profile `profile` in GPU instance `gi` (start, size).
    pub fn compute_instance_placements(&self, device: usize, gi: u32, profile: u32) -> Result<Vec<(u32, u32)>, MigError> {
        let gi = self.gpu_instance(device, gi)?;
        let p = self.ci_profile_checked(&gi, profile)?;
        Ok(p.starts.iter().map(|&s| (s, p.slices)).collect())
    }

    /// How many more compute instances of `profile` fit in GPU instance `gi`.
    pub fn compute_instance_capacity(&self, device: usize, gi: u32, profile: u32) -> Result<u32, MigError> {
        self.mig_enabled(device)?;
        let _g = self.mig_lock(device);
        let gi = self.gi_locked(device, gi).ok_or(MigError::NotFound)?;
        let p = self.ci_profile_checked(&gi, profile)?;
        let cis = self.cis_locked(&gi);
        let occupied = Self::ci_occupied(&cis);
        let free = p.starts.iter().filter(|&&s| (((1u32 << p.slices) - 1) << s) & occupied == 0).count() as u32;
        let existing = cis.iter().filter(|c| c.profile.index == profile).count() as u32;
        Ok(free.min(p.count.saturating_sub(existing)))
    }

    /// `nvmlGpuInstanceCreateComputeInstance(WithPlacement)`: a compute instance of
    /// `profile` in GPU instance `gi`, at `start` or the lowest free placement, with the
    /// lowest free ID, a new MIG UUID and a timeline lane of its own.
    pub fn create_compute_instance(&self, device: usize, gi: u32, profile: u32, start: Option<u32>) -> Result<ComputeInstance, MigError> {
        self.mig_enabled(device)?;
        let _g = self.mig_lock(device);
        let gi = self.gi_locked(device, gi).ok_or(MigError::NotFound)?;
        let p = self.ci_profile_checked(&gi, profile)?;
        if let Some(s) = start {
            if !p.starts.contains(&s) {
                return Err(MigError::InvalidArgument);
            }
        }
        let cis = self.cis_locked(&gi);
        let occupied = Self::ci_occupied(&cis);
        let fits = |s: u32| (((1u32 << p.slices) - 1) << s) & occupied == 0;
        let s = match start {
            Some(s) if fits(s) => s,
            Some(_) => return Err(MigError::InsufficientResources),
            None => *p.starts.iter().find(|&&s| fits(s)).ok_or(MigError::InsufficientResources)?,
        };
        let id = (0..CI_IDS as u32).find(|id| !cis.iter().any(|c| c.id == *id)).ok_or(MigError::InsufficientResources)?;
        let lanes: Vec<u32> = self.gis_locked(device).iter().flat_map(|g| self.cis_locked(g)).map(|c| c.lane).collect();
        let lane = (1..LANES as u32).find(|l| !lanes.contains(l)).ok_or(MigError::InsufficientResources)?;
        let rec = self.mig_rec(device);
        let serial = rec.created.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let uuid = mig_uuid(self.header().mig_nonce, device, serial);
        let c = &rec.gis[gi.id as usize].cis[id as usize];
        c.profile.store(p.index, Ordering::Release);
        c.start.store(s, Ordering::Release);
        c.size.store(p.slices, Ordering::Release);
        c.serial.store(serial, Ordering::Release);
        c.lane.store(lane, Ordering::Release);
        for (k, w) in c.uuid.iter().enumerate() {
            w.store(u32::from_be_bytes([uuid[k * 4], uuid[k * 4 + 1], uuid[k * 4 + 2], uuid[k * 4 + 3]]), Ordering::Release);
        }
        c.live.store(1, Ordering::Release);
        Ok(ComputeInstance { device, gpu_instance: gi.id, id, size: p.slices, profile: p, start: s, serial, uuid, lane })
    }

    /// `nvmlComputeInstanceDestroy`: `IN_USE` while a process is bound to it.
    pub fn destroy_compute_instance(&self, device: usize, gi: u32, id: u32) -> Result<(), MigError> {
        self.mig_enabled(device)?;
        self.reclaim_dead();
        let _g = self.mig_lock(device);
        let gi = self.gi_locked(device, gi).ok_or(MigError::NotFound)?;
        self.ci_locked(&gi, id).ok_or(MigError::NotFound)?;
        if self.holders(device).iter().any(|(_, b)| *b == binding(gi.id, id)) {
            return Err(MigError::InUse);
        }
        self.mig_rec(device).gis[gi.id as usize].cis[id as usize].live.store(0, Ordering::Release);
        Ok(())
    }
}
