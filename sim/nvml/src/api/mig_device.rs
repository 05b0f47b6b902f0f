//! MIG device handles: enumeration under the parent GPU, the way back to it, the instance
//! IDs behind a handle and the device's attributes (`nvmlDeviceGetAttributes_v2`).

use crate::boundary::*;
use fgpu_sim_state::mig::MAX_MIG_DEVICES;
use std::ffi::{c_uint, c_ulonglong};

/// `nvmlDeviceAttributes_t`.
#[repr(C)]
pub struct DeviceAttributes {
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub gpu_instance_slice_count: c_uint,
    pub compute_instance_slice_count: c_uint,
    pub memory_size_mb: c_ulonglong,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(h: NvmlDevice, is_mig: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (_, t) = tri!(target(h));
        if is_mig.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(is_mig, matches!(t, Target::Mig(_)) as c_uint);
        NVML_SUCCESS
    })
}

/// A MIG device's GPU instance ID; a GPU's handle does not answer (`NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(h: NvmlDevice, id: *mut c_uint) -> NvmlReturn {
    guard(|| match tri!(target(h)) {
        (_, Target::Mig(m)) if !id.is_null() => {
            put(id, m.gpu_instance.id);
            NVML_SUCCESS
        }
        (_, Target::Mig(_)) => NVML_ERROR_INVALID_ARGUMENT,
        (_, Target::Gpu(_)) => NVML_ERROR_NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(h: NvmlDevice, id: *mut c_uint) -> NvmlReturn {
    guard(|| match tri!(target(h)) {
        (_, Target::Mig(m)) if !id.is_null() => {
            put(id, m.compute_instance.id);
            NVML_SUCCESS
        }
        (_, Target::Mig(_)) => NVML_ERROR_INVALID_ARGUMENT,
        (_, Target::Gpu(_)) => NVML_ERROR_NOT_SUPPORTED,
    })
}

/// The MIG device at `index` under a GPU (`NOT_FOUND` for an index without one;
/// `INVALID_ARGUMENT` past `nvmlDeviceGetMaxMigDeviceCount`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(h: NvmlDevice, index: c_uint, out: *mut NvmlDevice) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if out.is_null() || index >= MAX_MIG_DEVICES {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if !s.mig_on(i) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        match s.mig_devices(i).into_iter().find(|m| m.index == index) {
            Some(m) => {
                put(out, mig_handle_of(&m));
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h: NvmlDevice, out: *mut NvmlDevice) -> NvmlReturn {
    guard(|| match tri!(target(h)) {
        (_, Target::Mig(m)) if !out.is_null() => {
            put(out, handle_of(m.device));
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// MIG device handles only ("This API currently only supports MIG device handles").
fn attributes(h: NvmlDevice, out: *mut DeviceAttributes) -> NvmlReturn {
    match tri!(target(h)) {
        (_, Target::Mig(m)) if !out.is_null() => {
            let g = &m.gpu_instance.profile;
            put(
                out,
                DeviceAttributes {
                    multiprocessor_count: m.sms(),
                    shared_copy_engine_count: g.copy_engines,
                    shared_decoder_count: g.decoders,
                    shared_encoder_count: g.encoders,
                    shared_jpeg_count: g.jpegs,
                    shared_ofa_count: g.ofas,
                    gpu_instance_slice_count: g.slices,
                    compute_instance_slice_count: m.compute_instance.profile.slices,
                    memory_size_mb: g.memory_mib,
                },
            );
            NVML_SUCCESS
        }
        (_, Target::Mig(_)) => NVML_ERROR_INVALID_ARGUMENT,
        (_, Target::Gpu(_)) => NVML_ERROR_NOT_SUPPORTED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(h: NvmlDevice, out: *mut DeviceAttributes) -> NvmlReturn {
    guard(|| attributes(h, out))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(h: NvmlDevice, out: *mut DeviceAttributes) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        attributes(h, out)
    })
}
