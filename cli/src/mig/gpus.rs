//! What the driver says of each GPU's MIG: its mode, its GPU instance profiles with their
//! placements, and its instances with their MIG devices and processes.

use super::error::MigError;
use super::placement::{GpuLayout, Shape};
use crate::driver::calls::{Device, Nvml};
use crate::driver::mig::{GiProfile, Mig};
use fgpu_abi::nvml::NVML_DEVICE_MIG_ENABLE;
use serde::Serialize;

/// Profile indices asked (`NVML_GPU_INSTANCE_PROFILE_COUNT` is 0x11 in CUDA 12.9's nvml.h
/// and grows; an index the driver does not know answers an error and is skipped).
const PROFILE_INDICES: u32 = 32;

/// One GPU instance, its compute instances' MIG device, and who uses it.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub gpu_instance: u32,
    pub profile_id: u32,
    pub profile: String,
    pub placement: (u32, u32),
    /// (compute instance ID, MIG device UUID) for each compute instance.
    pub compute_instances: Vec<(u32, String)>,
    /// PIDs NVML lists on its MIG devices.
    pub pids: Vec<u32>,
}

/// One GPU.
#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `None`: the GPU has no MIG (`NVML_ERROR_NOT_SUPPORTED`).
    pub mig: Option<MigMode>,
    pub profiles: Vec<ProfileView>,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileView {
    pub name: String,
    pub id: u32,
    pub slices: u32,
    pub memory_mib: u64,
    pub sms: u32,
    pub instance_count: u32,
    /// Every placement (first slice, slice count).
    pub placements: Vec<(u32, u32)>,
    /// Its engines (copy engines, decoders, encoders, jpegs, ofas), beside its other fields.
    #[serde(flatten)]
    pub engines: crate::driver::mig::Engines,
}

impl Gpu {
    pub fn mig_on(&self) -> bool {
        self.mig.is_some_and(|m| m.current)
    }

    /// The rule's view of it.
    pub fn layout(&self) -> GpuLayout {
        GpuLayout {
            index: self.index,
            shapes: self.profiles.iter().map(|p| Shape { id: p.id, instance_count: p.instance_count, placements: p.placements.clone() }).collect(),
            taken: self.instances.iter().map(|i| (i.profile_id, i.placement.0, i.placement.1)).collect(),
        }
    }

    /// The profile named `name` (`3g.40gb`, case and a `MIG ` prefix aside) or of ID `name`.
    pub fn profile(&self, name: &str) -> Option<&ProfileView> {
        let wanted = name.trim().to_ascii_lowercase();
        let wanted = wanted.strip_prefix("mig ").unwrap_or(&wanted);
        self.profiles.iter().find(|p| p.name.eq_ignore_ascii_case(wanted) || wanted.parse::<u32>() == Ok(p.id))
    }
}

/// NVML opened and initialised, and its MIG calls; `Err` says why not.
pub fn open() -> Result<Nvml, MigError> {
    let nvml = Nvml::open().map_err(|e| MigError::Driver(format!("cannot load the NVIDIA driver's NVML: {e}")))?;
    match nvml.init() {
        Some(Ok(())) => Ok(nvml),
        Some(Err(rc)) => Err(MigError::Driver(format!("nvmlInit failed (NVML error {rc})"))),
        None => Err(MigError::Driver("libnvidia-ml.so.1 has no nvmlInit".into())),
    }
}

/// Every GPU as the driver describes it.
pub fn scan(nvml: &Nvml, mig: &Mig<'_>) -> Result<Vec<Gpu>, MigError> {
    let count = match nvml.device_count() {
        Some(Ok(n)) => n,
        Some(Err(rc)) => return Err(MigError::Driver(format!("nvmlDeviceGetCount failed (NVML error {rc})"))),
        None => return Err(MigError::Driver("libnvidia-ml.so.1 has no nvmlDeviceGetCount".into())),
    };
    let mut gpus = Vec::new();
    for index in 0..count {
        let Some(Ok(device)) = nvml.device(index) else { continue };
        gpus.push(gpu(nvml, mig, index, device));
    }
    Ok(gpus)
}

fn gpu(nvml: &Nvml, mig: &Mig<'_>, index: u32, device: Device<'_>) -> Gpu {
    let mode = mig.mode(device).ok().map(|(c, p)| MigMode { current: c == NVML_DEVICE_MIG_ENABLE, pending: p == NVML_DEVICE_MIG_ENABLE });
    let mut gpu = Gpu {
        index,
        uuid: nvml.uuid(device).unwrap_or_default(),
        name: nvml.name(device).unwrap_or_default(),
        mig: mode,
        profiles: Vec::new(),
        instances: Vec::new(),
    };
    if !gpu.mig_on() {
        return gpu;
    }
    let profiles: Vec<GiProfile> = (0..PROFILE_INDICES).filter_map(|i| mig.gi_profile(device, i).ok()).collect();
    let devices = mig.mig_devices(device).unwrap_or_default();
    for p in &profiles {
        let placements = mig.gi_placements(device, p.id).unwrap_or_default().iter().map(|pl| (pl.start, pl.size)).collect();
        gpu.profiles.push(ProfileView {
            name: p.name.clone(),
            id: p.id,
            slices: p.slices,
            memory_mib: p.memory_mib,
            sms: p.sms,
            instance_count: p.instance_count,
            placements,
            engines: p.engines,
        });
        for gi in mig.gpu_instances(device, p.id).unwrap_or_default() {
            let Ok(info) = mig.gi_info(gi) else { continue };
            let mut instance = Instance {
                gpu_instance: info.id,
                profile_id: p.id,
                profile: p.name.clone(),
                placement: (info.placement.start, info.placement.size),
                compute_instances: Vec::new(),
                pids: Vec::new(),
            };
            for (g, c, handle) in devices.iter().filter(|(g, _, _)| *g == info.id) {
                let _ = g;
                instance.compute_instances.push((*c, nvml.uuid(*handle).unwrap_or_default()));
                instance.pids.extend(crate::driver::lists::device_pids(nvml, *handle).unwrap_or_default());
            }
            instance.pids.sort_unstable();
            instance.pids.dedup();
            gpu.instances.push(instance);
        }
    }
    gpu.instances.sort_by_key(|i| i.gpu_instance);
    gpu
}
