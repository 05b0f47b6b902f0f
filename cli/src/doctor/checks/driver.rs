//! The driver's libraries, as the probe found them without the shim: `libcuda.so.1` and
//! `libnvidia-ml.so.1` load, their versions and GPUs. Never a failure: without a driver no
//! CUDA program runs here, capped or not.

use crate::doctor::facts::Facts;
use crate::doctor::finding::{finding, Finding, Level};

pub fn check(f: &Facts, out: &mut Vec<Finding>) {
    match &f.driver {
        Err(e) => out.push(finding("driver", Level::Warn, format!("The driver libraries could not be checked: {e}"), None)),
        Ok(d) => {
            if d.cuda.loaded {
                let version = d.cuda.cuda_version.map(|v| format!(", CUDA driver API {}.{}", v / 1000, (v % 1000) / 10)).unwrap_or_default();
                let count = d.cuda.device_count.map(|c| format!(", {c} GPU{}", if c == 1 { "" } else { "s" })).unwrap_or_default();
                match &d.cuda.error {
                    None => out.push(finding("driver", Level::Ok, format!("libcuda.so.1 loads{version}{count}."), None)),
                    Some(e) => out.push(finding(
                        "driver",
                        Level::Warn,
                        format!("libcuda.so.1 loads{version}, but {e}."),
                        Some("Check that the GPU is visible here (nvidia-smi; in a container: --gpus or the NVIDIA container toolkit).".into()),
                    )),
                }
            } else {
                out.push(finding(
                    "driver",
                    Level::Warn,
                    format!(
                        "libcuda.so.1 cannot be loaded: {}. No CUDA program can run here, capped or not.",
                        d.cuda.error.as_deref().unwrap_or("unknown error")
                    ),
                    Some("Install the NVIDIA driver, or in a container make the GPU available (--gpus, the NVIDIA container toolkit).".into()),
                ));
            }
            if d.nvml.loaded {
                let version = d.nvml.driver_version.as_ref().map(|v| format!(", driver {v}")).unwrap_or_default();
                let count = d.nvml.device_count.map(|c| format!(", {c} GPU{}", if c == 1 { "" } else { "s" })).unwrap_or_default();
                match &d.nvml.error {
                    None => out.push(finding("driver", Level::Ok, format!("libnvidia-ml.so.1 loads{version}{count}."), None)),
                    Some(e) => out.push(finding("driver", Level::Warn, format!("libnvidia-ml.so.1 loads{version}, but {e}."), None)),
                }
            } else {
                out.push(finding(
                    "driver",
                    Level::Warn,
                    format!(
                        "libnvidia-ml.so.1 cannot be loaded: {}. nvidia-smi and monitoring tools will not work here.",
                        d.nvml.error.as_deref().unwrap_or("unknown error")
                    ),
                    None,
                ));
            }
        }
    }
}
