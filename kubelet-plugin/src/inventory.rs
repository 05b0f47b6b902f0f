//! What the node has: its GPUs and driver, read by `fgpu __driver-probe` (NVML, in a child
//! process). In a container the driver's libraries come from the host's driver root,
//! mounted read-only (`--driver-root`): no container runtime hook or runtime class is
//! needed for the plugin itself. The MIG of the GPUs an operator lets this driver partition
//! (`--mig-gpus`) is read by `fgpu mig list --json`, run the same way.

use crate::mig::ListError;
use crate::partitions::{self, MigGpu};
use std::path::{Path, PathBuf};
use std::str::FromStr;

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
    pub mig: Vec<MigGpu>,
    /// What the MIG probe has to say (a managed GPU with MIG off, a failed `fgpu mig
    /// list`): logged once each, when it first appears.
    pub mig_notes: Vec<String>,
}

/// Why the node's GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("no libnvidia-ml.so.1 under the driver root {} (looked in {}); mount the host's driver root there (/ for a driver installed on the host, /run/nvidia/driver for the GPU operator's driver container)", root.display(), LIBRARY_DIRS.join(", "))]
    NoNvml { root: PathBuf },
    #[error(transparent)]
    Probe(#[from] fgpu_cdi::probe::ProbeError),
    #[error("cannot read the GPUs through NVML (libnvidia-ml.so.1: {why})")]
    Nvml { why: String },
    #[error("NVML did not give the UUID and memory size of GPU {index}")]
    Incomplete { index: u32 },
}

/// One GPU named in `--mig-gpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    Index(u32),
    /// `GPU-...`, compared without regard to case.
    Uuid(String),
}

/// The GPUs this driver may partition (`--mig-gpus`): none unless an operator says so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Managed {
    #[default]
    None,
    All,
    Listed(Vec<GpuRef>),
}

/// A `--mig-gpus` item that names no GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagedError {
    #[error("{0:?} is not a GPU index")]
    Index(String),
    #[error("{0:?} is neither a GPU index nor a GPU UUID (GPU-...); give indices and UUIDs, comma-separated, or all")]
    Neither(String),
}

impl FromStr for Managed {
    type Err = ManagedError;

    /// `all`, `none`, or GPU indices and UUIDs, comma-separated.
    fn from_str(text: &str) -> Result<Managed, ManagedError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(Managed::All);
        }
        if text.is_empty() || text.eq_ignore_ascii_case("none") {
            return Ok(Managed::None);
        }
        let mut listed = Vec::new();
        for item in text.split(',').map(str::trim) {
            let gpu = if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
                GpuRef::Index(item.parse().map_err(|_| ManagedError::Index(item.to_string()))?)
            } else if item.len() > 4 && item[..4].eq_ignore_ascii_case("GPU-") {
                GpuRef::Uuid(item.to_string())
            } else {
                return Err(ManagedError::Neither(item.to_string()));
            };
            listed.push(gpu);
        }
        Ok(Managed::Listed(listed))
    }
}

impl Managed {
    /// Whether it names the GPU of this index and UUID.
    pub fn names(&self, index: u32, uuid: &str) -> bool {
        match self {
            Managed::None => false,
            Managed::All => true,
            Managed::Listed(list) => list.iter().any(|g| match g {
                GpuRef::Index(i) => *i == index,
                GpuRef::Uuid(u) => u.eq_ignore_ascii_case(uuid),
            }),
        }
    }
}

/// How the MIG of the managed GPUs is read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigProbe {
    pub managed: Managed,
    /// The record of the MIG instances this driver creates (`<--state-dir>/mig`):
    /// `FGPU_MIG_RECORD` of the `fgpu mig` it runs.
    pub record: PathBuf,
}

/// The GPUs of a MIG listing this driver partitions (named by `managed` and in MIG mode),
/// and a line for each named GPU it does not (published whole) and each name that matches
/// no GPU.
pub fn managed_mig(listing: Vec<MigGpu>, managed: &Managed) -> (Vec<MigGpu>, Vec<String>) {
    let mut notes = Vec::new();
    if let Managed::Listed(list) = managed {
        for g in list.iter().filter(|g| {
            !listing.iter().any(|m| match g {
                GpuRef::Index(i) => m.index == *i,
                GpuRef::Uuid(u) => m.uuid.eq_ignore_ascii_case(u),
            })
        }) {
            let name = match g {
                GpuRef::Index(i) => format!("index {i}"),
                GpuRef::Uuid(u) => u.clone(),
            };
            notes.push(format!("--mig-gpus names GPU {name}, which this node does not have"));
        }
    }
    let mut kept = Vec::new();
    for gpu in listing.into_iter().filter(|g| managed.names(g.index, &g.uuid)) {
        if gpu.enabled() {
            kept.push(gpu);
            continue;
        }
        let why = match gpu.mig {
            None => "it has no MIG".to_string(),
            Some(m) if m.pending => "its MIG mode is off until the GPU is reset (enabling is pending)".to_string(),
            Some(_) => format!("its MIG mode is off (fgpu never changes it; `nvidia-smi -i {} -mig 1` enables it)", gpu.index),
        };
        notes.push(format!("GPU {} ({}) is published whole, not partitioned: {why}", gpu.index, gpu.uuid));
    }
    (kept, notes)
}

/// `fgpu mig list --json`, run as the driver probe is, with the plugin's own MIG record.
fn mig_listing(fgpu: &Path, library_dir: Option<&Path>, record: &Path) -> Result<Vec<MigGpu>, ListError> {
    let text = crate::mig::list_json(fgpu, library_dir, record)?;
    partitions::from_listing(&text).map_err(|source| ListError::Unexpected { fgpu: fgpu.to_path_buf(), source })
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
pub fn nvml_dir(root: &Path) -> Result<PathBuf, InventoryError> {
    LIBRARY_DIRS.iter().map(|d| root.join(d)).find(|d| d.join("libnvidia-ml.so.1").exists()).ok_or_else(|| InventoryError::NoNvml { root: root.to_path_buf() })
}

/// The node's GPUs and driver, and the MIG of the GPUs `mig` names. `driver_root`: read
/// NVML from there. A failed MIG probe leaves no GPU partitioned, and says so in
/// `mig_notes`.
pub fn probe(fgpu: &Path, driver_root: Option<&Path>, mig: &MigProbe) -> Result<Inventory, InventoryError> {
    let library_dir = driver_root.map(nvml_dir).transpose()?;
    let probe = fgpu_cdi::probe::run_with_libraries(fgpu, library_dir.as_deref())?;
    if !probe.nvml.loaded || probe.nvml.device_count.is_none() {
        let why = probe.nvml.error.clone().unwrap_or_else(|| "it lists no GPU".into());
        return Err(InventoryError::Nvml { why });
    }
    let mut gpus = Vec::new();
    for d in &probe.devices {
        if d.uuid.is_empty() || d.total_bytes == 0 {
            return Err(InventoryError::Incomplete { index: d.index });
        }
        gpus.push(GpuInfo { index: d.index, uuid: d.uuid.clone(), product: d.name.clone(), total: d.total_bytes });
    }
    let driver = DriverInfo { driver_version: probe.nvml.driver_version.clone(), cuda_version: probe.cuda.cuda_version.or(probe.nvml.cuda_version) };
    let (mig, mig_notes) = match mig.managed {
        Managed::None => (Vec::new(), Vec::new()),
        _ => match mig_listing(fgpu, library_dir.as_deref(), &mig.record) {
            Ok(listing) => managed_mig(listing, &mig.managed),
            Err(e) => (Vec::new(), vec![format!("{e}; no GPU is partitioned")]),
        },
    };
    Ok(Inventory { gpus, driver, mig, mig_notes })
}

/// The MIG notes of `new` that `old` did not have, for the log.
pub fn new_notes<'a>(old: &Inventory, new: &'a Inventory) -> Vec<&'a str> {
    new.mig_notes.iter().filter(|n| !old.mig_notes.contains(n)).map(String::as_str).collect()
}

/// The GPUs in one line, for the log.
pub fn describe(inventory: &Inventory) -> String {
    let gpus: Vec<String> =
        inventory.gpus.iter().map(|g| format!("GPU {} {} ({}, {})", g.index, g.uuid, g.product, crate::quantity::format_bytes(g.total))).collect();
    if gpus.is_empty() {
        return "no GPU".into();
    }
    let partitioned: Vec<String> = inventory.mig.iter().map(|g| g.index.to_string()).collect();
    if partitioned.is_empty() {
        gpus.join("; ")
    } else {
        format!("{}; partitioned (MIG): GPU {}", gpus.join("; "), partitioned.join(", "))
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
        let err = nvml_dir(&root).unwrap_err().to_string();
        assert!(err.contains("no libnvidia-ml.so.1") && err.contains("/run/nvidia/driver"), "{err}");
        std::fs::write(root.join("usr/lib64/libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(nvml_dir(&root).unwrap(), root.join("usr/lib64"));
        std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(nvml_dir(&root).unwrap(), root.join("usr/lib/x86_64-linux-gnu"), "the multiarch directory first");
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn gpu(index: u32, uuid: &str, mig: Option<(bool, bool)>) -> MigGpu {
        MigGpu { index, uuid: uuid.into(), mig: mig.map(|(current, pending)| partitions::MigMode { current, pending }), profiles: Vec::new() }
    }

    #[test]
    fn mig_gpus_parses_indices_uuids_and_all() {
        assert_eq!("all".parse::<Managed>().unwrap(), Managed::All);
        assert_eq!("".parse::<Managed>().unwrap(), Managed::None);
        assert_eq!("none".parse::<Managed>().unwrap(), Managed::None);
        assert_eq!("0, GPU-ab12".parse::<Managed>().unwrap(), Managed::Listed(vec![GpuRef::Index(0), GpuRef::Uuid("GPU-ab12".into())]));
        let err = "0,gpu0".parse::<Managed>().unwrap_err().to_string();
        assert!(err.contains("\"gpu0\" is neither a GPU index nor a GPU UUID"), "{err}");
        assert!("0,,1".parse::<Managed>().is_err());
        assert!(Managed::Listed(vec![GpuRef::Uuid("gpu-AB12".into())]).names(3, "GPU-ab12"));
        assert!(!Managed::None.names(0, "GPU-a"));
    }

    #[test]
    fn only_managed_gpus_in_mig_mode_are_partitioned() {
        let listing =
            || vec![gpu(0, "GPU-a", Some((true, true))), gpu(1, "GPU-b", Some((false, false))), gpu(2, "GPU-c", None), gpu(3, "GPU-d", Some((true, true)))];
        let (kept, notes) = managed_mig(listing(), &Managed::None);
        assert!(kept.is_empty() && notes.is_empty(), "none unless an operator says so");
        let (kept, notes) = managed_mig(listing(), &Managed::All);
        assert_eq!(kept.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 3]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("GPU 1 (GPU-b) is published whole, not partitioned: its MIG mode is off") && notes[0].contains("nvidia-smi -i 1 -mig 1"),
            "{notes:?}"
        );
        assert!(notes[1].contains("GPU 2 (GPU-c)") && notes[1].contains("it has no MIG"), "{notes:?}");
        let (kept, notes) = managed_mig(listing(), &"GPU-D,1,7".parse().unwrap());
        assert_eq!(kept.iter().map(|g| g.index).collect::<Vec<_>>(), [3], "GPU 0 is in MIG mode but not named");
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("GPU index 7, which this node does not have"), "{notes:?}");
        assert!(notes[1].contains("GPU 1 (GPU-b) is published whole"), "{notes:?}");
        let mut pending = listing();
        pending[1].mig = Some(partitions::MigMode { current: false, pending: true });
        let (_, notes) = managed_mig(pending, &"1".parse().unwrap());
        assert!(notes[0].contains("until the GPU is reset"), "{notes:?}");
    }

    #[test]
    fn notes_are_new_once() {
        let old = Inventory { mig_notes: vec!["a".into()], ..Default::default() };
        let new = Inventory { mig_notes: vec!["a".into(), "b".into()], ..Default::default() };
        assert_eq!(new_notes(&old, &new), ["b"]);
        assert!(new_notes(&new, &new).is_empty());
    }
}
