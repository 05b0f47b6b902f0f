//! `fgpu __driver-probe`: loads `libcuda.so.1` and `libnvidia-ml.so.1` and prints, as JSON,
//! what they say about themselves and the GPUs. `fgpu doctor` runs it in a child process.
//!
//! The probe must see the driver as it is, never through the shim: the child is started
//! without `LD_PRELOAD`, but a shim in `/etc/ld.so.preload` is loaded into every process
//! whatever the environment says. So the probe never looks a driver function up through
//! the `dlsym` or `dlvsym` that a preloaded library may define (fgpu's return its own
//! wrappers, and its own `dlsym` for any lookup of either): it takes glibc's own `dlsym`
//! from libc's symbol table (`fgpu_core::sys::glibc_dlsym`), and resolves every driver
//! function with that (`calls.rs`). No call of the probe then reaches the shim, which so never reads a
//! cap, rewrites an answer or opens a ledger.

pub use fgpu_cdi::probe::{DriverProbe, LibraryProbe, ProbedDevice};

use super::calls::{Cuda, Nvml};

/// At most this many devices are looked at (more than any machine has).
const MAX_DEVICES: u32 = 64;
/// Room for this many processes in a device's list.
const MAX_PROCESSES: usize = 256;

fn probe_cuda() -> LibraryProbe {
    let mut p = LibraryProbe::default();
    let cuda = match Cuda::open() {
        Ok(cuda) => cuda,
        Err(e) => {
            p.error = Some(e.0);
            return p;
        }
    };
    p.loaded = true;
    p.cuda_version = cuda.driver_version();
    match cuda.init() {
        Some(Ok(())) => p.device_count = cuda.device_count().map(|n| n.max(0) as u32),
        Some(Err(rc)) => p.error = Some(format!("cuInit failed with CUDA error {rc}{}", if rc == 100 { " (no CUDA-capable device)" } else { "" })),
        None => p.error = Some("it has no cuInit".into()),
    }
    p
}

fn probe_nvml(devices: &mut Vec<ProbedDevice>) -> LibraryProbe {
    let mut p = LibraryProbe::default();
    let nvml = match Nvml::open() {
        Ok(nvml) => nvml,
        Err(e) => {
            p.error = Some(e.0);
            return p;
        }
    };
    p.loaded = true;
    match nvml.init() {
        None => {
            p.error = Some("it has no nvmlInit".into());
            return p;
        }
        Some(Err(rc)) => {
            p.error = Some(format!("nvmlInit failed with NVML error {rc}"));
            return p;
        }
        Some(Ok(())) => {}
    }
    p.driver_version = nvml.driver_version();
    p.cuda_version = nvml.cuda_driver_version();
    if let Some(Ok(n)) = nvml.device_count() {
        p.device_count = Some(n);
        if nvml.can_name_devices() {
            for index in 0..n.min(MAX_DEVICES) {
                let Some(Ok(device)) = nvml.device(index) else { continue };
                let mut d = ProbedDevice { index, ..Default::default() };
                d.uuid = nvml.uuid(device).unwrap_or_default();
                d.name = nvml.name(device).unwrap_or_default();
                if let Some(m) = nvml.memory(device) {
                    d.total_bytes = m.total;
                    d.used_bytes = m.used;
                }
                if let Ok(entries) = nvml.compute_processes(device, MAX_PROCESSES) {
                    d.compute_processes = entries.iter().map(|e| (e.pid, e.used_gpu_memory)).collect();
                }
                devices.push(d);
            }
        }
    }
    nvml.shutdown();
    p
}

/// Why [`probe_driver`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot find the fgpu binary: {0}")]
    NoBinary(std::io::Error),
    #[error("cannot start the probe: {0}")]
    Start(std::io::Error),
    #[error("loading the driver libraries crashed the probe ({status}): {stderr}")]
    Crashed { status: std::process::ExitStatus, stderr: String },
    #[error("the probe printed something unexpected: {0}")]
    Output(serde_json::Error),
}

/// Runs `fgpu __driver-probe` without the shim in `LD_PRELOAD` and reads its JSON (a shim in
/// /etc/ld.so.preload is loaded there too, and the probe goes around it, above).
pub fn probe_driver() -> Result<DriverProbe, ProbeError> {
    let exe = std::env::current_exe().map_err(ProbeError::NoBinary)?;
    let out = std::process::Command::new(exe)
        .arg("__driver-probe")
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(ProbeError::Start)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(ProbeError::Crashed { status: out.status, stderr });
    }
    serde_json::from_slice(&out.stdout).map_err(ProbeError::Output)
}

/// `fgpu __driver-probe`: prints a [`DriverProbe`] as JSON.
pub fn main() -> i32 {
    let mut probe = DriverProbe { cuda: probe_cuda(), ..Default::default() };
    probe.nvml = probe_nvml(&mut probe.devices);
    println!("{}", serde_json::to_string(&probe).expect("probe serialises"));
    0
}
