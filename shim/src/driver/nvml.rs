//! [`NvmlDriver`] on the real NVML: each method one or a few calls of `raw.rs` into
//! buffers of its own.

use super::raw;
use super::seam::{NvmlDriver, Real, SamplesError};
use super::symbols::{get, library_present, Lib, Sym};
use crate::abi::nvml::*;
use fgpu_core::compute::Sample;
use fgpu_core::uuid::DeviceUuid;
use std::ffi::{c_char, c_uint};
use std::ptr::null_mut;
use std::sync::OnceLock;

/// `NVML_DEVICE_MIG_ENABLE` (nvml.h): the current mode of a GPU split into MIG instances.
const NVML_DEVICE_MIG_ENABLE: c_uint = 1;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE` (nvml.h) is 96; so is the driver version's buffer.
const TEXT_BUFFER: usize = 96;

/// A NUL-terminated answer written into `buf`, as text.
fn text_of(buf: &[u8]) -> Option<String> {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok().map(str::to_string)
}

/// The UUIDs of the MIG instances of one GPU (none when MIG is off or unknown to NVML).
fn mig_uuids(nvml: &Real, device: NvmlDevice) -> Vec<String> {
    let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
    // SAFETY: an NVML device handle and two live unsigned int locals.
    let mode = unsafe { raw::nvmlDeviceGetMigMode(device, &mut current, &mut pending) };
    if mode != Some(NVML_SUCCESS) || current != NVML_DEVICE_MIG_ENABLE {
        return Vec::new();
    }
    let mut max: c_uint = 0;
    // SAFETY: a live unsigned int local.
    if unsafe { raw::nvmlDeviceGetMaxMigDeviceCount(device, &mut max) } != Some(NVML_SUCCESS) {
        return Vec::new();
    }
    // Slots of instances not created answer NVML_ERROR_NOT_FOUND.
    (0..max)
        .filter_map(|index| {
            let mut mig: NvmlDevice = null_mut();
            // SAFETY: a live nvmlDevice_t local for NVML to write.
            let rc = unsafe { raw::nvmlDeviceGetMigDeviceHandleByIndex(device, index, &mut mig) }?;
            if rc != NVML_SUCCESS {
                return None;
            }
            nvml.nvml_device_uuid(mig)
        })
        .collect()
}

impl NvmlDriver for Real {
    fn nvml_ready(&self) -> bool {
        static READY: OnceLock<bool> = OnceLock::new();
        *READY.get_or_init(|| {
            // SAFETY: nvmlInit_v2 takes no arguments.
            library_present(Lib::Nvml) && unsafe { raw::nvmlInit_v2() } == Some(NVML_SUCCESS)
        })
    }

    fn nvml_device_by_uuid(&self, uuid: &DeviceUuid) -> Option<NvmlDevice> {
        if !self.nvml_ready() {
            return None;
        }
        let text = format!("{uuid}\0");
        let mut handle: NvmlDevice = null_mut();
        // SAFETY: a NUL-terminated UUID string and a live nvmlDevice_t local.
        let rc = unsafe { raw::nvmlDeviceGetHandleByUUID(text.as_ptr().cast(), &mut handle) }?;
        (rc == NVML_SUCCESS).then_some(handle)
    }

    fn nvml_instance_ids(&self, device: NvmlDevice) -> Option<(u32, u32)> {
        let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
        // SAFETY: an NVML device handle and a live unsigned int local each.
        let ok = unsafe { raw::nvmlDeviceGetGpuInstanceId(device, &mut gi) } == Some(NVML_SUCCESS)
            // SAFETY: as above.
            && unsafe { raw::nvmlDeviceGetComputeInstanceId(device, &mut ci) } == Some(NVML_SUCCESS);
        ok.then_some((gi, ci))
    }

    fn nvml_device_uuid(&self, device: NvmlDevice) -> Option<String> {
        let mut buf = [0u8; TEXT_BUFFER];
        // SAFETY: a buffer of the length NVML is told.
        let rc = unsafe { raw::nvmlDeviceGetUUID(device, buf.as_mut_ptr().cast::<c_char>(), buf.len() as c_uint) }?;
        if rc != NVML_SUCCESS {
            return None;
        }
        text_of(&buf)
    }

    fn nvml_all_uuids(&self) -> Result<Vec<String>, String> {
        if !self.nvml_ready() {
            return Err("NVML (libnvidia-ml.so.1) cannot be loaded or initialised".into());
        }
        let mut count: c_uint = 0;
        // SAFETY: a live unsigned int local.
        let rc = unsafe { raw::nvmlDeviceGetCount_v2(&mut count) }.ok_or("NVML has no nvmlDeviceGetCount_v2")?;
        if rc != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 failed with NVML error {rc}"));
        }
        let mut uuids = Vec::new();
        for index in 0..count {
            let mut device: NvmlDevice = null_mut();
            // SAFETY: a live nvmlDevice_t local.
            let rc = unsafe { raw::nvmlDeviceGetHandleByIndex_v2(index, &mut device) }.ok_or("NVML has no nvmlDeviceGetHandleByIndex_v2")?;
            if rc != NVML_SUCCESS {
                return Err(format!("nvmlDeviceGetHandleByIndex_v2({index}) failed with NVML error {rc}"));
            }
            uuids.push(self.nvml_device_uuid(device).ok_or_else(|| format!("nvmlDeviceGetUUID of GPU {index} failed"))?);
            uuids.extend(mig_uuids(self, device));
        }
        Ok(uuids)
    }

    fn nvml_memory(&self, device: NvmlDevice) -> Option<NvmlMemory> {
        let mut memory = NvmlMemory::default();
        // SAFETY: a live nvmlMemory_t local.
        let rc = unsafe { raw::nvmlDeviceGetMemoryInfo(device, &mut memory) }?;
        (rc == NVML_SUCCESS).then_some(memory)
    }

    fn nvml_compute_processes(&self, device: NvmlDevice) -> Option<Vec<NvmlProcessInfoV2>> {
        for sym in [Sym::nvmlDeviceGetComputeRunningProcesses_v3, Sym::nvmlDeviceGetComputeRunningProcesses_v2] {
            if get(sym).is_null() {
                continue;
            }
            let mut entries = vec![NvmlProcessInfoV2::default(); 256];
            let mut count = entries.len() as c_uint;
            let rc = if sym == Sym::nvmlDeviceGetComputeRunningProcesses_v3 {
                // SAFETY: `entries` holds `count` entries of the v2/v3 layout.
                unsafe { raw::nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, entries.as_mut_ptr()) }?
            } else {
                // SAFETY: as above.
                unsafe { raw::nvmlDeviceGetComputeRunningProcesses_v2(device, &mut count, entries.as_mut_ptr()) }?
            };
            if rc == NVML_SUCCESS {
                entries.truncate(count as usize);
                return Some(entries);
            }
        }
        let mut entries = vec![NvmlProcessInfoV1::default(); 256];
        let mut count = entries.len() as c_uint;
        // SAFETY: `entries` holds `count` entries of the v1 layout.
        let rc = unsafe { raw::nvmlDeviceGetComputeRunningProcesses(device, &mut count, entries.as_mut_ptr()) }?;
        (rc == NVML_SUCCESS).then(|| {
            entries[..(count as usize).min(entries.len())]
                .iter()
                .map(|e| NvmlProcessInfoV2 {
                    pid: e.pid,
                    used_gpu_memory: e.used_gpu_memory,
                    gpu_instance_id: NVML_NO_INSTANCE,
                    compute_instance_id: NVML_NO_INSTANCE,
                })
                .collect()
        })
    }

    fn nvml_process_samples(&self, device: NvmlDevice, last_seen_us: u64) -> Result<Vec<Sample>, SamplesError> {
        let mut count: c_uint = 0;
        for _ in 0..4 {
            let mut buffer = vec![NvmlProcessUtilizationSample::default(); count as usize];
            let pointer = if buffer.is_empty() { null_mut() } else { buffer.as_mut_ptr() };
            // SAFETY: `pointer` is null (a size query) or holds `count` samples.
            let rc = unsafe { raw::nvmlDeviceGetProcessUtilization(device, pointer, &mut count, last_seen_us) }
                .ok_or(SamplesError::Unavailable(NVML_ERROR_FUNCTION_NOT_FOUND))?;
            match rc {
                NVML_SUCCESS if !pointer.is_null() || count == 0 => {
                    buffer.truncate((count as usize).min(buffer.len()));
                    return Ok(buffer.iter().map(|s| Sample { pid: s.pid, timestamp_us: s.time_stamp, sm_util: s.sm_util }).collect());
                }
                NVML_ERROR_NOT_FOUND => return Ok(Vec::new()),
                NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => count = count.saturating_mul(2).max(count + 8),
                rc @ (NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND | NVML_ERROR_NO_PERMISSION) => return Err(SamplesError::Unavailable(rc)),
                rc => return Err(SamplesError::Transient(rc)),
            }
        }
        Err(SamplesError::Transient(NVML_ERROR_INSUFFICIENT_SIZE))
    }

    fn nvml_driver_version(&self) -> Option<String> {
        let mut buf = [0u8; TEXT_BUFFER];
        // SAFETY: a buffer of the length NVML is told.
        let rc = unsafe { raw::nvmlSystemGetDriverVersion(buf.as_mut_ptr().cast::<c_char>(), buf.len() as c_uint) }?;
        (rc == NVML_SUCCESS).then(|| text_of(&buf)).flatten()
    }
}
