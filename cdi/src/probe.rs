//! What `fgpu __driver-probe` reports: the driver libraries and the GPUs NVML lists, read in a
//! child process so that the driver is seen as it is (never through a preloaded shim) and a
//! driver that crashes on load takes only the child down. `fgpu doctor` and `fgpu cdi
//! generate` run their own binary; fgpu-kubelet-plugin runs the `fgpu` it ships with.

use crate::Gpu;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the probe reports about the driver libraries.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DriverProbe {
    pub cuda: LibraryProbe,
    pub nvml: LibraryProbe,
    pub devices: Vec<ProbedDevice>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LibraryProbe {
    pub loaded: bool,
    pub error: Option<String>,
    /// cuDriverGetVersion (e.g. 12080), or NVML's CUDA driver version.
    pub cuda_version: Option<i32>,
    /// nvmlSystemGetDriverVersion (e.g. "535.104.05").
    pub driver_version: Option<String>,
    pub device_count: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbedDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
    /// What the driver says is used on the GPU (every process's, and its own reserve).
    #[serde(default)]
    pub used_bytes: u64,
    /// NVML's compute-process list as the driver gives it here: (PID, usedGpuMemory), for
    /// the doctor's look at which PIDs NVML gives (`fgpu_core::nvmlpids`).
    #[serde(default)]
    pub compute_processes: Vec<(u32, u64)>,
}

/// Why the probe gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{}: {source}", dir.display())]
    LibraryPath { dir: PathBuf, source: std::env::JoinPathsError },
    #[error("cannot start the probe {}: {source}", fgpu.display())]
    Start { fgpu: PathBuf, source: std::io::Error },
    #[error("loading the driver libraries crashed the probe ({status}): {stderr}")]
    Crashed { status: std::process::ExitStatus, stderr: String },
    #[error("the probe printed something unexpected: {0}")]
    Output(#[source] serde_json::Error),
}

/// Why a probe's answer gives no GPU to cap.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GpusError {
    #[error("no GPU found through NVML (libnvidia-ml.so.1: {why}); run it on the GPU host, with the driver installed")]
    None { why: String },
    #[error("NVML did not give the UUID and memory size of GPU {index}")]
    Incomplete { index: u32 },
}

/// Runs `fgpu __driver-probe` with the `fgpu` binary at `fgpu`, without `LD_PRELOAD`.
pub fn run(fgpu: &Path) -> Result<DriverProbe, ProbeError> {
    run_with_libraries(fgpu, None)
}

/// [`run`], with `library_dir` searched first for the driver's libraries (a driver root
/// mounted into a container: `LD_LIBRARY_PATH` of the probe only).
pub fn run_with_libraries(fgpu: &Path, library_dir: Option<&Path>) -> Result<DriverProbe, ProbeError> {
    let mut command = Command::new(fgpu);
    command.arg("__driver-probe").env_remove("LD_PRELOAD").stdin(Stdio::null());
    if let Some(dir) = library_dir {
        let mut paths = vec![dir.to_path_buf()];
        paths.extend(std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
        command.env("LD_LIBRARY_PATH", std::env::join_paths(paths).map_err(|source| ProbeError::LibraryPath { dir: dir.to_path_buf(), source })?);
    }
    let out = command.output().map_err(|source| ProbeError::Start { fgpu: fgpu.to_path_buf(), source })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(ProbeError::Crashed { status: out.status, stderr });
    }
    serde_json::from_slice(&out.stdout).map_err(ProbeError::Output)
}

/// The GPUs of a probe, each with its UUID and memory size; an error names what is missing.
pub fn gpus(probe: &DriverProbe) -> Result<Vec<Gpu>, GpusError> {
    if probe.devices.is_empty() {
        let why = probe.nvml.error.clone().unwrap_or_else(|| "NVML lists no GPU".into());
        return Err(GpusError::None { why });
    }
    probe
        .devices
        .iter()
        .map(|d| {
            if d.uuid.is_empty() || d.total_bytes == 0 {
                Err(GpusError::Incomplete { index: d.index })
            } else {
                Ok(Gpu { index: d.index, uuid: d.uuid.clone(), total: d.total_bytes })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_need_a_uuid_and_a_size() {
        let device = |index, uuid: &str, total_bytes| ProbedDevice { index, uuid: uuid.into(), name: "NVIDIA H100".into(), total_bytes, ..Default::default() };
        let mut probe = DriverProbe { devices: vec![device(0, "GPU-a", 80 << 30), device(1, "GPU-b", 24 << 30)], ..Default::default() };
        assert_eq!(gpus(&probe).unwrap()[1], Gpu { index: 1, uuid: "GPU-b".into(), total: 24 << 30 });
        probe.devices[1].uuid.clear();
        assert_eq!(gpus(&probe).unwrap_err(), GpusError::Incomplete { index: 1 });
        probe.devices.clear();
        probe.nvml.error = Some("libnvidia-ml.so.1: cannot open shared object file".into());
        assert!(gpus(&probe).unwrap_err().to_string().contains("cannot open shared object file"));
    }

    #[test]
    fn a_probe_that_cannot_start_says_which_binary() {
        let err = run(Path::new("/nonexistent/fgpu")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/fgpu"), "{err}");
    }
}
