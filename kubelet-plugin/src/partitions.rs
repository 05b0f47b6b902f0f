//! MIG partitions: the GPU instances a managed GPU in MIG mode can hold, one per (profile,
//! placement), as this driver names them. What the driver says of each GPU's MIG is read
//! from `fgpu mig list --json` (the command line owns NVML's MIG calls and the record of
//! the instances fgpu created); this module only reads that document and names what it
//! lists. Publishing the partitions is [`crate::slices`]'s, creating them at prepare
//! [`crate::plugin`]'s.

use serde::Deserialize;

/// One GPU instance profile of a GPU, as `fgpu mig list --json` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MigProfile {
    /// `3g.40gb`, `1g.10gb+me`.
    pub name: String,
    /// NVML's GPU instance profile ID.
    pub id: u32,
    /// Compute slices (the `3` of `3g`).
    pub slices: u32,
    pub memory_mib: u64,
    pub sms: u32,
    /// Every placement, as NVML gives it: (first memory slice, memory slice count).
    pub placements: Vec<(u32, u32)>,
    /// Its engines, as NVML gives them (0 where the listing has none).
    #[serde(default)]
    pub copy_engines: u32,
    #[serde(default)]
    pub decoders: u32,
    #[serde(default)]
    pub encoders: u32,
    #[serde(default)]
    pub jpegs: u32,
    #[serde(default)]
    pub ofas: u32,
}

/// One GPU's MIG, as `fgpu mig list --json` gives it (fields not read here are passed over).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MigGpu {
    pub index: u32,
    pub uuid: String,
    /// `None`: the GPU has no MIG.
    pub mig: Option<MigMode>,
    #[serde(default)]
    pub profiles: Vec<MigProfile>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

impl MigGpu {
    /// Whether the GPU is in MIG mode now (a pending change counts only after a reset).
    pub fn enabled(&self) -> bool {
        self.mig.is_some_and(|m| m.current)
    }
}

#[derive(Deserialize)]
struct Listing {
    gpus: Vec<MigGpu>,
}

/// The GPUs of a `fgpu mig list --json` document.
pub fn from_listing(json: &str) -> Result<Vec<MigGpu>, serde_json::Error> {
    serde_json::from_str::<Listing>(json).map(|l| l.gpus)
}

/// One partition: a GPU instance of `profile` at `start` on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub profile: String,
    pub profile_id: u32,
    /// The placement: first memory slice, memory slice count.
    pub start: u32,
    pub size: u32,
    /// The instance's memory, in bytes.
    pub memory: u64,
    pub sms: u32,
}

impl Partition {
    /// Its device name.
    pub fn device_name(&self) -> String {
        device_name(self.gpu_index, &self.profile, self.start)
    }
}

/// The device name of the partition of `profile` at memory slice `start` on GPU `index`:
/// `gpu-0-mig-3g-40gb-4`, `gpu-1-mig-1g-10gb-me-0` (a DNS label: every character of the
/// profile's name that is not a lowercase letter or a digit becomes `-`). Unique on a
/// node: a GPU's profiles differ in their names' letters and digits, and a profile's
/// placements in their first slice.
pub fn device_name(index: u32, profile: &str, start: u32) -> String {
    let profile: String = profile.chars().map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' }).collect();
    format!("gpu-{index}-mig-{profile}-{start}")
}

/// Every partition of these GPUs (those in MIG mode), profile by profile, placements in
/// NVML's order.
pub fn partitions(gpus: &[MigGpu]) -> Vec<Partition> {
    let mut out = Vec::new();
    for gpu in gpus.iter().filter(|g| g.enabled()) {
        for p in &gpu.profiles {
            for &(start, size) in &p.placements {
                out.push(Partition {
                    gpu_index: gpu.index,
                    gpu_uuid: gpu.uuid.clone(),
                    profile: p.name.clone(),
                    profile_id: p.id,
                    start,
                    size,
                    memory: p.memory_mib << 20,
                    sms: p.sms,
                });
            }
        }
    }
    out
}

/// The partition a device name of this driver stands for, among these GPUs'.
pub fn find(gpus: &[MigGpu], device: &str) -> Option<Partition> {
    if !device.contains("-mig-") {
        return None;
    }
    partitions(gpus).into_iter().find(|p| p.device_name() == device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An A100 80GB's first profiles, as `fgpu mig list --json` printed them on the simulator.
    const LISTING: &str = r#"{"gpus": [
        {"index": 0, "uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB", "mig": {"current": true, "pending": true},
         "profiles": [
            {"name": "1g.10gb", "id": 19, "slices": 1, "memory_mib": 9728, "sms": 14, "instance_count": 7, "placements": [[0,1],[1,1],[2,1],[3,1],[4,1],[5,1],[6,1]]},
            {"name": "3g.40gb", "id": 9, "slices": 3, "memory_mib": 40192, "sms": 42, "instance_count": 2, "placements": [[0,4],[4,4]]},
            {"name": "1g.10gb+me", "id": 20, "slices": 1, "memory_mib": 9728, "sms": 14, "instance_count": 1, "placements": [[0,1],[6,1]]}],
         "instances": [], "free": [], "fgpu_created": [], "users": []},
        {"index": 1, "uuid": "GPU-b", "name": "NVIDIA A100-SXM4-80GB", "mig": {"current": false, "pending": false},
         "profiles": [{"name": "7g.80gb", "id": 0, "slices": 7, "memory_mib": 80896, "sms": 98, "instance_count": 1, "placements": [[0,8]]}]},
        {"index": 2, "uuid": "GPU-c", "name": "Tesla T4", "mig": null, "profiles": []}]}"#;

    #[test]
    fn the_listing_gives_every_placement_of_the_gpus_in_mig_mode() {
        let gpus = from_listing(LISTING).unwrap();
        assert_eq!(gpus.len(), 3);
        assert!(gpus[0].enabled() && !gpus[1].enabled() && !gpus[2].enabled());
        let all = partitions(&gpus);
        assert_eq!(all.len(), 7 + 2 + 2, "GPU 1 is not in MIG mode, GPU 2 has none");
        let names: Vec<String> = all.iter().map(Partition::device_name).collect();
        assert_eq!(names[0], "gpu-0-mig-1g-10gb-0");
        assert_eq!(names[8], "gpu-0-mig-3g-40gb-4");
        assert_eq!(names[10], "gpu-0-mig-1g-10gb-me-6");
        let unique: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        let p = find(&gpus, "gpu-0-mig-3g-40gb-4").unwrap();
        assert_eq!((p.profile.as_str(), p.profile_id, p.start, p.size, p.memory, p.gpu_uuid.as_str()), ("3g.40gb", 9, 4, 4, 40192 << 20, "GPU-a"));
        assert_eq!(find(&gpus, "gpu-1-mig-7g-80gb-0"), None, "not in MIG mode");
        assert_eq!(find(&gpus, "gpu-0"), None);
        assert_eq!(find(&gpus, "gpu-0-mig-3g-40gb-1"), None, "no such placement");
    }
}
