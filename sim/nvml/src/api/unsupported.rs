//! Features the simulated board does not have (Windows driver model, vGPU, GRID licensing,
//! NVLink fabric, confidential computing, ...): NVML_ERROR_NOT_SUPPORTED, as the real
//! library answers on such boards.

use super::memory::NvmlMemory;
use super::pci::NvmlPciInfo;
use crate::boundary::*;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

macro_rules! not_supported {
    ($($name:ident($($a:ident: $t:ty),*);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: NvmlDevice, $($a: $t),*) -> NvmlReturn {
            $(let _ = $a;)*
            guard(|| {
                tri!(dev(h));
                std::hint::black_box(stringify!($name));
                NVML_ERROR_NOT_SUPPORTED
            })
        }
    )*};
}

not_supported! {
    nvmlDeviceGetAutoBoostedClocksEnabled(is_enabled: *mut c_uint, default_is_enabled: *mut c_uint);
    nvmlDeviceGetBridgeChipInfo(hierarchy: *mut c_void);
    nvmlDeviceGetConfComputeProtectedMemoryUsage(memory: *mut NvmlMemory);
    nvmlDeviceGetDriverModel(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetGpuFabricInfo(info: *mut c_void);
    nvmlDeviceGetGpuOperationMode(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetGridLicensableFeatures_v4(features: *mut c_void);
    nvmlDeviceGetHostVgpuMode(mode: *mut c_uint);
    nvmlDeviceGetLastBBXFlushTime(timestamp: *mut c_ulonglong, duration_us: *mut std::ffi::c_ulong);
    nvmlDeviceGetRowRemapperHistogram(values: *mut c_void);
    nvmlDeviceGetSramEccErrorStatus(status: *mut c_void);
    nvmlDeviceGetViolationStatus(policy: c_uint, time: *mut c_void);
    nvmlDeviceGetTopologyNearestGpus(level: c_uint, count: *mut c_uint, devices: *mut NvmlDevice);
    nvmlDeviceGetCpuAffinity(size: c_uint, cpu_set: *mut std::ffi::c_ulong);
    nvmlDeviceGetMemoryAffinity(size: c_uint, node_set: *mut std::ffi::c_ulong, scope: c_uint);
    nvmlDeviceGetSupportedMemoryClocks(count: *mut c_uint, clocks: *mut c_uint);
    nvmlDeviceGetSupportedGraphicsClocks(memory_mhz: c_uint, count: *mut c_uint, clocks: *mut c_uint);
    nvmlDeviceGetSamples(kind: c_uint, last_seen: c_ulonglong, value_type: *mut c_uint, count: *mut c_uint, samples: *mut c_void);
    nvmlDeviceGetNvLinkCapability(link: c_uint, capability: c_uint, result: *mut c_uint);
    nvmlDeviceGetNvLinkRemotePciInfo_v2(link: c_uint, pci: *mut NvmlPciInfo);
    nvmlDeviceGetGpcClkVfOffset(offset: *mut c_int);
    nvmlDeviceGetConfComputeMemSizeInfo(info: *mut c_void);
}
