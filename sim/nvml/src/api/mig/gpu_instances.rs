//! MIG mode, GPU instance profiles and placements, and GPU instances: created, destroyed,
//! listed and described.

use super::*;
use fgpu_sim_state::mig::{GiProfile, GI_PROFILE_COUNT, MAX_MIG_DEVICES};
use fgpu_sim_state::{GpuInstance, SimState};
use std::ffi::c_uint;

// ---- mode ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(h: NvmlDevice, current: *mut c_uint, pending: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if current.is_null() || pending.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (c, p) = mig!(s.mig_mode(i));
        put(current, c as c_uint);
        put(pending, p as c_uint);
        NVML_SUCCESS
    })
}

/// Root only ("Requires root user"). The activation status says whether the mode took
/// effect: `IN_USE` while processes hold the GPU, `RESET_REQUIRED` on Ampere.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(h: NvmlDevice, mode: c_uint, activation: *mut NvmlReturn) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if mode > 1 || activation.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if let Err(e) = s.mig_mode(i) {
            return code(e);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return NVML_ERROR_NO_PERMISSION;
        }
        let status = mig!(s.set_mig_mode(i, mode == 1));
        put(activation, status.map_or_else(code, |_| NVML_SUCCESS));
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(h: NvmlDevice, count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, if s.mig_on(i) { MAX_MIG_DEVICES } else { 0 });
        NVML_SUCCESS
    })
}

// ---- GPU instance profiles ----

fn gi_profile_of(s: &SimState, i: usize, index: c_uint) -> Result<&'static GiProfile, NvmlReturn> {
    if index >= GI_PROFILE_COUNT {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if !s.mig_on(i) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    s.product().gi_profile(index).ok_or(NVML_ERROR_NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(h: NvmlDevice, profile: c_uint, info: *mut GpuInstanceProfileInfo) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(gi_profile_of(&s, i, profile));
        put(
            info,
            GpuInstanceProfileInfo {
                id: p.id,
                is_p2p_supported: 0,
                slice_count: p.slices,
                instance_count: p.count,
                multiprocessor_count: p.sms,
                copy_engine_count: p.copy_engines,
                decoder_count: p.decoders,
                encoder_count: p.encoders,
                jpeg_count: p.jpegs,
                ofa_count: p.ofas,
                memory_size_mb: p.memory_mib,
            },
        );
        NVML_SUCCESS
    })
}

/// The versioned form: `version` must be `nvmlGpuInstanceProfileInfo_v2` or `_v3`; the
/// name is `MIG 3g.40gb`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(h: NvmlDevice, profile: c_uint, info: *mut GpuInstanceProfileInfoV2) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL; every version starts with the version word.
        let v = unsafe { (info as *const c_uint).read_unaligned() };
        if v != GI_PROFILE_INFO_V2 && v != GI_PROFILE_INFO_V3 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = tri!(gi_profile_of(&s, i, profile));
        let name = name_field(&format!("MIG {}", p.name));
        if v == GI_PROFILE_INFO_V2 {
            put(
                info,
                GpuInstanceProfileInfoV2 {
                    version: v,
                    id: p.id,
                    is_p2p_supported: 0,
                    slice_count: p.slices,
                    instance_count: p.count,
                    multiprocessor_count: p.sms,
                    copy_engine_count: p.copy_engines,
                    decoder_count: p.decoders,
                    encoder_count: p.encoders,
                    jpeg_count: p.jpegs,
                    ofa_count: p.ofas,
                    memory_size_mb: p.memory_mib,
                    name,
                },
            );
        } else {
            put(
                info as *mut GpuInstanceProfileInfoV3,
                GpuInstanceProfileInfoV3 {
                    version: v,
                    id: p.id,
                    slice_count: p.slices,
                    instance_count: p.count,
                    multiprocessor_count: p.sms,
                    copy_engine_count: p.copy_engines,
                    decoder_count: p.decoders,
                    encoder_count: p.encoders,
                    jpeg_count: p.jpegs,
                    ofa_count: p.ofas,
                    memory_size_mb: p.memory_mib,
                    name,
                    capabilities: 0,
                },
            );
        }
        NVML_SUCCESS
    })
}

/// Placements: a NULL array asks for the count; otherwise `*count` is the array's size on
/// entry (too small: `INSUFFICIENT_SIZE` and the count needed).
fn placements(h: NvmlDevice, profile_id: c_uint, out: *mut GpuInstancePlacement, count: *mut c_uint, sized: bool) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if count.is_null() || (!sized && out.is_null()) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let all = mig!(s.gpu_instance_placements(i, profile_id));
    // SAFETY: count is non-NULL (NVML API contract: an unsigned int).
    let capacity = unsafe { count.read_unaligned() } as usize;
    put(count, all.len() as c_uint);
    if out.is_null() {
        return NVML_SUCCESS;
    }
    if sized && capacity < all.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (k, &(start, size)) in all.iter().enumerate() {
        // SAFETY: the caller's array holds the profile's placements (NVML API contract).
        put(unsafe { out.add(k) }, GpuInstancePlacement { start, size });
    }
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    h: NvmlDevice,
    profile_id: c_uint,
    out: *mut GpuInstancePlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| placements(h, profile_id, out, count, true))
}

/// The first version: the array is required and sized for the profile's instance count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    h: NvmlDevice,
    profile_id: c_uint,
    out: *mut GpuInstancePlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| placements(h, profile_id, out, count, false))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(h: NvmlDevice, profile_id: c_uint, count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, mig!(s.gpu_instance_capacity(i, profile_id)));
        NVML_SUCCESS
    })
}

// ---- GPU instances ----

fn create_gi(h: NvmlDevice, profile_id: c_uint, placement: *const GpuInstancePlacement, out: *mut NvmlGpuInstance, placed: bool) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if out.is_null() || (placed && placement.is_null()) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let all = mig!(s.gpu_instance_placements(i, profile_id));
    let start = if placed {
        // SAFETY: non-NULL, the caller's nvmlGpuInstancePlacement_t.
        let p = unsafe { placement.read_unaligned() };
        if !all.contains(&(p.start, p.size)) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        Some(p.start)
    } else {
        None
    };
    if !privileged() {
        return NVML_ERROR_NO_PERMISSION;
    }
    if start.is_some() && rival_wins() {
        // Another creator took this placement between the caller's look and its create:
        // the rival's instance stays, and the caller is answered as NVML answers a taken
        // placement.
        let _ = s.create_gpu_instance(i, profile_id, start);
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    let g = mig!(s.create_gpu_instance(i, profile_id, start));
    put(out, gi_handle(&g));
    NVML_SUCCESS
}

/// Whether a simulated rival creates at the placement this process asked for, first
/// (`FGPU_SIM_MIG_RACE=N`: the first N creations with a placement in this process lose such
/// a race). Lets a test put another creator between a tool's look and its create, which no
/// test can time.
fn rival_wins() -> bool {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LEFT: AtomicI64 = AtomicI64::new(-1);
    if LEFT.load(Ordering::Relaxed) < 0 {
        let n = std::env::var("FGPU_SIM_MIG_RACE").ok().and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(0).max(0);
        let _ = LEFT.compare_exchange(-1, n, Ordering::Relaxed, Ordering::Relaxed);
    }
    LEFT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n > 0).then(|| n - 1)).is_ok()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(h: NvmlDevice, profile_id: c_uint, out: *mut NvmlGpuInstance) -> NvmlReturn {
    guard(|| create_gi(h, profile_id, std::ptr::null(), out, false))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    h: NvmlDevice,
    profile_id: c_uint,
    placement: *const GpuInstancePlacement,
    out: *mut NvmlGpuInstance,
) -> NvmlReturn {
    guard(|| create_gi(h, profile_id, placement, out, true))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: NvmlGpuInstance) -> NvmlReturn {
    guard(|| {
        let (s, g) = tri!(gi_of(gi));
        if !privileged() {
            return NVML_ERROR_NO_PERMISSION;
        }
        mig!(s.destroy_gpu_instance(g.device, g.id));
        NVML_SUCCESS
    })
}

/// The GPU instances of a profile; the array must hold the profile's instance count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(h: NvmlDevice, profile_id: c_uint, out: *mut NvmlGpuInstance, count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if out.is_null() || count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        mig!(s.gpu_instance_placements(i, profile_id));
        let all: Vec<GpuInstance> = mig!(s.gpu_instances(i)).into_iter().filter(|g| g.profile.id == profile_id).collect();
        for (k, g) in all.iter().enumerate() {
            // SAFETY: the caller's array holds the profile's instance count (NVML API contract).
            put(unsafe { out.add(k) }, gi_handle(g));
        }
        put(count, all.len() as c_uint);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(h: NvmlDevice, id: c_uint, out: *mut NvmlGpuInstance) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let g = mig!(s.gpu_instance(i, id));
        put(out, gi_handle(&g));
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(gi: NvmlGpuInstance, info: *mut GpuInstanceInfo) -> NvmlReturn {
    guard(|| {
        let (_, g) = tri!(gi_of(gi));
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(
            info,
            GpuInstanceInfo {
                device: handle_of(g.device),
                id: g.id,
                profile_id: g.profile.id,
                placement: GpuInstancePlacement { start: g.start, size: g.size },
            },
        );
        NVML_SUCCESS
    })
}
