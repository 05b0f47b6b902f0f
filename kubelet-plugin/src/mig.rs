//! MIG instances for the claims allocated a partition ([`crate::partitions`]): created at
//! prepare and destroyed at unprepare through the fgpu command (`fgpu mig create --gpu UUID
//! --placement START --json`, `fgpu mig destroy --json`), which owns NVML's MIG calls, as
//! the GPUs are read through `fgpu __driver-probe`.
//!
//! Every instance the plugin creates is written to the plugin's own record, `<state
//! dir>/mig` (`FGPU_MIG_RECORD`), so that the instances of a static MIG setup and those of
//! `fgpu run --mig` (in other records, or none) are never touched: `fgpu mig destroy` acts
//! only on instances its record names, and the start-up collection lists only that record.
//!
//! A process reaches a MIG device through the GPU's `/dev/nvidiaN` and two capability
//! device nodes of the `nvidia-caps` driver, the GPU instance's and the compute instance's
//! `access` nodes, `/dev/nvidia-caps/nvidia-cap<minor>`. Their minors are read from
//! `/proc/driver/nvidia-caps/mig-minors` (NVIDIA's kernel module, `nv-caps.c`, lists there
//! one `gpu<N>/gi<G>/access <minor>` and `gpu<N>/gi<G>/ci<C>/access <minor>` line per
//! possible instance, N the GPU's minor number, not its NVML index).

use crate::partitions::Partition;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::process::Command;

/// The kernel module's list of MIG capability minors.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";
/// Where the capability device nodes are (under the device root).
pub const CAPS_DIR: &str = "dev/nvidia-caps";

/// Why a MIG operation of the plugin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigOpError {
    /// A process still uses the instance (`NVML_ERROR_IN_USE`): kubelet retries.
    #[error("{0}")]
    InUse(String),
    /// The allocated placement holds another instance: the allocation is stale.
    #[error("{0}")]
    Taken(String),
    #[error("{0}")]
    Failed(String),
    #[error("{path}: {reason}")]
    Minors { path: PathBuf, reason: String },
}

/// An instance `fgpu mig create --json` made.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Made {
    pub mig_uuid: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_minor: Option<u32>,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub profile: String,
    pub placement: (u32, u32),
    pub memory_mib: u64,
}

/// One instance of the plugin's record that exists, as `fgpu mig list --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Recorded {
    pub mig_uuid: String,
    pub gpu_uuid: String,
    pub profile: String,
    pub placement: (u32, u32),
}

#[derive(Deserialize)]
struct Listing {
    gpus: Vec<ListedGpu>,
}

#[derive(Deserialize)]
struct ListedGpu {
    #[serde(default)]
    fgpu_created: Vec<Recorded>,
}

#[derive(Deserialize)]
struct DestroyLine {
    outcome: String,
    message: String,
}

/// The fgpu command, the record and the device paths the plugin's MIG operations use.
#[derive(Debug, Clone)]
pub struct MigTool {
    pub fgpu: PathBuf,
    /// The driver root's library directory, put first on `LD_LIBRARY_PATH`.
    pub library_dir: Option<PathBuf>,
    /// The plugin's own record (`<state dir>/mig`).
    pub record: PathBuf,
    /// `/proc/driver/nvidia-caps/mig-minors` (`--mig-minors`).
    pub minors: PathBuf,
    /// The host's root for device nodes (`--device-root`): the specs name
    /// `<root>/dev/nvidia-caps/nvidia-cap<minor>` as the host path.
    pub device_root: PathBuf,
}

/// The command `fgpu <args>` as the plugin runs it: with the plugin's own MIG record
/// (`FGPU_MIG_RECORD`), the driver root's library directory first on `LD_LIBRARY_PATH`, no
/// preload, no input.
pub fn fgpu_command(fgpu: &Path, library_dir: Option<&Path>, record: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(fgpu);
    command.args(args).env("FGPU_MIG_RECORD", record).env_remove("LD_PRELOAD").stdin(Stdio::null());
    if let Some(dir) = library_dir {
        let mut paths = vec![dir.to_path_buf()];
        paths.extend(std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
        if let Ok(joined) = std::env::join_paths(paths) {
            command.env("LD_LIBRARY_PATH", joined);
        }
    }
    command
}

/// What `fgpu mig list --json` prints, run with the plugin's record (made 0700 if missing):
/// the one listing that both the inventory's probe (the GPUs' MIG profiles and placements)
/// and the start-up collection (the instances of the record that exist) read. Blocking:
/// async callers run it with `spawn_blocking`. `Err` is one line.
pub fn list_json(fgpu: &Path, library_dir: Option<&Path>, record: &Path) -> Result<String, ListError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(record).map_err(|source| ListError::Record { record: record.to_path_buf(), source })?;
    let out =
        fgpu_command(fgpu, library_dir, record, &["mig", "list", "--json"]).output().map_err(|source| ListError::Start { fgpu: fgpu.to_path_buf(), source })?;
    if !out.status.success() {
        return Err(ListError::Failed { fgpu: fgpu.to_path_buf(), status: out.status, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why `fgpu mig list --json` gave no listing.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("cannot make the MIG record {}: {source}", .record.display())]
    Record { record: PathBuf, source: std::io::Error },
    #[error("cannot start {} mig list: {source}", .fgpu.display())]
    Start { fgpu: PathBuf, source: std::io::Error },
    #[error("{} mig list --json failed ({status}): {stderr}", .fgpu.display())]
    Failed { fgpu: PathBuf, status: std::process::ExitStatus, stderr: String },
    #[error("{} mig list --json printed something unexpected: {source}", .fgpu.display())]
    Unexpected { fgpu: PathBuf, source: serde_json::Error },
}

impl MigTool {
    async fn run(&self, args: &[&str]) -> Result<std::process::Output, MigOpError> {
        // On tokio's process driver: no runtime worker waits on the child.
        let mut command = Command::from(fgpu_command(&self.fgpu, self.library_dir.as_deref(), &self.record, args));
        command.output().await.map_err(|e| MigOpError::Failed(format!("cannot run {}: {e}", self.fgpu.display())))
    }

    /// Whether the plugin's record names any instance (a `*.json` file in it).
    pub fn record_has_entries(&self) -> bool {
        std::fs::read_dir(&self.record)
            .map(|d| d.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".json") && !n.starts_with('.'))))
            .unwrap_or(false)
    }

    /// Creates the instance of `partition`, at its placement exactly.
    pub async fn create(&self, partition: &Partition) -> Result<Made, MigOpError> {
        let start = partition.start.to_string();
        let id = partition.profile_id.to_string();
        let out = self.run(&["mig", "create", &id, "--gpu", &partition.gpu_uuid, "--placement", &start, "--json"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = || {
            let line = stderr.lines().filter_map(|l| l.strip_prefix("fgpu mig: ")).find(|l| !l.starts_with("created "));
            line.unwrap_or(stderr.trim()).to_string()
        };
        match out.status.code() {
            Some(0) => {}
            Some(4) => return Err(MigOpError::Taken(why())),
            _ => return Err(MigOpError::Failed(format!("fgpu mig create {} at {}: {}", partition.profile, partition.start, why()))),
        }
        let made: Made = serde_json::from_slice(&out.stdout).map_err(|e| {
            MigOpError::Failed(format!("fgpu mig create --json printed what this plugin cannot read ({e}): {}", String::from_utf8_lossy(&out.stdout)))
        })?;
        if made.gpu_uuid != partition.gpu_uuid || made.placement != (partition.start, partition.size) {
            return Err(MigOpError::Failed(format!(
                "fgpu mig create made {} at {:?} on {}, not the partition asked",
                made.mig_uuid, made.placement, made.gpu_uuid
            )));
        }
        Ok(made)
    }

    /// Destroys the instance `mig_uuid` of the plugin's record; one already gone, or no
    /// longer recorded, is destroyed already.
    pub async fn destroy(&self, mig_uuid: &str) -> Result<(), MigOpError> {
        let out = self.run(&["mig", "destroy", "--json", mig_uuid]).await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line: Option<DestroyLine> = text.lines().find_map(|l| serde_json::from_str(l).ok());
        match line {
            Some(l) if matches!(l.outcome.as_str(), "destroyed" | "gone" | "not_recorded") => Ok(()),
            Some(l) if l.outcome == "in_use" => Err(MigOpError::InUse(l.message)),
            Some(l) => Err(MigOpError::Failed(l.message)),
            None => Err(MigOpError::Failed(format!("fgpu mig destroy {mig_uuid}: {}", String::from_utf8_lossy(&out.stderr).trim()))),
        }
    }

    /// The instances of the plugin's record that exist.
    pub async fn recorded(&self) -> Result<Vec<Recorded>, MigOpError> {
        let (fgpu, library_dir, record) = (self.fgpu.clone(), self.library_dir.clone(), self.record.clone());
        let listed = tokio::task::spawn_blocking(move || list_json(&fgpu, library_dir.as_deref(), &record)).await;
        let text = listed.map_err(|e| MigOpError::Failed(format!("fgpu mig list: {e}")))?.map_err(|e| MigOpError::Failed(e.to_string()))?;
        let listing: Listing = serde_json::from_str(&text).map_err(|e| MigOpError::Failed(format!("fgpu mig list --json: {e}")))?;
        Ok(listing.gpus.into_iter().flat_map(|g| g.fgpu_created).collect())
    }

    /// The minors of the GPU instance's and the compute instance's access nodes.
    pub fn caps_minors(&self, gpu_minor: u32, gpu_instance: u32, compute_instance: u32) -> Result<(u32, u32), MigOpError> {
        let text = std::fs::read_to_string(&self.minors).map_err(|e| MigOpError::Minors { path: self.minors.clone(), reason: e.to_string() })?;
        access_minors(&text, gpu_minor, gpu_instance, compute_instance).map_err(|e| MigOpError::Minors { path: self.minors.clone(), reason: e.to_string() })
    }

    /// The host path of capability node `minor`.
    pub fn cap_node(&self, minor: u32) -> PathBuf {
        cap_node(&self.device_root, minor)
    }
}

/// `<root>/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_node(root: &Path, minor: u32) -> PathBuf {
    root.join(CAPS_DIR).join(format!("nvidia-cap{minor}"))
}

/// The line of the mig-minors list that was looked for and is not there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no line \"{0} <minor>\"")]
pub struct MissingMinor(pub String);

/// The minors of `gpu<gpu>/gi<gi>/access` and `gpu<gpu>/gi<gi>/ci<ci>/access` in a
/// mig-minors text; `Err` names the line missing.
pub fn access_minors(text: &str, gpu: u32, gi: u32, ci: u32) -> Result<(u32, u32), MissingMinor> {
    let find = |name: &str| -> Result<u32, MissingMinor> {
        text.lines()
            .find_map(|l| {
                let (key, minor) = l.trim().split_once(' ')?;
                (key == name).then(|| minor.trim().parse::<u32>().ok())?
            })
            .ok_or_else(|| MissingMinor(name.to_string()))
    };
    Ok((find(&format!("gpu{gpu}/gi{gi}/access"))?, find(&format!("gpu{gpu}/gi{gi}/ci{ci}/access"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of the kernel module's list as it lays it out (nv-caps.c): the MIG
    /// config and monitor capabilities after the NVLink fabric one, then per GPU minor,
    /// for GPU instances 0-14, the instance's access and its compute instances' 0-7.
    fn minors(gpus: u32) -> String {
        let mut text = String::from("config 1\nmonitor 2\n");
        let mut minor = 3;
        for gpu in 0..gpus {
            for gi in 0..15 {
                text.push_str(&format!("gpu{gpu}/gi{gi}/access {minor}\n"));
                minor += 1;
                for ci in 0..8 {
                    text.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {minor}\n"));
                    minor += 1;
                }
            }
        }
        text
    }

    #[test]
    fn access_minors_are_read_by_gpu_minor_and_instance_ids() {
        let text = minors(2);
        assert_eq!(access_minors(&text, 0, 0, 0), Ok((3, 4)));
        assert_eq!(access_minors(&text, 0, 1, 0), Ok((12, 13)));
        assert_eq!(access_minors(&text, 1, 2, 1), Ok((3 + 135 + 18, 3 + 135 + 18 + 2)));
        assert_eq!(access_minors(&text, 2, 1, 0), Err(MissingMinor("gpu2/gi1/access".into())));
        assert_eq!(access_minors("gpu0/gi1/access 12\n", 0, 1, 0), Err(MissingMinor("gpu0/gi1/ci0/access".into())));
        assert_eq!(cap_node(Path::new("/"), 12), PathBuf::from("/dev/nvidia-caps/nvidia-cap12"));
    }

    #[test]
    fn list_json_runs_fgpu_with_the_record_and_says_why_it_failed() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("fgpu-mig-list-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fgpu = dir.join("fgpu");
        let script = "#!/bin/sh\necho \"$FGPU_MIG_RECORD $* ${LD_LIBRARY_PATH%%:*}\"\n";
        std::fs::write(&fgpu, script).unwrap();
        std::fs::set_permissions(&fgpu, std::fs::Permissions::from_mode(0o755)).unwrap();
        let record = dir.join("state/mig");
        let text = list_json(&fgpu, Some(Path::new("/drv/lib")), &record).unwrap();
        assert_eq!(text.trim(), format!("{} mig list --json /drv/lib", record.display()));
        assert_eq!(std::fs::metadata(&record).unwrap().mode() & 0o777, 0o700, "the record is private");
        let failing = dir.join("failing");
        std::fs::write(&failing, "#!/bin/sh\necho 'no NVML' >&2\nexit 2\n").unwrap();
        std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = list_json(&failing, None, &record).unwrap_err().to_string();
        assert!(e.ends_with("mig list --json failed (exit status: 2): no NVML"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_create_document_is_read() {
        let json = r#"{"gpu_uuid":"GPU-a","gpu_index":0,"gpu_instance":2,"compute_instance":0,"profile":"3g.40gb","placement":[4,4],
            "mig_uuid":"MIG-b","owner":null,"uid":0,"created_unix":1,"gpu_minor":0,"memory_mib":40192}"#;
        let made: Made = serde_json::from_str(json).unwrap();
        assert_eq!((made.gpu_instance, made.placement, made.gpu_minor, made.memory_mib), (2, (4, 4), Some(0), 40192));
    }
}
