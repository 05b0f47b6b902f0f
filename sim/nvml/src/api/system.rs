//! System queries: driver, NVML and CUDA versions, process names, units, excluded devices,
//! the export table nvidia-smi asks for.

use crate::boundary::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Linux driver version string for the simulated CUDA version: the minimum driver of
/// that CUDA release as NVIDIA's release notes list it.
pub(super) fn driver_version_string(cuda: u32) -> &'static str {
    match cuda {
        ..=12000 => "525.60.13",
        12001..=12010 => "530.30.02",
        12011..=12020 => "535.54.03",
        12021..=12030 => "545.23.06",
        12031..=12040 => "550.54.14",
        12041..=12050 => "555.42.02",
        12051..=12060 => "560.28.03",
        12061..=12080 => "570.26",
        12081..=12090 => "575.51.03",
        _ => "580.65.06",
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        put_str(version, length, driver_version_string(s.driver_version()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        let v = format!("{}.{}", s.driver_version() / 1000, driver_version_string(s.driver_version()));
        put_str(version, length, &v)
    })
}

fn cuda_version(v: *mut c_int) -> NvmlReturn {
    let s = tri!(ready());
    if v.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(v, s.driver_version() as c_int);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> NvmlReturn {
    guard(|| cuda_version(v))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> NvmlReturn {
    guard(|| cuda_version(v))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        let n = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
            .or_else(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string()));
        match n {
            Some(n) => {
                let cut: String = n.chars().take((length as usize).saturating_sub(1)).collect();
                put_str(name, length, &cut)
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetHicVersion(count: *mut c_uint, _entries: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        put(count, 0);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlUnitGetCount(count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, 0);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, 0);
        NVML_SUCCESS
    })
}

/// nvidia-smi requires this private entry point to succeed. A table that holds only its
/// own size makes it fall back to the public API.
#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(table: *mut *const c_void, _id: *const c_void) -> NvmlReturn {
    static TABLE: [u64; 1] = [8];
    guard(|| {
        if table.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(table, TABLE.as_ptr() as *const c_void);
        NVML_SUCCESS
    })
}
