//! fgpu as a Container Device Interface (CDI) vendor: the specs that cap a container when it
//! starts (`--device fgpu.io/gpu=0-8g`), with nothing of fgpu in its image, and the files they
//! mount. Shared by `fgpu cdi generate` (devices of fixed sizes, this module) and
//! fgpu-kubelet-plugin (one device per Kubernetes ResourceClaim, [`claim`]).
//!
//! Every spec (kind `fgpu.io/gpu`, `cdiVersion` 0.5.0, the newest Debian's podman 4.3 reads)
//! gives every container, read-only:
//! - [`CONTAINER_LIB_DIR`]: a copy of the shipped `libfgpu.so` and `libfgpu_shim.so` (and
//!   the `fgpu` command);
//! - `/etc/ld.so.preload` naming that library;
//! - [`CONTAINER_CONFIG_DIR`]: the device's own `fgpu.conf`, with its cap and the ledger;
//!
//! and a directory at [`LEDGER_DIR`] for the ledger: a tmpfs of the container's own for
//! `fgpu cdi generate`'s devices, a host directory of the claim's own for a claim's.
//!
//! Directories, not files, are mounted wherever a rename could take a file out of the way:
//! a mount point cannot be renamed (`EBUSY`), but a directory the runtime created to hold a
//! file mount can, and root inside would then put a file of its own in its place.
//!
//! The mounted files are written to a host directory, root-owned (or `--owner`'s), mode
//! 0644, so the shim trusts them and nothing in the container can change them ([`files`]).
//! Planning (names, sizes, the configuration text, the spec) is pure and unit-tested.

pub mod claim;
pub mod files;
pub mod probe;
pub mod shimpath;
mod yaml;

pub use yaml::to_yaml;

use fgpu_core::limit::format_bytes;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The CDI kind: devices are `fgpu.io/gpu=<name>`.
pub const KIND: &str = "fgpu.io/gpu";
/// The newest CDI version Debian's podman 4.3 reads; every field used exists in it.
pub const CDI_VERSION: &str = "0.5.0";
/// Where the library (and the `fgpu` command) appear in the container.
pub const CONTAINER_LIB_DIR: &str = "/usr/lib/fgpu";
pub const CONTAINER_SHIM: &str = "/usr/lib/fgpu/libfgpu.so";
/// The container's preload list, replaced by a read-only file naming [`CONTAINER_SHIM`].
pub const CONTAINER_PRELOAD: &str = "/etc/ld.so.preload";
/// Holds the device's `fgpu.conf` ([`fgpu_core::config::CONFIG_PATH`]).
pub const CONTAINER_CONFIG_DIR: &str = "/etc/fgpu";
/// A tmpfs of each container's own: its ledger lives here, so `podman exec` shares the
/// container's cap and no two containers share one.
pub const LEDGER_DIR: &str = "/run/fgpu";
pub const LEDGER: &str = "/run/fgpu/ledger";
/// Sticky and writable by all, like /tmp: the first capped process of any user creates the
/// ledger, and no other user can remove it.
pub(crate) const LEDGER_TMPFS_OPTIONS: [&str; 5] = ["nosuid", "nodev", "noexec", "mode=1777", "size=16m"];
/// The library must stay executable, so no `noexec`.
pub(crate) const LIB_MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];
pub(crate) const FILE_MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "noexec", "bind"];
/// First line of every file this command writes.
pub const HEADER: &str = "# Written by `fgpu cdi generate`";
/// Layout of the configuration directory on the host.
pub const PRELOAD_FILE: &str = "ld.so.preload";
pub const LIB_SUBDIR: &str = "lib";
pub const DEVICES_SUBDIR: &str = "devices";
pub const CONFIG_FILE: &str = "fgpu.conf";
pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const MIB: u64 = 1 << 20;

/// How much of a GPU a device gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// A whole number of MiB.
    Bytes(u64),
    /// A whole percentage of the GPU's memory, 1..=100.
    Percent(u32),
}

impl Share {
    /// The size part of a device name: `8g`, `1536m`, `25pct`.
    fn name(self) -> String {
        match self {
            Share::Bytes(b) if b % GIB == 0 => format!("{}g", b / GIB),
            Share::Bytes(b) => format!("{}m", b / MIB),
            Share::Percent(p) => format!("{p}pct"),
        }
    }

    /// The amount in the `limit` syntax of fgpu.conf: `8G`, `1536M`, `25%`.
    fn limit(self) -> String {
        match self {
            Share::Bytes(b) if b % GIB == 0 => format!("{}G", b / GIB),
            Share::Bytes(b) => format!("{}M", b / MIB),
            Share::Percent(p) => format!("{p}%"),
        }
    }

    fn describe(self) -> String {
        match self {
            Share::Bytes(b) => format_bytes(b),
            Share::Percent(p) => format!("{p}% of the memory"),
        }
    }

    fn fits(self, total: u64) -> bool {
        match self {
            Share::Bytes(b) => b <= total,
            Share::Percent(_) => true,
        }
    }
}

/// One GPU as NVML numbers it (the index `nvidia-smi` and `nvidia.com/gpu=N` use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub total: u64,
}

/// Which GPUs one part of a device caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every GPU the container is given.
    All,
    /// The GPU with this index; the container gets nothing on any other.
    Gpu(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub target: Target,
    pub share: Share,
}

impl Part {
    fn name(self) -> String {
        match self.target {
            Target::All => format!("all-{}", self.share.name()),
            Target::Gpu(i) => format!("{i}-{}", self.share.name()),
        }
    }
}

/// One CDI device: its name and what it caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub parts: Vec<Part>,
}

impl Device {
    fn new(parts: Vec<Part>) -> Device {
        let name = parts.iter().map(|p| p.name()).collect::<Vec<_>>().join("_");
        Device { name, parts }
    }
}

/// Why no devices were planned: the flags asked for something the GPUs cannot give.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--combine {text:?}: device {name} is already generated")]
    AlreadyGenerated { text: String, name: String },
    #[error("no device to generate: every size is larger than the GPUs, and no percentage was asked for")]
    Nothing,
    #[error("--combine {text:?}: {why}")]
    Combination { text: String, why: CombinationError },
}

/// What is wrong with one `--combine` value.
#[derive(Debug, thiserror::Error)]
pub enum CombinationError {
    #[error("{0}")]
    Part(#[from] PartError),
    #[error("{item:?}: a combination names GPUs by index; all-SIZE alone caps every GPU")]
    NotByIndex { item: String },
    #[error("GPU {index} is named twice")]
    NamedTwice { index: u32 },
    #[error("a combination needs two or more GPUs, such as 0-8g,1-4g")]
    TooFew,
}

/// What is wrong with one `<index>-<size>` (or `<index>-<N>pct`) item.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    #[error("{item:?} is not <index>-<size> such as 0-8g or 1-25pct")]
    Form { item: String },
    #[error("{item:?}: {target:?} is not a GPU index")]
    NotAnIndex { item: String, target: String },
    #[error("{item:?}: there is no GPU {index} (this machine has {count})")]
    NoSuchGpu { item: String, index: u32, count: usize },
    #[error("{item:?}: {number:?} is not a whole percentage between 1 and 100")]
    Percentage { item: String, number: String },
    #[error("{item:?}: {source}")]
    Size { item: String, source: fgpu_core::limit::LimitError },
    #[error("{item:?}: {amount:?} is not a positive whole number of MiB")]
    NotWholeMib { item: String, amount: String },
    #[error("{item:?}: GPU {index} has only {}", format_bytes(*total))]
    TooLarge { item: String, index: u32, total: u64 },
}

/// The devices to generate: every size and percentage on every GPU it fits, the same on
/// all GPUs (`all-SIZE`, when it fits the smallest), then the combinations asked for.
pub fn plan(gpus: &[Gpu], sizes: &[u64], percents: &[u32], combine: &[String]) -> Result<Vec<Device>, PlanError> {
    let shares: Vec<Share> = sizes.iter().map(|&b| Share::Bytes(b)).chain(percents.iter().map(|&p| Share::Percent(p))).collect();
    let mut out: Vec<Device> = Vec::new();
    let push = |device: Device, out: &mut Vec<Device>| {
        if !out.iter().any(|d| d.name == device.name) {
            out.push(device);
        }
    };
    for gpu in gpus {
        for &share in shares.iter().filter(|s| s.fits(gpu.total)) {
            push(Device::new(vec![Part { target: Target::Gpu(gpu.index), share }]), &mut out);
        }
    }
    let smallest = gpus.iter().map(|g| g.total).min().unwrap_or(0);
    for &share in shares.iter().filter(|s| s.fits(smallest)) {
        push(Device::new(vec![Part { target: Target::All, share }]), &mut out);
    }
    for text in combine {
        let device = parse_combination(text, gpus).map_err(|why| PlanError::Combination { text: text.clone(), why })?;
        if out.iter().any(|d| d.name == device.name) {
            return Err(PlanError::AlreadyGenerated { text: text.clone(), name: device.name });
        }
        out.push(device);
    }
    if out.is_empty() {
        return Err(PlanError::Nothing);
    }
    Ok(out)
}

/// Parses `0-8g,1-4g` (or `0-8g_1-4g`): caps on two or more different GPUs.
fn parse_combination(text: &str, gpus: &[Gpu]) -> Result<Device, CombinationError> {
    let mut parts: Vec<Part> = Vec::new();
    for item in text.split([',', '_']).map(str::trim) {
        let part = parse_part(item, gpus)?;
        let Target::Gpu(index) = part.target else {
            return Err(CombinationError::NotByIndex { item: item.into() });
        };
        if parts.iter().any(|p| p.target == Target::Gpu(index)) {
            return Err(CombinationError::NamedTwice { index });
        }
        parts.push(part);
    }
    if parts.len() < 2 {
        return Err(CombinationError::TooFew);
    }
    parts.sort_by_key(|p| match p.target {
        Target::Gpu(i) => i,
        Target::All => u32::MAX,
    });
    Ok(Device::new(parts))
}

/// Parses one `<index>-<size>` or `<index>-<N>pct` (or `all-...`).
fn parse_part(item: &str, gpus: &[Gpu]) -> Result<Part, PartError> {
    let (target, amount) = item.split_once('-').ok_or_else(|| PartError::Form { item: item.into() })?;
    let target = if target == "all" {
        Target::All
    } else {
        let index: u32 = target.parse().map_err(|_| PartError::NotAnIndex { item: item.into(), target: target.into() })?;
        if !gpus.iter().any(|g| g.index == index) {
            return Err(PartError::NoSuchGpu { item: item.into(), index, count: gpus.len() });
        }
        Target::Gpu(index)
    };
    let share = if let Some(number) = amount.strip_suffix("pct") {
        match number.parse::<u32>() {
            Ok(p) if (1..=100).contains(&p) => Share::Percent(p),
            _ => return Err(PartError::Percentage { item: item.into(), number: number.into() }),
        }
    } else {
        let bytes = fgpu_core::limit::parse_size(amount).map_err(|source| PartError::Size { item: item.into(), source })?;
        if bytes == 0 || bytes % MIB != 0 {
            return Err(PartError::NotWholeMib { item: item.into(), amount: amount.into() });
        }
        Share::Bytes(bytes)
    };
    let too_small = gpus.iter().find(|g| target == Target::All || target == Target::Gpu(g.index)).filter(|g| !share.fits(g.total));
    if let Some(gpu) = too_small {
        return Err(PartError::TooLarge { item: item.into(), index: gpu.index, total: gpu.total });
    }
    Ok(Part { target, share })
}

/// The text of the device's `/etc/fgpu/fgpu.conf`.
///
/// A device for named GPUs ends its limit with `*=1`: one byte, so nothing fits on any
/// other GPU the container is given (`nvidia.com/gpu=all` beside `fgpu.io/gpu=0-8g` must
/// not leave GPUs 1..N uncapped, and fgpu's limits have no zero).
pub fn config_text(device: &Device, gpus: &[Gpu]) -> String {
    let mut text = format!("{HEADER} for the CDI device {KIND}={}.\n", device.name);
    let mut entries: Vec<String> = Vec::new();
    let mut all = false;
    for part in &device.parts {
        match part.target {
            Target::All => {
                all = true;
                let _ = writeln!(text, "# {} on every GPU the container is given.", part.share.describe());
                entries.push(part.share.limit());
            }
            Target::Gpu(index) => {
                let gpu = gpus.iter().find(|g| g.index == index).expect("planned devices name existing GPUs");
                let _ = writeln!(text, "# {} on GPU {index} ({}, {}).", part.share.describe(), gpu.uuid, format_bytes(gpu.total));
                entries.push(format!("{}={}", gpu.uuid, part.share.limit()));
            }
        }
    }
    if !all {
        text.push_str("# *=1 (one byte): no memory on any other GPU the container is given.\n");
        entries.push("*=1".into());
    }
    let _ = writeln!(text, "limit = {}", entries.join(","));
    let _ = writeln!(text, "ledger = {LEDGER}");
    text
}

/// The text of the `/etc/ld.so.preload` the containers get.
pub fn preload_text() -> String {
    format!("{CONTAINER_SHIM}\n")
}

pub(crate) fn bind(host: &Path, container: &str, options: &[&str]) -> Value {
    json!({ "hostPath": host.to_string_lossy(), "containerPath": container, "options": options })
}

/// The CDI spec as a JSON value, for files laid out under `config_dir` as `fgpu cdi
/// generate` writes them ([`files::Payload::install`], then [`device_dir`] of each device).
/// `service_dir`: the host directory of `fgpu service`'s socket, mounted read-only at the
/// same path so processes of the container learn their host PID (when it exists).
pub fn spec(devices: &[Device], config_dir: &Path, service_dir: Option<&Path>) -> Value {
    let mut mounts = library_mounts(config_dir);
    mounts.push(json!({ "hostPath": "tmpfs", "containerPath": LEDGER_DIR, "type": "tmpfs", "options": LEDGER_TMPFS_OPTIONS }));
    mounts.extend(service_mount(service_dir));
    let shared = json!({ "mounts": mounts });
    let devices: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "containerEdits": { "mounts": [bind(&device_dir(config_dir, d), CONTAINER_CONFIG_DIR, &FILE_MOUNT_OPTIONS)] }
            })
        })
        .collect();
    json!({ "cdiVersion": CDI_VERSION, "kind": KIND, "containerEdits": shared, "devices": devices })
}

/// The library directory and the preload list that [`files::Payload::install`] wrote under
/// `config_dir`, read-only.
pub(crate) fn library_mounts(config_dir: &Path) -> Vec<Value> {
    vec![
        bind(&config_dir.join(LIB_SUBDIR), CONTAINER_LIB_DIR, &LIB_MOUNT_OPTIONS),
        bind(&config_dir.join(PRELOAD_FILE), CONTAINER_PRELOAD, &FILE_MOUNT_OPTIONS),
    ]
}

/// `fgpu service`'s directory at the same path, read-only, when there is one.
pub(crate) fn service_mount(service_dir: Option<&Path>) -> Option<Value> {
    service_dir.map(|dir| bind(dir, fgpu_core::hostpid::SERVICE_DIR, &FILE_MOUNT_OPTIONS))
}

/// Where `fgpu cdi generate` writes a device's `fgpu.conf`.
pub fn device_dir(config_dir: &Path, device: &Device) -> PathBuf {
    config_dir.join(DEVICES_SUBDIR).join(&device.name)
}

/// Devices whose directory an earlier run wrote and this one no longer generates. They
/// are left alone: a running container mounts the directory, and its processes read
/// fgpu.conf from it whenever they start, so removing the file would leave them uncapped.
pub fn no_longer_generated(devices_dir: &Path, devices: &[Device]) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(devices_dir) else { return Vec::new() };
    let mut kept: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !devices.iter().any(|d| &d.name == name))
        .filter(|name| std::fs::read_to_string(devices_dir.join(name).join(CONFIG_FILE)).is_ok_and(|t| t.starts_with(HEADER)))
        .collect();
    kept.sort();
    kept
}

#[cfg(test)]
mod tests;
