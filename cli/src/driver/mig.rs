//! NVML's MIG calls as `fgpu mig` and `fgpu run --mig` make them: profiles, placements, GPU
//! and compute instances, and the MIG devices they stand for. Like `calls.rs` (whose
//! [`Nvml`] gives the devices), each function is looked up under the name of its C
//! prototype in `fgpu-abi` (checked against `nvml.h`), and each call is a safe method that
//! names the C call it models and returns what the C call writes.

use super::calls::{Device, Nvml};
use fgpu_abi::nvml::{
    NvmlComputeInstance, NvmlComputeInstanceInfo, NvmlComputeInstanceProfileInfo, NvmlDevice, NvmlGpuInstance, NvmlGpuInstanceInfo,
    NvmlGpuInstanceProfileInfoV2, NvmlReturn, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_GPU_INSTANCE_PROFILE_INFO_V2, NVML_SUCCESS,
};
use fgpu_abi::prototypes::proto;
use fgpu_core::sys::host::{dlopen, Library};
use std::ffi::c_char;
use std::marker::PhantomData;

pub use fgpu_abi::nvml::NvmlGpuInstancePlacement as Placement;

/// As `calls.rs`'s: `name` as the function pointer type `proto::name`, or `None`.
macro_rules! lookup {
    ($library:expr, $name:ident) => {
        $library.symbol(&std::ffi::CString::new(stringify!($name)).expect("a C identifier")).map(|address| {
            // SAFETY: `address` is the driver's `$name`, whose C prototype is
            // `proto::$name` (fgpu-abi, checked against nvml.h); a function pointer and a
            // data pointer have the same size on every target fgpu supports.
            unsafe { std::mem::transmute::<*mut std::ffi::c_void, proto::$name>(address.as_ptr()) }
        })
    };
}

fn nvml(rc: NvmlReturn) -> Result<(), NvmlReturn> {
    if rc == NVML_SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

/// At most this many instances of one profile are asked for (a GPU has at most 7, 8 memory
/// slices).
const MAX_INSTANCES: usize = 16;

/// A GPU instance profile as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`: what `nvmlDeviceGetGpuInstanceProfileInfoV` is asked.
    pub index: u32,
    /// The profile ID (`nvidia-smi mig -lgip`'s `ID`).
    pub id: u32,
    /// Compute slices (the `3` of `3g.40gb`).
    pub slices: u32,
    /// How many instances of it the GPU can hold.
    pub instance_count: u32,
    pub memory_mib: u64,
    pub sms: u32,
    /// Its engines: copy engines, NVDEC, NVENC, NVJPG, OFA.
    pub engines: Engines,
    /// `3g.40gb` (the driver's name less its `MIG ` prefix).
    pub name: String,
}

/// The engines of a GPU instance profile, as `nvmlGpuInstanceProfileInfo_v2_t` gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Engines {
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

/// A compute instance profile of a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiProfile {
    pub index: u32,
    pub id: u32,
    pub slices: u32,
}

/// A GPU instance handle, valid while its [`Mig`] is and the instance lives.
#[derive(Clone, Copy)]
pub struct GpuInstance<'a> {
    handle: NvmlGpuInstance,
    _mig: PhantomData<&'a Mig<'a>>,
}

/// A compute instance handle.
#[derive(Clone, Copy)]
pub struct ComputeInstance<'a> {
    handle: NvmlComputeInstance,
    _mig: PhantomData<&'a Mig<'a>>,
}

/// `nvmlGpuInstanceInfo_t` less its handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiInfo {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
}

/// `nvmlComputeInstanceInfo_t` less its handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiInfo {
    pub id: u32,
    pub profile_id: u32,
}

/// The MIG calls of `libnvidia-ml.so.1`, beside an initialised [`Nvml`].
pub struct Mig<'a> {
    nvml: &'a Nvml,
    _library: Library,
    get_mig_mode: proto::nvmlDeviceGetMigMode,
    max_mig_device_count: proto::nvmlDeviceGetMaxMigDeviceCount,
    mig_device_handle_by_index: proto::nvmlDeviceGetMigDeviceHandleByIndex,
    gpu_instance_id: proto::nvmlDeviceGetGpuInstanceId,
    compute_instance_id: proto::nvmlDeviceGetComputeInstanceId,
    gi_profile_info: proto::nvmlDeviceGetGpuInstanceProfileInfoV,
    gi_placements: proto::nvmlDeviceGetGpuInstancePossiblePlacements_v2,
    gi_capacity: proto::nvmlDeviceGetGpuInstanceRemainingCapacity,
    create_gi: proto::nvmlDeviceCreateGpuInstanceWithPlacement,
    gpu_instances: proto::nvmlDeviceGetGpuInstances,
    gi_by_id: proto::nvmlDeviceGetGpuInstanceById,
    gi_info: proto::nvmlGpuInstanceGetInfo,
    destroy_gi: proto::nvmlGpuInstanceDestroy,
    ci_profile_info: proto::nvmlGpuInstanceGetComputeInstanceProfileInfo,
    create_ci: proto::nvmlGpuInstanceCreateComputeInstance,
    compute_instances: proto::nvmlGpuInstanceGetComputeInstances,
    ci_info: proto::nvmlComputeInstanceGetInfo_v2,
    destroy_ci: proto::nvmlComputeInstanceDestroy,
}

impl<'a> Mig<'a> {
    /// The MIG calls beside `nvml` (initialised); `None` when the library lacks one of them
    /// (a driver older than R470).
    pub fn open(nvml: &'a Nvml) -> Option<Mig<'a>> {
        let library = dlopen(c"libnvidia-ml.so.1").ok()?;
        Some(Mig {
            nvml,
            get_mig_mode: lookup!(library, nvmlDeviceGetMigMode)?,
            max_mig_device_count: lookup!(library, nvmlDeviceGetMaxMigDeviceCount)?,
            mig_device_handle_by_index: lookup!(library, nvmlDeviceGetMigDeviceHandleByIndex)?,
            gpu_instance_id: lookup!(library, nvmlDeviceGetGpuInstanceId)?,
            compute_instance_id: lookup!(library, nvmlDeviceGetComputeInstanceId)?,
            gi_profile_info: lookup!(library, nvmlDeviceGetGpuInstanceProfileInfoV)?,
            gi_placements: lookup!(library, nvmlDeviceGetGpuInstancePossiblePlacements_v2)?,
            gi_capacity: lookup!(library, nvmlDeviceGetGpuInstanceRemainingCapacity)?,
            create_gi: lookup!(library, nvmlDeviceCreateGpuInstanceWithPlacement)?,
            gpu_instances: lookup!(library, nvmlDeviceGetGpuInstances)?,
            gi_by_id: lookup!(library, nvmlDeviceGetGpuInstanceById)?,
            gi_info: lookup!(library, nvmlGpuInstanceGetInfo)?,
            destroy_gi: lookup!(library, nvmlGpuInstanceDestroy)?,
            ci_profile_info: lookup!(library, nvmlGpuInstanceGetComputeInstanceProfileInfo)?,
            create_ci: lookup!(library, nvmlGpuInstanceCreateComputeInstance)?,
            compute_instances: lookup!(library, nvmlGpuInstanceGetComputeInstances)?,
            ci_info: lookup!(library, nvmlComputeInstanceGetInfo_v2)?,
            destroy_ci: lookup!(library, nvmlComputeInstanceDestroy)?,
            _library: library,
        })
    }

    /// `nvmlDeviceGetMigMode(nvmlDevice_t, unsigned *current, unsigned *pending)`.
    pub fn mode(&self, device: Device<'_>) -> Result<(u32, u32), NvmlReturn> {
        let (mut current, mut pending) = (0, 0);
        // SAFETY: models nvmlDeviceGetMigMode with a handle NVML gave and two live locals.
        nvml(unsafe { (self.get_mig_mode)(device.raw(), &mut current, &mut pending) })?;
        Ok((current, pending))
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t, unsigned profile,
    /// nvmlGpuInstanceProfileInfo_v2_t *)` for profile index `index`.
    pub fn gi_profile(&self, device: Device<'_>, index: u32) -> Result<GiProfile, NvmlReturn> {
        // SAFETY: nvmlGpuInstanceProfileInfo_v2_t is integers and a char array: all zeroes
        // is a valid value.
        let mut info: NvmlGpuInstanceProfileInfoV2 = unsafe { std::mem::zeroed() };
        info.version = NVML_GPU_INSTANCE_PROFILE_INFO_V2;
        // SAFETY: models nvmlDeviceGetGpuInstanceProfileInfoV with a handle NVML gave and a
        // live v2 struct whose version field says so.
        nvml(unsafe { (self.gi_profile_info)(device.raw(), index, &mut info) })?;
        let name = text(&info.name);
        let name = name.strip_prefix("MIG ").unwrap_or(&name).to_string();
        Ok(GiProfile {
            index,
            id: info.id,
            slices: info.slice_count,
            instance_count: info.instance_count,
            memory_mib: info.memory_size_mb,
            sms: info.multiprocessor_count,
            engines: Engines {
                copy_engines: info.copy_engine_count,
                decoders: info.decoder_count,
                encoders: info.encoder_count,
                jpegs: info.jpeg_count,
                ofas: info.ofa_count,
            },
            name,
        })
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement of the profile,
    /// taken or not (the count first, then the list).
    pub fn gi_placements(&self, device: Device<'_>, profile_id: u32) -> Result<Vec<Placement>, NvmlReturn> {
        let mut count = 0;
        // SAFETY: models the call with a NULL list, which asks for the count into a live local.
        nvml(unsafe { (self.gi_placements)(device.raw(), profile_id, std::ptr::null_mut(), &mut count) })?;
        let mut list = vec![Placement::default(); count as usize];
        // SAFETY: the list holds `count` entries, as the call was told.
        nvml(unsafe { (self.gi_placements)(device.raw(), profile_id, list.as_mut_ptr(), &mut count) })?;
        list.truncate(count as usize);
        Ok(list)
    }

    /// `nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t, unsigned profileId, unsigned *)`.
    pub fn gi_capacity(&self, device: Device<'_>, profile_id: u32) -> Result<u32, NvmlReturn> {
        let mut count = 0;
        // SAFETY: models the call with a handle NVML gave and a live local.
        nvml(unsafe { (self.gi_capacity)(device.raw(), profile_id, &mut count) })?;
        Ok(count)
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`: atomic in the driver; a taken placement
    /// is `NVML_ERROR_INSUFFICIENT_RESOURCES`.
    pub fn create_gi(&self, device: Device<'_>, profile_id: u32, placement: Placement) -> Result<GpuInstance<'_>, NvmlReturn> {
        let mut handle: NvmlGpuInstance = std::ptr::null_mut();
        // SAFETY: models the call with a handle NVML gave, a live placement and a live local.
        nvml(unsafe { (self.create_gi)(device.raw(), profile_id, &placement, &mut handle) })?;
        Ok(GpuInstance { handle, _mig: PhantomData })
    }

    /// `nvmlDeviceGetGpuInstances(nvmlDevice_t, unsigned profileId, nvmlGpuInstance_t *, unsigned *)`.
    pub fn gpu_instances(&self, device: Device<'_>, profile_id: u32) -> Result<Vec<GpuInstance<'_>>, NvmlReturn> {
        let mut list: Vec<NvmlGpuInstance> = vec![std::ptr::null_mut(); MAX_INSTANCES];
        let mut count = 0;
        // SAFETY: models the call with room for more instances than a profile can have
        // (nvml.h: the array must hold the profile's instanceCount).
        nvml(unsafe { (self.gpu_instances)(device.raw(), profile_id, list.as_mut_ptr(), &mut count) })?;
        Ok(list.into_iter().take((count as usize).min(MAX_INSTANCES)).map(|handle| GpuInstance { handle, _mig: PhantomData }).collect())
    }

    /// `nvmlDeviceGetGpuInstanceById(nvmlDevice_t, unsigned id, nvmlGpuInstance_t *)`.
    pub fn gi_by_id(&self, device: Device<'_>, id: u32) -> Result<GpuInstance<'_>, NvmlReturn> {
        let mut handle: NvmlGpuInstance = std::ptr::null_mut();
        // SAFETY: models the call with a handle NVML gave and a live local.
        nvml(unsafe { (self.gi_by_id)(device.raw(), id, &mut handle) })?;
        Ok(GpuInstance { handle, _mig: PhantomData })
    }

    /// `nvmlGpuInstanceGetInfo(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t *)`.
    pub fn gi_info(&self, gi: GpuInstance<'_>) -> Result<GiInfo, NvmlReturn> {
        let mut info = NvmlGpuInstanceInfo { device: std::ptr::null_mut(), id: 0, profile_id: 0, placement: Placement::default() };
        // SAFETY: models the call with a GPU instance handle NVML gave and a live struct.
        nvml(unsafe { (self.gi_info)(gi.handle, &mut info) })?;
        Ok(GiInfo { id: info.id, profile_id: info.profile_id, placement: info.placement })
    }

    /// `nvmlGpuInstanceDestroy(nvmlGpuInstance_t)`: `NVML_ERROR_IN_USE` while compute
    /// instances or processes remain.
    pub fn destroy_gi(&self, gi: GpuInstance<'_>) -> Result<(), NvmlReturn> {
        // SAFETY: models the call with a GPU instance handle NVML gave.
        nvml(unsafe { (self.destroy_gi)(gi.handle) })
    }

    /// `nvmlGpuInstanceGetComputeInstanceProfileInfo` for profile index `index` and the
    /// shared engine profile.
    pub fn ci_profile(&self, gi: GpuInstance<'_>, index: u32) -> Result<CiProfile, NvmlReturn> {
        let mut info = NvmlComputeInstanceProfileInfo::default();
        // SAFETY: models the call with a GPU instance handle NVML gave and a live struct.
        nvml(unsafe { (self.ci_profile_info)(gi.handle, index, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) })?;
        Ok(CiProfile { index, id: info.id, slices: info.slice_count })
    }

    /// `nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t, unsigned profileId, nvmlComputeInstance_t *)`.
    pub fn create_ci(&self, gi: GpuInstance<'_>, profile_id: u32) -> Result<ComputeInstance<'_>, NvmlReturn> {
        let mut handle: NvmlComputeInstance = std::ptr::null_mut();
        // SAFETY: models the call with a GPU instance handle NVML gave and a live local.
        nvml(unsafe { (self.create_ci)(gi.handle, profile_id, &mut handle) })?;
        Ok(ComputeInstance { handle, _mig: PhantomData })
    }

    /// `nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t, unsigned profileId, nvmlComputeInstance_t *, unsigned *)`.
    pub fn compute_instances(&self, gi: GpuInstance<'_>, profile_id: u32) -> Result<Vec<ComputeInstance<'_>>, NvmlReturn> {
        let mut list: Vec<NvmlComputeInstance> = vec![std::ptr::null_mut(); MAX_INSTANCES];
        let mut count = 0;
        // SAFETY: models the call with room for more compute instances than a GPU instance
        // can hold (at most one per compute slice, 8).
        nvml(unsafe { (self.compute_instances)(gi.handle, profile_id, list.as_mut_ptr(), &mut count) })?;
        Ok(list.into_iter().take((count as usize).min(MAX_INSTANCES)).map(|handle| ComputeInstance { handle, _mig: PhantomData }).collect())
    }

    /// `nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t, nvmlComputeInstanceInfo_t *)`.
    pub fn ci_info(&self, ci: ComputeInstance<'_>) -> Result<CiInfo, NvmlReturn> {
        let mut info =
            NvmlComputeInstanceInfo { device: std::ptr::null_mut(), gpu_instance: std::ptr::null_mut(), id: 0, profile_id: 0, placement: Placement::default() };
        // SAFETY: models the call with a compute instance handle NVML gave and a live struct.
        nvml(unsafe { (self.ci_info)(ci.handle, &mut info) })?;
        Ok(CiInfo { id: info.id, profile_id: info.profile_id })
    }

    /// `nvmlComputeInstanceDestroy(nvmlComputeInstance_t)`: `NVML_ERROR_IN_USE` while
    /// processes use it.
    pub fn destroy_ci(&self, ci: ComputeInstance<'_>) -> Result<(), NvmlReturn> {
        // SAFETY: models the call with a compute instance handle NVML gave.
        nvml(unsafe { (self.destroy_ci)(ci.handle) })
    }

    /// The MIG devices of a GPU with their GPU and compute instance IDs:
    /// `nvmlDeviceGetMaxMigDeviceCount`, then `nvmlDeviceGetMigDeviceHandleByIndex` for each
    /// index (an index with no device is skipped), `nvmlDeviceGetGpuInstanceId` and
    /// `nvmlDeviceGetComputeInstanceId`.
    pub fn mig_devices(&self, device: Device<'_>) -> Result<Vec<(u32, u32, Device<'a>)>, NvmlReturn> {
        let mut max = 0;
        // SAFETY: models nvmlDeviceGetMaxMigDeviceCount with a handle NVML gave and a live local.
        nvml(unsafe { (self.max_mig_device_count)(device.raw(), &mut max) })?;
        let mut out = Vec::new();
        for index in 0..max.min(MAX_INSTANCES as u32) {
            let mut handle: NvmlDevice = std::ptr::null_mut();
            // SAFETY: models nvmlDeviceGetMigDeviceHandleByIndex with a live local.
            if nvml(unsafe { (self.mig_device_handle_by_index)(device.raw(), index, &mut handle) }).is_err() {
                continue;
            }
            let (mut gi, mut ci) = (0, 0);
            // SAFETY: models nvmlDeviceGetGpuInstanceId and nvmlDeviceGetComputeInstanceId
            // with the MIG device handle NVML just gave and live locals.
            let ids = unsafe { nvml((self.gpu_instance_id)(handle, &mut gi)).and_then(|()| nvml((self.compute_instance_id)(handle, &mut ci))) };
            if ids.is_ok() {
                out.push((gi, ci, Device::from_raw(handle, self.nvml)));
            }
        }
        Ok(out)
    }
}

/// A string NVML wrote into `buf`, up to its NUL.
fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
