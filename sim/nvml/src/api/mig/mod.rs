//! Multi-Instance GPU management (nvml.h, "Multi Instance GPU Management"): MIG mode, GPU
//! and compute instance profiles, placements, capacity, creation and destruction, and the
//! instance handles, over the shared MIG state of `fgpu_sim_state::mig`.

use crate::boundary::*;
use fgpu_sim_state::mig::{CiProfile, GiProfile, CI_PROFILE_COUNT, GI_PROFILE_COUNT, MAX_MIG_DEVICES};
use fgpu_sim_state::{ComputeInstance, GpuInstance, MigError, SimState};
use std::ffi::{c_char, c_uint, c_ulonglong};

/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
const NAME_V2: usize = 96;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub(crate) const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0;

pub type NvmlGpuInstance = *const u64;
pub type NvmlComputeInstance = *const u64;

/// `nvmlGpuInstancePlacement_t` (memory slices).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GpuInstancePlacement {
    pub start: c_uint,
    pub size: c_uint,
}

/// `nvmlComputeInstancePlacement_t` (compute slices of the GPU instance).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ComputeInstancePlacement {
    pub start: c_uint,
    pub size: c_uint,
}

/// `nvmlGpuInstanceProfileInfo_t`.
#[repr(C)]
pub struct GpuInstanceProfileInfo {
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
}

/// `nvmlGpuInstanceProfileInfo_v2_t`.
#[repr(C)]
pub struct GpuInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub is_p2p_supported: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; NAME_V2],
}

/// `nvmlGpuInstanceProfileInfo_v3_t` (no `isP2pSupported`; `capabilities` at the end).
#[repr(C)]
pub struct GpuInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub copy_engine_count: c_uint,
    pub decoder_count: c_uint,
    pub encoder_count: c_uint,
    pub jpeg_count: c_uint,
    pub ofa_count: c_uint,
    pub memory_size_mb: c_ulonglong,
    pub name: [c_char; NAME_V2],
    pub capabilities: c_uint,
}

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
pub struct GpuInstanceInfo {
    pub device: NvmlDevice,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: GpuInstancePlacement,
}

/// `nvmlComputeInstanceProfileInfo_t`.
#[repr(C)]
pub struct ComputeInstanceProfileInfo {
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
}

/// `nvmlComputeInstanceProfileInfo_v2_t`.
#[repr(C)]
pub struct ComputeInstanceProfileInfoV2 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; NAME_V2],
}

/// `nvmlComputeInstanceProfileInfo_v3_t` (v2's members and `capabilities`).
#[repr(C)]
pub struct ComputeInstanceProfileInfoV3 {
    pub version: c_uint,
    pub id: c_uint,
    pub slice_count: c_uint,
    pub instance_count: c_uint,
    pub multiprocessor_count: c_uint,
    pub shared_copy_engine_count: c_uint,
    pub shared_decoder_count: c_uint,
    pub shared_encoder_count: c_uint,
    pub shared_jpeg_count: c_uint,
    pub shared_ofa_count: c_uint,
    pub name: [c_char; NAME_V2],
    pub capabilities: c_uint,
}

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
pub struct ComputeInstanceInfo {
    pub device: NvmlDevice,
    pub gpu_instance: NvmlGpuInstance,
    pub id: c_uint,
    pub profile_id: c_uint,
    pub placement: ComputeInstancePlacement,
}

/// `NVML_STRUCT_VERSION(data, ver)`: the struct's size and the version in the top byte.
const fn version(size: usize, v: u32) -> c_uint {
    size as c_uint | (v << 24)
}
pub(crate) const GI_PROFILE_INFO_V2: c_uint = version(std::mem::size_of::<GpuInstanceProfileInfoV2>(), 2);
pub(crate) const GI_PROFILE_INFO_V3: c_uint = version(std::mem::size_of::<GpuInstanceProfileInfoV3>(), 3);
pub(crate) const CI_PROFILE_INFO_V2: c_uint = version(std::mem::size_of::<ComputeInstanceProfileInfoV2>(), 2);
pub(crate) const CI_PROFILE_INFO_V3: c_uint = version(std::mem::size_of::<ComputeInstanceProfileInfoV3>(), 3);

/// GPU instance handles: the address of the word of (GPU, GPU instance ID).
static GI_HANDLES: [[u64; GI_IDS]; fgpu_sim_state::MAX_DEVICES] = [[0; GI_IDS]; fgpu_sim_state::MAX_DEVICES];
/// Compute instance handles: the address of the word of (GPU, GPU instance ID, ID).
static CI_HANDLES: [[[u64; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES] = [[[0; CI_IDS]; GI_IDS]; fgpu_sim_state::MAX_DEVICES];

fn gi_handle(g: &GpuInstance) -> NvmlGpuInstance {
    &GI_HANDLES[g.device][g.id as usize] as *const u64
}

fn ci_handle(c: &ComputeInstance) -> NvmlComputeInstance {
    &CI_HANDLES[c.device][c.gpu_instance as usize][c.id as usize] as *const u64
}

/// The NVML code of a MIG error.
pub(crate) fn code(e: MigError) -> NvmlReturn {
    match e {
        MigError::NotSupported => NVML_ERROR_NOT_SUPPORTED,
        MigError::InvalidArgument => NVML_ERROR_INVALID_ARGUMENT,
        MigError::InsufficientResources => NVML_ERROR_INSUFFICIENT_RESOURCES,
        MigError::InUse => NVML_ERROR_IN_USE,
        MigError::NotFound => NVML_ERROR_NOT_FOUND,
        MigError::ResetRequired => NVML_ERROR_RESET_REQUIRED,
    }
}

macro_rules! mig {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return code(e),
        }
    };
}

/// The GPU instance behind a handle (it must still exist).
fn gi_of(h: NvmlGpuInstance) -> Result<(SimState, GpuInstance), NvmlReturn> {
    let s = ready()?;
    let k = word_index(h as usize, GI_HANDLES.as_ptr() as *const u64, fgpu_sim_state::MAX_DEVICES * GI_IDS).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    present(&s, k / GI_IDS)?;
    let g = s.gpu_instance(k / GI_IDS, (k % GI_IDS) as u32).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((s, g))
}

/// The compute instance behind a handle (it must still exist).
fn ci_of(h: NvmlComputeInstance) -> Result<(SimState, GpuInstance, ComputeInstance), NvmlReturn> {
    let s = ready()?;
    let k = word_index(h as usize, CI_HANDLES.as_ptr() as *const u64, fgpu_sim_state::MAX_DEVICES * GI_IDS * CI_IDS).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let (d, gi, ci) = (k / (GI_IDS * CI_IDS), ((k / CI_IDS) % GI_IDS) as u32, (k % CI_IDS) as u32);
    present(&s, d)?;
    let g = s.gpu_instance(d, gi).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    let c = s.compute_instances(d, gi).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?.into_iter().find(|c| c.id == ci).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((s, g, c))
}

/// Whether the caller may create and destroy instances: root, or read access to the
/// simulator's `mig/config` capability file (as to `/proc/driver/nvidia/capabilities/mig/config`).
fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let path = fgpu_sim_state::mig_config_capability_path(&SimState::default_path());
    let Ok(c) = std::ffi::CString::new(path.into_os_string().into_encoded_bytes()) else { return false };
    // SAFETY: c is a NUL-terminated path; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::R_OK, libc::AT_EACCESS) == 0 }
}

fn name_field(name: &str) -> [c_char; NAME_V2] {
    let mut out = [0 as c_char; NAME_V2];
    for (k, b) in name.bytes().take(NAME_V2 - 1).enumerate() {
        out[k] = b as c_char;
    }
    out
}

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
