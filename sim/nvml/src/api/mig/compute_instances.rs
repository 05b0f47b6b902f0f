//! Compute instance profiles and placements inside a GPU instance, and compute instances:
//! created, destroyed, listed and described.

use super::*;
use fgpu_sim_state::mig::{CiProfile, CI_PROFILE_COUNT};
use fgpu_sim_state::{ComputeInstance, GpuInstance, SimState};
use std::ffi::c_uint;

// ---- compute instance profiles ----

fn ci_profile_of(s: &SimState, g: &GpuInstance, index: c_uint, engine: c_uint) -> Result<CiProfile, NvmlReturn> {
    if index >= CI_PROFILE_COUNT || engine != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    s.product().ci_profiles(&g.profile).into_iter().find(|p| p.index == index).ok_or(NVML_ERROR_NOT_SUPPORTED)
}

fn ci_info_v2(g: &GpuInstance, p: &CiProfile, version: c_uint) -> ComputeInstanceProfileInfoV2 {
    ComputeInstanceProfileInfoV2 {
        version,
        id: p.index,
        slice_count: p.slices,
        instance_count: p.count,
        multiprocessor_count: p.sms,
        shared_copy_engine_count: g.profile.copy_engines,
        shared_decoder_count: g.profile.decoders,
        shared_encoder_count: g.profile.encoders,
        shared_jpeg_count: g.profile.jpegs,
        shared_ofa_count: g.profile.ofas,
        name: name_field(&format!("MIG {}", p.name)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: NvmlGpuInstance,
    profile: c_uint,
    engine: c_uint,
    info: *mut ComputeInstanceProfileInfo,
) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(ci_profile_of(&s, &g, profile, engine));
        let v = ci_info_v2(&g, &p, 0);
        put(
            info,
            ComputeInstanceProfileInfo {
                id: v.id,
                slice_count: v.slice_count,
                instance_count: v.instance_count,
                multiprocessor_count: v.multiprocessor_count,
                shared_copy_engine_count: v.shared_copy_engine_count,
                shared_decoder_count: v.shared_decoder_count,
                shared_encoder_count: v.shared_encoder_count,
                shared_jpeg_count: v.shared_jpeg_count,
                shared_ofa_count: v.shared_ofa_count,
            },
        );
        NVML_SUCCESS
    })
}

/// The versioned form (`nvmlComputeInstanceProfileInfo_v2` or `_v3`); the name is
/// `MIG 1c.3g.40gb`, or the GPU instance's for the profile as large as it.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gi: NvmlGpuInstance,
    profile: c_uint,
    engine: c_uint,
    info: *mut ComputeInstanceProfileInfoV2,
) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL; every version starts with the version word.
        let v = unsafe { (info as *const c_uint).read_unaligned() };
        if v != CI_PROFILE_INFO_V2 && v != CI_PROFILE_INFO_V3 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(ci_profile_of(&s, &g, profile, engine));
        if v == CI_PROFILE_INFO_V2 {
            put(info, ci_info_v2(&g, &p, v));
        } else {
            let v2 = ci_info_v2(&g, &p, v);
            put(
                info as *mut ComputeInstanceProfileInfoV3,
                ComputeInstanceProfileInfoV3 {
                    version: v2.version,
                    id: v2.id,
                    slice_count: v2.slice_count,
                    instance_count: v2.instance_count,
                    multiprocessor_count: v2.multiprocessor_count,
                    shared_copy_engine_count: v2.shared_copy_engine_count,
                    shared_decoder_count: v2.shared_decoder_count,
                    shared_encoder_count: v2.shared_encoder_count,
                    shared_jpeg_count: v2.shared_jpeg_count,
                    shared_ofa_count: v2.shared_ofa_count,
                    name: v2.name,
                    capabilities: 0,
                },
            );
        }
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi: NvmlGpuInstance, profile_id: c_uint, count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, mig!(s.compute_instance_capacity(g.device, g.id, profile_id)));
        NVML_SUCCESS
    })
}

/// Placements of a compute instance profile; a NULL array asks for the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gi: NvmlGpuInstance,
    profile_id: c_uint,
    out: *mut ComputeInstancePlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let all = mig!(s.compute_instance_placements(g.device, g.id, profile_id));
        // SAFETY: count is non-NULL (NVML API contract: an unsigned int).
        let capacity = unsafe { count.read_unaligned() } as usize;
        put(count, all.len() as c_uint);
        if out.is_null() {
            return NVML_SUCCESS;
        }
        if capacity < all.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (k, &(start, size)) in all.iter().enumerate() {
            // SAFETY: the caller's array holds `capacity` >= all.len() entries.
            put(unsafe { out.add(k) }, ComputeInstancePlacement { start, size });
        }
        NVML_SUCCESS
    })
}

// ---- compute instances ----

fn create_ci(gi: NvmlGpuInstance, profile_id: c_uint, placement: *const ComputeInstancePlacement, out: *mut NvmlComputeInstance, placed: bool) -> NvmlReturn {
    let (s, g) = tri!(gi_of(gi));
    if out.is_null() || (placed && placement.is_null()) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if profile_id >= CI_PROFILE_COUNT {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let start = if placed {
        // SAFETY: non-NULL, the caller's nvmlComputeInstancePlacement_t.
        Some(unsafe { placement.read_unaligned() }.start)
    } else {
        None
    };
    if !privileged() {
        return NVML_ERROR_NO_PERMISSION;
    }
    let c = mig!(s.create_compute_instance(g.device, g.id, profile_id, start));
    put(out, ci_handle(&c));
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(gi: NvmlGpuInstance, profile_id: c_uint, out: *mut NvmlComputeInstance) -> NvmlReturn {
    guard(|| create_ci(gi, profile_id, std::ptr::null(), out, false))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gi: NvmlGpuInstance,
    profile_id: c_uint,
    placement: *const ComputeInstancePlacement,
    out: *mut NvmlComputeInstance,
) -> NvmlReturn {
    guard(|| create_ci(gi, profile_id, placement, out, true))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: NvmlComputeInstance) -> NvmlReturn {
    guard(|| {
        let (s, g, c) = tri!(ci_of(ci));
        if !privileged() {
            return NVML_ERROR_NO_PERMISSION;
        }
        mig!(s.destroy_compute_instance(g.device, g.id, c.id));
        NVML_SUCCESS
    })
}

/// The compute instances of a profile; the array must hold the profile's instance count.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: NvmlGpuInstance,
    profile_id: c_uint,
    out: *mut NvmlComputeInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if out.is_null() || count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        mig!(s.compute_instance_placements(g.device, g.id, profile_id));
        let all: Vec<ComputeInstance> = mig!(s.compute_instances(g.device, g.id)).into_iter().filter(|c| c.profile.index == profile_id).collect();
        for (k, c) in all.iter().enumerate() {
            // SAFETY: the caller's array holds the profile's instance count (NVML API contract).
            put(unsafe { out.add(k) }, ci_handle(c));
        }
        put(count, all.len() as c_uint);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(gi: NvmlGpuInstance, id: c_uint, out: *mut NvmlComputeInstance) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let c = mig!(s.compute_instances(g.device, g.id)).into_iter().find(|c| c.id == id);
        match c {
            Some(c) => {
                put(out, ci_handle(&c));
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

fn ci_info(ci: NvmlComputeInstance, info: *mut ComputeInstanceInfo) -> NvmlReturn {
    let (_, g, c) = tri!(ci_of(ci));
    if info.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(
        info,
        ComputeInstanceInfo {
            device: handle_of(g.device),
            gpu_instance: gi_handle(&g),
            id: c.id,
            profile_id: c.profile.index,
            placement: ComputeInstancePlacement { start: c.start, size: c.size },
        },
    );
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(ci: NvmlComputeInstance, info: *mut ComputeInstanceInfo) -> NvmlReturn {
    guard(|| ci_info(ci, info))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(ci: NvmlComputeInstance, info: *mut ComputeInstanceInfo) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        ci_info(ci, info)
    })
}
