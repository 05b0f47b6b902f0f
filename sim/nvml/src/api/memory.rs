//! Device memory: nvmlDeviceGetMemoryInfo(_v2) and BAR1.

use crate::boundary::*;
use fgpu_sim_state::SimState;
use std::ffi::{c_uint, c_ulonglong};

/// `nvmlMemory_v2` version: sizeof(nvmlMemory_v2_t) | 2 << 24.
pub(crate) const NVML_MEMORY_V2: c_uint = 0x0200_0028;

/// Returns (total, reserved, used by processes) of a GPU (in MIG mode: all its instances
/// together, "aggregate information") or of a MIG device (its GPU instance's memory, which
/// its compute instances share), dead processes reclaimed.
fn memory(s: &SimState, t: &Target) -> (u64, u64, u64) {
    s.reclaim_dead();
    match t {
        Target::Gpu(i) => (s.device_total(*i), s.driver_reserved(), s.device_used(*i)),
        Target::Mig(m) => (m.memory(), 0, s.gpu_instance_used(m.device, m.gpu_instance.id)),
    }
}

#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

const _: () = assert!(std::mem::size_of::<NvmlMemoryV2>() == 0x28);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(h: NvmlDevice, m: *mut NvmlMemory) -> NvmlReturn {
    guard(|| {
        let (s, t) = tri!(target(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (total, reserved, used) = memory(&s, &t);
        // Version 1 counts the driver's reservation as used.
        let used = used.saturating_add(reserved).min(total);
        put(m, NvmlMemory { total, free: total - used, used });
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(h: NvmlDevice, m: *mut NvmlMemoryV2) -> NvmlReturn {
    guard(|| {
        let (s, t) = tri!(target(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: m is non-NULL and points to an nvmlMemory_v2_t (NVML API contract).
        let version = unsafe { std::ptr::addr_of!((*m).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (total, reserved, used) = memory(&s, &t);
        let free = total.saturating_sub(reserved).saturating_sub(used);
        put(m, NvmlMemoryV2 { version, total, reserved, free, used });
        NVML_SUCCESS
    })
}

#[repr(C)]
pub struct NvmlBar1Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(h: NvmlDevice, m: *mut NvmlBar1Memory) -> NvmlReturn {
    guard(|| {
        let (s, t) = tri!(target(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // BAR1 as large as the framebuffer (large-BAR server part), 2 MiB used by the driver;
        // a MIG device's the share of its memory slices, less 1 MiB, none used (an A100's
        // 3g.40gb shows 0MiB / 65535MiB).
        let (total, used) = match t {
            Target::Gpu(i) => (s.device_total(i).next_power_of_two(), 2 << 20),
            Target::Mig(m) => ((s.device_total(m.device).next_power_of_two() / 8 * m.gpu_instance.size as u64).saturating_sub(1 << 20), 0),
        };
        put(m, NvmlBar1Memory { total, free: total - used, used });
        NVML_SUCCESS
    })
}
