//! Exported CUDA driver entry points: initialisation, version and device queries.

use crate::boundary::*;
use crate::driver::driver;
use crate::errors::*;
use crate::{attributes, driver};
use std::ffi::{c_char, c_int, c_uint, CStr};

/// cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| if flags != 0 { CUDA_ERROR_INVALID_VALUE } else { driver::init() })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(|| {
        if version.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let v = match driver::state_only() {
            Some(s) => s.driver_version(),
            None => fgpu_sim_state::SimConfig::from_env().map(|c| c.driver_version).unwrap_or(12080),
        };
        put(version, v as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if device.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(d.check_dev(ordinal));
        put(device, ordinal);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if count.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(count, d.ndev() as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // A MIG device: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" (its GPU's name, "MIG", its profile).
        let text = match d.mig(dev) {
            Some(m) => format!("{} MIG {}", d.state.device_name(m.device), m.profile_name()),
            None => d.state.device_name(d.phys(dev)),
        };
        put_cstr(name, len as usize, &text);
        CUDA_SUCCESS
    })
}

/// `mig`: the device's own UUID, a MIG device's MIG UUID (`_v2`, CUDA 11.4+: "If the device
/// is in MIG mode, returns its MIG UUID"); otherwise its GPU's (the first version, which
/// predates MIG UUIDs).
fn get_uuid(uuid: *mut [u8; 16], dev: CUdevice, mig: bool) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    if uuid.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let bytes = match d.mig(dev) {
        Some(m) if mig => m.compute_instance.uuid,
        _ => d.state.device_uuid(d.phys(dev)),
    };
    put(uuid, bytes);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(|| get_uuid(uuid, dev, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    variant(1);
    guard(|| get_uuid(uuid, dev, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(bytes, d.total_mem(dev).min(u32::MAX as u64) as c_uint);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(bytes, d.total_mem(dev) as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pi.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match attributes::value(&d.state, d.phys(dev), d.multiprocessors(dev), attrib) {
            Some(v) => {
                put(pi, v);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        tri!(d.check_dev(dev));
        if major.is_null() || minor.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (ma, mi) = d.state.product().compute_capability();
        put(major, ma as c_int);
        put(minor, mi as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pci_bus_id.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = d.state.device_pci(d.phys(dev));
        put_cstr(pci_bus_id, len as usize, &format!("{:04x}:{:02x}:{:02x}.0", p.domain, p.bus, p.device));
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, pci_bus_id: *const c_char) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if dev.is_null() || pci_bus_id.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated string (CUDA API contract).
        let s = unsafe { CStr::from_ptr(pci_bus_id) }.to_string_lossy().to_ascii_lowercase();
        let parse = |s: &str| -> Option<(u32, u32, u32)> {
            let mut it = s.split(':');
            let (a, b, c) = (it.next()?, it.next()?, it.next());
            let (dom, bus, rest) = match c {
                Some(c) => (u32::from_str_radix(a, 16).ok()?, u32::from_str_radix(b, 16).ok()?, c),
                None => (0, u32::from_str_radix(a, 16).ok()?, b),
            };
            let devn = u32::from_str_radix(rest.split('.').next()?, 16).ok()?;
            Some((dom, bus, devn))
        };
        let Some((dom, bus, devn)) = parse(&s) else { return CUDA_ERROR_INVALID_VALUE };
        for o in 0..d.ndev() {
            let p = d.state.device_pci(d.phys(o));
            if (p.domain, p.bus, p.device) == (dom, bus, devn) {
                put(dev, o as c_int);
                return CUDA_SUCCESS;
            }
        }
        CUDA_ERROR_INVALID_DEVICE
    })
}
