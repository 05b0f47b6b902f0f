//! The plugin's status: what it publishes and why, what kubelet said, what is prepared on
//! each GPU. Kept in memory and written (JSON, mode 0600, replaced atomically) to
//! `<plugins dir>/gpu.fgpu.io/status.json` whenever it changes, where `fgpu-kubelet-plugin
//! status` reads it (`kubectl exec ds/fgpu-kubelet-plugin -- fgpu-kubelet-plugin status`).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The status file's name in the driver's directory under kubelet's plugins directory.
pub const FILE: &str = "status.json";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Snapshot {
    pub node: String,
    pub version: String,
    /// Seconds since the epoch when the plugin started.
    pub started: u64,
    /// kubelet's last NotifyRegistrationStatus; none yet when absent.
    pub registered: Option<bool>,
    pub registration_error: Option<String>,
    /// `unknown`, `on` (GPUs shared by memory and compute) or `off` (whole GPUs).
    pub consumable_capacity: String,
    /// Why, in one line.
    pub consumable_capacity_reason: Option<String>,
    /// `unknown`, `on` (managed GPUs in MIG mode published with their partitions) or `off`
    /// (published whole); and why, in one line.
    pub partitionable_devices: String,
    pub partitionable_devices_reason: Option<String>,
    /// The devices published, and the GPUs left out with the reason.
    pub published: Vec<String>,
    pub left_out: Vec<LeftOutGpu>,
    pub slices: Vec<String>,
    pub pool_generation: i64,
    /// Writes (POST, PUT, DELETE) of slices since the start.
    pub slice_writes: u64,
    /// The outcome of the last look at the slices, and an error if it failed.
    pub last_publish: Option<String>,
    pub last_publish_error: Option<String>,
    /// The watch of this node's slices: `watching`, or why not.
    pub watch: String,
    /// What the prepared claims hold, per GPU.
    pub gpus: Vec<GpuUse>,
    /// Each GPU's health, as kubelet's device health stream reports it.
    pub health: Vec<crate::health::GpuHealth>,
    /// The child that watches NVML's events (`fgpu __nvml-events`).
    pub health_watch: crate::health::WatchStatus,
    /// Where the metrics are served (`--metrics-address`), if anywhere.
    pub metrics: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct LeftOutGpu {
    pub index: u32,
    pub uuid: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct GpuUse {
    pub device: String,
    pub uuid: String,
    /// The published memory capacity, in bytes.
    pub memory_capacity: u64,
    /// What the prepared claims (not admin access) consume, in bytes and thousandths of a
    /// percent of the GPU's time.
    pub memory_used: u64,
    pub compute_used_millipercent: u64,
    /// A claim holds the GPU whole (no consumed capacity).
    pub exclusive: bool,
    /// `namespace/name` of each claim prepared on it.
    pub claims: Vec<String>,
}

pub struct Status {
    path: Option<PathBuf>,
    inner: Mutex<(Snapshot, String)>,
}

impl Status {
    /// A status written to `path` (none: kept in memory only).
    pub fn new(path: Option<PathBuf>, node: &str) -> Status {
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let snapshot = Snapshot {
            node: node.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            started,
            consumable_capacity: "unknown".into(),
            partitionable_devices: "unknown".into(),
            watch: "not started".into(),
            ..Default::default()
        };
        let status = Status { path, inner: Mutex::new((snapshot, String::new())) };
        status.update(|_| {});
        status
    }

    pub fn get(&self) -> Snapshot {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Changes the status, and writes it when it changed.
    pub fn update(&self, change: impl FnOnce(&mut Snapshot)) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut inner.0);
        let text = serde_json::to_string_pretty(&inner.0).expect("a status serialises") + "\n";
        if text == inner.1 {
            return;
        }
        if let Some(path) = &self.path {
            if let Err(e) = fgpu_cdi::files::write_file(path, text.as_bytes(), 0o600, None) {
                crate::log(&format!("cannot write the status: {e}"));
            }
        }
        inner.1 = text;
    }
}

/// Why the status file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source} (is the plugin running with these directories?)", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    NotAStatus { path: PathBuf, source: serde_json::Error },
}

/// The status file a running plugin keeps in `plugin_dir`.
pub fn read(plugin_dir: &Path) -> Result<Snapshot, ReadError> {
    let path = plugin_dir.join(FILE);
    let text = std::fs::read(&path).map_err(|source| ReadError::Read { path: path.clone(), source })?;
    serde_json::from_slice(&text).map_err(|source| ReadError::NotAStatus { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_broken_status_file_is_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("fgpu-status-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let missing = read(&dir).unwrap_err().to_string();
        assert!(missing.starts_with(&format!("cannot read {}: ", dir.join(FILE).display())), "{missing}");
        assert!(missing.ends_with("(is the plugin running with these directories?)"), "{missing}");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(FILE), b"{ not json").unwrap();
        assert!(matches!(read(&dir), Err(ReadError::NotAStatus { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
