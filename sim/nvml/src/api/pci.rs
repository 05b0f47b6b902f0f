//! PCI information (v1, v2, v3 layouts) and PCIe throughput.

use super::device::device_u32;
use crate::boundary::*;
use fgpu_sim_state::SimState;
use std::ffi::c_uint;

/// `nvmlPciInfo_t` (v3 layout, 68 bytes).
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [u8; 32],
}

/// The pre-v3 layout used by nvmlDeviceGetPciInfo and _v2 (52 bytes).
#[repr(C)]
pub struct NvmlPciInfoLegacy {
    pub bus_id: [u8; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub reserved: [c_uint; 4],
}

const _: () = assert!(std::mem::size_of::<NvmlPciInfo>() == 68);
const _: () = assert!(std::mem::size_of::<NvmlPciInfoLegacy>() == 52);

fn fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    let n = s.len().min(N - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

fn pci_strings(s: &SimState, i: usize) -> (String, String) {
    let p = s.device_pci(i);
    (format!("{:04X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device), format!("{:08X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(h: NvmlDevice, pci: *mut NvmlPciInfo) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if pci.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = s.device_pci(i);
        let (legacy, full) = pci_strings(&s, i);
        put(
            pci,
            NvmlPciInfo {
                bus_id_legacy: fixed(&legacy),
                domain: p.domain,
                bus: p.bus,
                device: p.device,
                pci_device_id: p.pci_device_id,
                pci_sub_system_id: p.pci_subsystem_id,
                bus_id: fixed(&full),
            },
        );
        NVML_SUCCESS
    })
}

fn pci_legacy(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let p = s.device_pci(i);
    let (legacy, _) = pci_strings(&s, i);
    put(
        pci,
        NvmlPciInfoLegacy {
            bus_id: fixed(&legacy),
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pci_device_id: p.pci_device_id,
            pci_sub_system_id: p.pci_subsystem_id,
            reserved: [0; 4],
        },
    );
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    guard(|| pci_legacy(h, pci))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        pci_legacy(h, pci)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(h: NvmlDevice, _counter: c_uint, value: *mut c_uint) -> NvmlReturn {
    guard(|| device_u32(h, value, |_, _| 0))
}
