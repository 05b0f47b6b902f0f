//! What the node has: its GPUs and driver, read by `fgpu __driver-probe` (NVML, in a child
//! process). In a container the driver's libraries come from the host's driver root,
//! mounted read-only (`--driver-root`): no container runtime hook or runtime class is
//! needed for the plugin itself.

use std::path::{Path, PathBuf};

/// One GPU as the driver probe reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub product: String,
    pub total: u64,
}

/// The node's driver, for the devices' attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// nvmlSystemGetDriverVersion, such as `570.26` or `535.104.05`.
    pub driver_version: Option<String>,
    /// cuDriverGetVersion, such as 12080.
    pub cuda_version: Option<i32>,
}

/// What the node has, as last probed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub driver: DriverInfo,
    /// The MIG of the GPUs this driver partitions (managed, in MIG mode): read with
    /// [`crate::partitions::from_listing`]; empty where none is.
    pub mig: Vec<crate::partitions::MigGpu>,
}

/// Where a driver installation keeps `libnvidia-ml.so.1`, under its root: the
/// distributions' library directories, in the order the dynamic loader of each would look.
const LIBRARY_DIRS: [&str; 9] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "lib",
    "usr/local/nvidia/lib64",
];

/// The directory under `root` that holds `libnvidia-ml.so.1`.
pub fn nvml_dir(root: &Path) -> Result<PathBuf, String> {
    LIBRARY_DIRS.iter().map(|d| root.join(d)).find(|d| d.join("libnvidia-ml.so.1").exists()).ok_or_else(|| {
        format!(
            "no libnvidia-ml.so.1 under the driver root {} (looked in {}); mount the host's driver root there (/ for a driver installed on the host, /run/nvidia/driver for the GPU operator's driver container)",
            root.display(),
            LIBRARY_DIRS.join(", ")
        )
    })
}

/// The node's GPUs and driver. `driver_root`: read NVML from there.
pub fn probe(fgpu: &Path, driver_root: Option<&Path>) -> Result<Inventory, String> {
    let library_dir = driver_root.map(nvml_dir).transpose()?;
    let probe = fgpu_cdi::probe::run_with_libraries(fgpu, library_dir.as_deref()).map_err(|e| e.to_string())?;
    if !probe.nvml.loaded || probe.nvml.device_count.is_none() {
        let why = probe.nvml.error.clone().unwrap_or_else(|| "it lists no GPU".into());
        return Err(format!("cannot read the GPUs through NVML (libnvidia-ml.so.1: {why})"));
    }
    let mut gpus = Vec::new();
    for d in &probe.devices {
        if d.uuid.is_empty() || d.total_bytes == 0 {
            return Err(format!("NVML did not give the UUID and memory size of GPU {}", d.index));
        }
        gpus.push(GpuInfo { index: d.index, uuid: d.uuid.clone(), product: d.name.clone(), total: d.total_bytes });
    }
    let driver = DriverInfo { driver_version: probe.nvml.driver_version.clone(), cuda_version: probe.cuda.cuda_version.or(probe.nvml.cuda_version) };
    Ok(Inventory { gpus, driver, mig: Vec::new() })
}

/// The GPUs in one line, for the log.
pub fn describe(inventory: &Inventory) -> String {
    let gpus: Vec<String> =
        inventory.gpus.iter().map(|g| format!("GPU {} {} ({}, {})", g.index, g.uuid, g.product, crate::quantity::format_bytes(g.total))).collect();
    if gpus.is_empty() {
        "no GPU".into()
    } else {
        gpus.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_is_found_under_a_driver_root() {
        let root = std::env::temp_dir().join(format!("fgpu-driver-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
        let err = nvml_dir(&root).unwrap_err();
        assert!(err.contains("no libnvidia-ml.so.1") && err.contains("/run/nvidia/driver"), "{err}");
        std::fs::write(root.join("usr/lib64/libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(nvml_dir(&root).unwrap(), root.join("usr/lib64"));
        std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(nvml_dir(&root).unwrap(), root.join("usr/lib/x86_64-linux-gnu"), "the multiarch directory first");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
