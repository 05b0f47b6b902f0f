//! Device enumeration (by index, UUID, PCI bus id) and each device's names, versions and
//! numeric properties.

use super::system::driver_version_string;
use crate::boundary::*;
use fgpu_sim_state::SimState;
use std::ffi::{c_char, c_int, c_uint, CStr};

fn count(c: *mut c_uint) -> NvmlReturn {
    let s = tri!(ready());
    if c.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(c, s.device_count() as c_uint);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(c: *mut c_uint) -> NvmlReturn {
    guard(|| count(c))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(c: *mut c_uint) -> NvmlReturn {
    guard(|| count(c))
}

fn by_index(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    let s = tri!(ready());
    if h.is_null() || i as usize >= s.device_count() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    tri!(present(&s, i as usize));
    put(h, handle_of(i as usize));
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, h))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, h))
}

fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string (NVML API contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        let (Some(u), false) = (c_string(uuid), h.is_null()) else { return NVML_ERROR_INVALID_ARGUMENT };
        // nvml.h: "NVML_ERROR_GPU_IS_LOST if any GPU has fallen off the bus".
        if let Some(lost) = (0..s.device_count()).find(|&i| s.gpu_lost(i)) {
            tri!(present(&s, lost));
        }
        if let Some(i) = (0..s.device_count()).find(|&i| s.device_uuid_string(i).eq_ignore_ascii_case(u.trim())) {
            put(h, handle_of(i));
            return NVML_SUCCESS;
        }
        // "The UUID of the target GPU or MIG instance": a MIG device's whole UUID.
        match s.mig_device_by_uuid(&u).filter(|m| m.uuid_string().eq_ignore_ascii_case(u.trim())) {
            Some(m) => {
                put(h, mig_handle_of(&m));
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (dom, bus, rest) = match parts.len() {
        3 => (u32::from_str_radix(parts[0], 16).ok()?, u32::from_str_radix(parts[1], 16).ok()?, parts[2]),
        2 => (0, u32::from_str_radix(parts[0], 16).ok()?, parts[1]),
        _ => return None,
    };
    let d = u32::from_str_radix(rest.split('.').next()?, 16).ok()?;
    Some((dom, bus, d))
}

fn by_pci(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    let s = tri!(ready());
    let (Some(b), false) = (c_string(bus_id), h.is_null()) else { return NVML_ERROR_INVALID_ARGUMENT };
    let Some(want) = parse_bus_id(&b) else { return NVML_ERROR_INVALID_ARGUMENT };
    for i in 0..s.device_count() {
        let p = s.device_pci(i);
        if (p.domain, p.bus, p.device) == want {
            tri!(present(&s, i));
            put(h, handle_of(i));
            return NVML_SUCCESS;
        }
    }
    NVML_ERROR_NOT_FOUND
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_pci(bus_id, h))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_pci(bus_id, h))
}

/// A GPU's index, or a MIG device's index under its GPU ("unique within a device").
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(h: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (_, t) = tri!(target(h));
        if index.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(
            index,
            match t {
                Target::Gpu(i) => i as c_uint,
                Target::Mig(m) => m.index,
            },
        );
        NVML_SUCCESS
    })
}

/// A MIG device's name is its GPU's with "MIG" and its profile: `NVIDIA H100 80GB HBM3
/// MIG 3g.40gb` (what CUDA reports too).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(h: NvmlDevice, name: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, t) = tri!(target(h));
        let text = match t {
            Target::Gpu(i) => s.device_name(i),
            Target::Mig(m) => format!("{} MIG {}", s.device_name(m.device), m.profile_name()),
        };
        put_str(name, length, &text)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(h: NvmlDevice, uuid: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, t) = tri!(target(h));
        let text = match t {
            Target::Gpu(i) => s.device_uuid_string(i),
            Target::Mig(m) => m.uuid_string(),
        };
        put_str(uuid, length, &text)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(h: NvmlDevice, serial: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        put_str(serial, length, &s.device_serial(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(h: NvmlDevice, pn: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(pn, length, "699-2G530-0200-000")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(h: NvmlDevice, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "96.00.99.00.01")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(h: NvmlDevice, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "G530.0200.00.05")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(h: NvmlDevice, _object: c_uint, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "1.0")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareVersion(h: NvmlDevice, v: *mut c_char) -> NvmlReturn {
    guard(|| {
        let (s, _) = tri!(dev(h));
        // NVML_GSP_FIRMWARE_VERSION_BUF_SIZE is 0x40.
        put_str(v, 0x40, driver_version_string(s.driver_version()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareMode(h: NvmlDevice, enabled: *mut c_uint, default_mode: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put(enabled, 1);
        put(default_mode, 1);
        NVML_SUCCESS
    })
}

/// Writes a fixed u32 answer for a device query.
pub(super) fn device_u32(h: NvmlDevice, out: *mut c_uint, v: impl FnOnce(&SimState, usize) -> c_uint) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(out, v(&s, i));
    NVML_SUCCESS
}

macro_rules! u32_query {
    ($($name:ident => $v:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: NvmlDevice, out: *mut c_uint) -> NvmlReturn {
            guard(|| device_u32(h, out, $v))
        }
    )*};
}

u32_query! {
    nvmlDeviceGetMinorNumber => |s, i| s.device_minor(i);
    nvmlDeviceGetBrand => |_, _| 2;                 // NVML_BRAND_TESLA
    nvmlDeviceGetArchitecture => |s, _| s.product().architecture();
    nvmlDeviceGetMultiGpuBoard => |_, _| 0;
    nvmlDeviceGetBoardId => |s, i| s.device_pci(i).bus << 8;
    nvmlDeviceGetModuleId => |_, i| i as c_uint + 1;
    nvmlDeviceGetCurrPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetMaxPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetGpuMaxPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetCurrPcieLinkWidth => |_, _| 16;
    nvmlDeviceGetMaxPcieLinkWidth => |_, _| 16;
    nvmlDeviceGetPcieReplayCounter => |_, _| 0;
    nvmlDeviceGetPersistenceMode => |_, _| 1;       // NVML_FEATURE_ENABLED
    nvmlDeviceGetComputeMode => |_, _| 0;           // NVML_COMPUTEMODE_DEFAULT
    nvmlDeviceGetPerformanceState => |_, _| 0;      // NVML_PSTATE_0
    nvmlDeviceGetPowerState => |_, _| 0;
    nvmlDeviceGetPowerUsage => |_, _| 72_000;       // mW
    nvmlDeviceGetPowerManagementLimit => |_, _| 700_000;
    nvmlDeviceGetPowerManagementDefaultLimit => |_, _| 700_000;
    nvmlDeviceGetEnforcedPowerLimit => |_, _| 700_000;
    nvmlDeviceGetPowerManagementMode => |_, _| 1;
    nvmlDeviceGetDisplayMode => |_, _| 0;
    nvmlDeviceGetDisplayActive => |_, _| 0;
    nvmlDeviceGetVirtualizationMode => |_, _| 0;    // NVML_GPU_VIRTUALIZATION_MODE_NONE
    // NVML_FEATURE_ENABLED; "On MIG-enabled GPUs, accounting mode would be set to DISABLED".
    nvmlDeviceGetAccountingMode => |s, i| !s.mig_on(i) as c_uint;
    nvmlDeviceGetAccountingBufferSize => |_, _| 4000;
    nvmlDeviceGetRetiredPagesPendingStatus => |_, _| 0;
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(h: NvmlDevice, major: *mut c_int, minor: *mut c_int) -> NvmlReturn {
    guard(|| {
        let (s, _) = tri!(target(h));
        if major.is_null() || minor.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (ma, mi) = s.product().compute_capability();
        put(major, ma as c_int);
        put(minor, mi as c_int);
        NVML_SUCCESS
    })
}
