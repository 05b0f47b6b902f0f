//! MIG devices (compute instances as CUDA and NVML see them): finding them, binding a
//! process to one, the memory of their GPU instances and the work on their timelines.

use super::placement::GI_IDS;
use super::*;
use crate::{format_gpu_uuid, timeline, timeline_index, SimState, MAX_DEVICES};
use std::sync::atomic::Ordering;

impl MigDevice {
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub fn uuid_string(&self) -> String {
        format!("MIG-{}", &format_gpu_uuid(&self.compute_instance.uuid)[4..])
    }
    /// Its timeline (for [`SimState::device_busy`] and the simulated CUDA library).
    pub fn timeline(&self) -> usize {
        timeline_index(self.device, self.compute_instance.lane as usize)
    }
}

impl SimState {
    // ---- MIG devices ----

    /// The MIG devices of GPU `device` (none when MIG is off), by GPU instance ID then
    /// compute instance ID.
    pub fn mig_devices(&self, device: usize) -> Vec<MigDevice> {
        if self.mig_enabled(device).is_err() {
            return Vec::new();
        }
        let _g = self.mig_lock(device);
        let mut out = Vec::new();
        for gi in self.gis_locked(device) {
            for ci in self.cis_locked(&gi) {
                out.push(MigDevice { device, index: out.len() as u32, gpu_instance: gi.clone(), compute_instance: ci });
            }
        }
        out
    }

    /// The MIG device (GPU instance `gi`, compute instance `ci`) of GPU `device`.
    pub fn mig_device(&self, device: usize, gi: u32, ci: u32) -> Option<MigDevice> {
        self.mig_devices(device).into_iter().find(|m| m.gpu_instance.id == gi && m.compute_instance.id == ci)
    }

    /// The MIG device whose UUID (`MIG-...`) starts with `uuid` (ASCII case ignored), if
    /// exactly one does.
    pub fn mig_device_by_uuid(&self, uuid: &str) -> Option<MigDevice> {
        let want = uuid.trim().to_ascii_lowercase();
        let mut found: Vec<MigDevice> =
            (0..self.device_count()).flat_map(|d| self.mig_devices(d)).filter(|m| m.uuid_string().to_ascii_lowercase().starts_with(&want)).collect();
        (found.len() == 1).then(|| found.remove(0))
    }

    /// Binds the process in `slot` to MIG device `mig` (at `cuInit`): from then on its
    /// memory on that GPU counts against the GPU instance and the compute instance cannot
    /// be destroyed while it lives. `NOT_FOUND` when the compute instance is gone.
    pub fn bind_mig_device(&self, slot: usize, mig: &MigDevice) -> Result<(), MigError> {
        let _g = self.mig_lock(mig.device);
        let gi = self.gi_locked(mig.device, mig.gpu_instance.id).ok_or(MigError::NotFound)?;
        let ci = self.ci_locked(&gi, mig.compute_instance.id).ok_or(MigError::NotFound)?;
        if ci.serial != mig.compute_instance.serial {
            return Err(MigError::NotFound);
        }
        self.slot(slot).mig[mig.device].store(mig.binding(), Ordering::Release);
        Ok(())
    }

    /// The MIG device the process in `slot` is bound to on GPU `device`.
    pub fn bound_mig_device(&self, slot: usize, device: usize) -> Option<(u32, u32)> {
        unbinding(self.slot(slot).mig[device.min(MAX_DEVICES - 1)].load(Ordering::Acquire))
    }

    /// The allocation counter of GPU instance `gi` (processes not yet reclaimed included).
    pub(crate) fn gi_used_counter(&self, device: usize, gi: u32) -> &AtomicU64 {
        &self.mig_rec(device).gis[(gi as usize).min(GI_IDS - 1)].used
    }

    /// Memory of GPU instance `gi` (0 if it does not exist).
    pub(crate) fn gi_memory(&self, device: usize, gi: u32) -> u64 {
        let g = &self.mig_rec(device).gis[(gi as usize).min(GI_IDS - 1)];
        if g.live.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.product().gi_profile(g.profile.load(Ordering::Acquire)).map_or(0, |p| p.memory_bytes())
    }

    /// Ground truth: bytes the live processes bound to GPU instance `gi` of `device` hold.
    pub fn gpu_instance_used(&self, device: usize, gi: u32) -> u64 {
        self.processes()
            .iter()
            .filter(|p| p.mig.get(device).copied().flatten().is_some_and(|(g, _)| g == gi))
            .map(|p| p.per_device_used.get(device).copied().unwrap_or(0))
            .sum()
    }

    /// Free memory of GPU instance `gi` as the driver reports it.
    pub fn gpu_instance_free(&self, device: usize, gi: u32) -> u64 {
        self.gi_memory(device, gi).saturating_sub(self.gpu_instance_used(device, gi))
    }

    /// Ground truth of what ran on MIG device (`gi`, `ci`) of `device`, like
    /// [`SimState::device_busy`] for a GPU.
    pub fn mig_device_busy(&self, device: usize, gi: u32, ci: u32, from_ns: u64, to_ns: u64) -> Option<timeline::BusyWindow> {
        let m = self.mig_device(device, gi, ci)?;
        Some(self.device_busy(m.timeline(), from_ns, to_ns))
    }
}
