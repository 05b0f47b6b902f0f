//! Creating and destroying instances: a GPU instance at the placement the rule chooses
//! (`placement.rs`) with its full-size compute instance, recorded (`record.rs`) before it
//! is handed out; destroyed only when the record names it and the driver still gives it the
//! recorded MIG UUID.
//!
//! Concurrent creators (any user, any number of `fgpu run --mig`) need no lock of fgpu's:
//! the driver's create is atomic, and a placement another took meanwhile answers
//! `NVML_ERROR_INSUFFICIENT_RESOURCES`, after which fgpu looks again and takes the next
//! best. A creation at a placement the caller names (`--placement`, the DRA plugin's
//! allocated partition) does not look elsewhere: a placement taken is [`MigError::Taken`].

use super::error::MigError;
use super::gpus::{self, Gpu};
use super::record::{Entry, Owner, Record};
use crate::driver::calls::Nvml;
use crate::driver::mig::{GpuInstance, Mig, Placement};
use fgpu_abi::nvml::{NVML_ERROR_INSUFFICIENT_RESOURCES, NVML_ERROR_IN_USE, NVML_ERROR_NO_PERMISSION};

/// Names the MIG config capability file instead of the driver's (tests).
pub const ENV_CAPABILITY: &str = "FGPU_MIG_CAPABILITY";
/// The driver's MIG config capability: read access to it lets a user create and destroy.
pub const CAPABILITY: &str = "/proc/driver/nvidia/capabilities/mig/config";

/// How many times a creation looks again after another took its placement.
const ATTEMPTS: usize = 16;

/// Compute instance profile indices asked (`NVML_COMPUTE_INSTANCE_PROFILE_*`).
const CI_PROFILE_INDICES: u32 = 12;

fn capability_path() -> String {
    std::env::var(ENV_CAPABILITY).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| CAPABILITY.to_string())
}

/// The one line that says what a caller without the right to configure MIG lacks.
pub fn no_permission_line() -> String {
    format!(
        "creating and destroying MIG instances needs root or the MIG config capability (read access to {}); uid {} has neither",
        capability_path(),
        fgpu_core::sys::geteuid()
    )
}

/// Root, or read access to the MIG config capability.
pub fn may_configure() -> Result<(), MigError> {
    if fgpu_core::sys::geteuid() == 0 || fgpu_core::sys::files::access(std::path::Path::new(&capability_path()), libc::R_OK).is_ok() {
        Ok(())
    } else {
        Err(MigError::NoPermission(no_permission_line()))
    }
}

/// The line for MIG off: fgpu never changes the mode.
pub fn mig_off_line(gpu: &Gpu) -> String {
    let pending = if gpu.mig.is_some_and(|m| m.pending) { " (enabling is pending a GPU reset)" } else { "" };
    format!("GPU {} ({}) is not in MIG mode{pending}; fgpu never changes the mode: `sudo nvidia-smi -i {} -mig 1` enables it", gpu.index, gpu.name, gpu.index)
}

/// NVML, its MIG calls, and the GPUs, for one operation.
pub struct Session {
    pub nvml: Nvml,
}

impl Session {
    pub fn open() -> Result<Session, MigError> {
        Ok(Session { nvml: gpus::open()? })
    }

    pub fn mig(&self) -> Result<Mig<'_>, MigError> {
        Mig::open(&self.nvml).ok_or_else(|| MigError::Driver("this driver's NVML has no MIG calls (R470 or later has them)".to_string()))
    }
}

/// What was created: the record's entry, and the GPU's minor number (its `/dev/nvidiaN`,
/// which numbers it in `/proc/driver/nvidia-caps/mig-minors`) when NVML gives it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Created {
    #[serde(flatten)]
    pub entry: Entry,
    pub gpu_minor: Option<u32>,
    pub memory_mib: u64,
}

/// Creates an instance of `profile` (on GPU `only`, an index or a UUID, if given) at the
/// rule's placement, or at the placement starting at memory slice `at` (which needs
/// `only`), with its full-size compute instance, and records it with `owner`.
pub fn create(profile: &str, only: Option<&str>, at: Option<u32>, owner: Option<Owner>) -> Result<Created, MigError> {
    may_configure()?;
    let record = Record::open()?;
    let session = Session::open()?;
    let mig = session.mig()?;
    for _ in 0..ATTEMPTS {
        let all = gpus::scan(&session.nvml, &mig)?;
        let gpus = eligible(&all, only)?;
        if !gpus.iter().any(|g| g.profile(profile).is_some()) {
            let names: Vec<&str> = gpus[0].profiles.iter().map(|p| p.name.as_str()).collect();
            return Err(MigError::Refused(format!("no GPU in MIG mode has a profile {profile:?}; GPU {} has {}", gpus[0].index, names.join(", "))));
        }
        let (gpu, id, placement) = match at {
            Some(start) => exact(&gpus[0], profile, start)?,
            None => {
                let layouts: Vec<_> = gpus.iter().map(|g| g.layout()).collect();
                let candidates = super::placement::candidates(&layouts, |i| gpus.iter().find(|g| g.index == i).and_then(|g| g.profile(profile)).map(|p| p.id));
                let Some(&(choice, id)) = candidates.first() else {
                    let room: Vec<String> = gpus.iter().map(|g| format!("GPU {}: {} instance(s)", g.index, g.instances.len())).collect();
                    return Err(MigError::Refused(format!(
                        "no room for a {profile} on any GPU in MIG mode ({}); `fgpu mig list` shows the free placements",
                        room.join(", ")
                    )));
                };
                let gpu = gpus.iter().find(|g| g.index == choice.gpu).expect("a candidate's GPU");
                (gpu, id, Placement { start: choice.placement.0, size: choice.placement.1 })
            }
        };
        let Some(Ok(device)) = session.nvml.device(gpu.index) else { return Err(MigError::Driver(format!("GPU {} is gone", gpu.index))) };
        let gi = match mig.create_gi(device, id, placement) {
            Ok(gi) => gi,
            Err(NVML_ERROR_INSUFFICIENT_RESOURCES) if at.is_some() => {
                let name = gpu.profiles.iter().find(|p| p.id == id).map_or(profile, |p| p.name.as_str());
                return Err(MigError::Taken {
                    gpu: gpu.index,
                    profile: name.to_string(),
                    start: placement.start,
                    by: " (by another creation meanwhile)".into(),
                });
            }
            Err(NVML_ERROR_INSUFFICIENT_RESOURCES) => {
                eprintln!("fgpu: GPU {} {}:{} was taken meanwhile by another creation; choosing again", gpu.index, placement.start, placement.size);
                continue;
            }
            Err(NVML_ERROR_NO_PERMISSION) => return Err(MigError::NoPermission(no_permission_line())),
            Err(rc) => {
                return Err(MigError::Driver(format!(
                    "creating a {profile} on GPU {} at {}:{} failed (NVML error {rc})",
                    gpu.index, placement.start, placement.size
                )))
            }
        };
        let made = finish(&session, &mig, gpu, gi, id, owner).and_then(|entry| {
            record.put(&entry).map(|()| entry.clone()).inspect_err(|_| {
                let _ = destroy_instance(&session, &mig, &entry);
            })
        });
        let memory_mib = gpu.profiles.iter().find(|p| p.id == id).map_or(0, |p| p.memory_mib);
        return made.map(|entry| Created { entry, gpu_minor: session.nvml.minor_number(device), memory_mib });
    }
    Err(MigError::Refused(format!("every placement for a {profile} was taken by others {ATTEMPTS} times in a row; try again")))
}

/// The placement of `profile` on `gpu` that starts at memory slice `start`: `Err` when the
/// profile has none there, or an instance holds one of its slices.
fn exact<'g>(gpu: &'g Gpu, profile: &str, start: u32) -> Result<(&'g Gpu, u32, Placement), MigError> {
    let p = gpu.profile(profile).ok_or_else(|| MigError::Refused(format!("GPU {} has no profile {profile:?}", gpu.index)))?;
    let Some(&(_, size)) = p.placements.iter().find(|(s, _)| *s == start) else {
        let all: Vec<String> = p.placements.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        return Err(MigError::Refused(format!(
            "{} on GPU {} has no placement starting at slice {start} (its placements: {})",
            p.name,
            gpu.index,
            all.join(" ")
        )));
    };
    if !gpu.layout().free(p.id).contains(&(start, size)) {
        let overlap = gpu.instances.iter().find(|i| i.placement.0 < start + size && start < i.placement.0 + i.placement.1);
        let by = match overlap {
            Some(i) => format!(" by instance {} ({} at {}:{})", i.gpu_instance, i.profile, i.placement.0, i.placement.1),
            None => format!(" (no more {} instances fit)", p.name),
        };
        return Err(MigError::Taken { gpu: gpu.index, profile: p.name.clone(), start, by });
    }
    Ok((gpu, p.id, Placement { start, size }))
}

/// The GPUs a creation may use: `only` (an index or a UUID), or every GPU in MIG mode;
/// `Err` with the MIG-off line when there is none.
fn eligible(all: &[Gpu], only: Option<&str>) -> Result<Vec<Gpu>, MigError> {
    if let Some(wanted) = only {
        let gpu = all
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(wanted) || wanted.parse::<u32>() == Ok(g.index))
            .ok_or_else(|| MigError::Refused(format!("there is no GPU {wanted} ({} GPU(s) here)", all.len())))?;
        if gpu.mig.is_none() {
            return Err(MigError::Refused(format!("GPU {wanted} ({}) has no MIG", gpu.name)));
        }
        if !gpu.mig_on() {
            return Err(MigError::Refused(mig_off_line(gpu)));
        }
        return Ok(vec![gpu.clone()]);
    }
    let on: Vec<Gpu> = all.iter().filter(|g| g.mig_on()).cloned().collect();
    if on.is_empty() {
        return Err(MigError::Refused(match all.iter().find(|g| g.mig.is_some()) {
            Some(gpu) => format!("no GPU is in MIG mode: {}", mig_off_line(gpu)),
            None => "no GPU here supports MIG".to_string(),
        }));
    }
    Ok(on)
}

/// The compute instance and the record's entry for a new GPU instance; on failure the GPU
/// instance is destroyed again.
fn finish(session: &Session, mig: &Mig<'_>, gpu: &Gpu, gi: GpuInstance<'_>, id: u32, owner: Option<Owner>) -> Result<Entry, MigError> {
    let undo = |why: String| {
        let _ = mig.destroy_gi(gi);
        MigError::Driver(why)
    };
    let info = mig.gi_info(gi).map_err(|rc| undo(format!("nvmlGpuInstanceGetInfo failed (NVML error {rc})")))?;
    let profile = gpu.profiles.iter().find(|p| p.id == id).expect("the profile created");
    // The full-size compute instance: the profile with as many slices as the GPU instance.
    let full = (0..CI_PROFILE_INDICES).filter_map(|i| mig.ci_profile(gi, i).ok()).filter(|c| c.slices <= profile.slices).max_by_key(|c| c.slices);
    let full = full.ok_or_else(|| undo(format!("the {} instance offers no compute instance profile", profile.name)))?;
    let ci = mig.create_ci(gi, full.id).map_err(|rc| undo(format!("creating the compute instance of {} failed (NVML error {rc})", profile.name)))?;
    let ci_info = mig.ci_info(ci).map_err(|rc| {
        let _ = mig.destroy_ci(ci);
        undo(format!("nvmlComputeInstanceGetInfo_v2 failed (NVML error {rc})"))
    })?;
    let device = session.nvml.device(gpu.index).and_then(Result::ok).ok_or_else(|| undo(format!("GPU {} is gone", gpu.index)))?;
    let uuid =
        mig.mig_devices(device).unwrap_or_default().into_iter().find(|(g, c, _)| *g == info.id && *c == ci_info.id).and_then(|(_, _, d)| session.nvml.uuid(d));
    let Some(mig_uuid) = uuid else {
        let _ = mig.destroy_ci(ci);
        return Err(undo(format!("the driver shows no MIG device for GPU {} instance {}/{}", gpu.index, info.id, ci_info.id)));
    };
    Ok(Entry {
        gpu_uuid: gpu.uuid.clone(),
        gpu_index: gpu.index,
        gpu_instance: info.id,
        compute_instance: ci_info.id,
        profile: profile.name.clone(),
        placement: (info.placement.start, info.placement.size),
        mig_uuid,
        owner,
        uid: fgpu_core::sys::geteuid(),
        created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    })
}

/// What became of an entry's instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destroyed {
    /// Destroyed now.
    Now,
    /// Already gone (or the driver gives its IDs another UUID: someone else's instance).
    Gone,
}

/// Destroys the instance `entry` records (its compute instances, then it), if the driver
/// still gives it the recorded MIG UUID; `Err` when processes use it or the driver refuses.
pub fn destroy_instance(session: &Session, mig: &Mig<'_>, entry: &Entry) -> Result<Destroyed, MigError> {
    let Some(Ok(device)) = session.nvml.device(entry.gpu_index) else { return Ok(Destroyed::Gone) };
    if session.nvml.uuid(device).as_deref() != Some(entry.gpu_uuid.as_str()) {
        return Ok(Destroyed::Gone);
    }
    let devices = mig.mig_devices(device).unwrap_or_default();
    let ours = devices
        .iter()
        .any(|(g, c, d)| *g == entry.gpu_instance && *c == entry.compute_instance && session.nvml.uuid(*d).as_deref() == Some(entry.mig_uuid.as_str()));
    if !ours {
        return Ok(Destroyed::Gone);
    }
    let pids: Vec<u32> = devices
        .iter()
        .filter(|(g, _, _)| *g == entry.gpu_instance)
        .flat_map(|(_, _, d)| crate::driver::lists::device_pids(&session.nvml, *d).unwrap_or_default())
        .collect();
    if !pids.is_empty() {
        return Err(MigError::InUse { uuid: entry.mig_uuid.clone(), pids });
    }
    let in_use = || MigError::InUse { uuid: entry.mig_uuid.clone(), pids: Vec::new() };
    let gi = mig
        .gi_by_id(device, entry.gpu_instance)
        .map_err(|rc| MigError::Driver(format!("GPU {} instance {}: NVML error {rc}", entry.gpu_index, entry.gpu_instance)))?;
    for index in 0..CI_PROFILE_INDICES {
        let Ok(profile) = mig.ci_profile(gi, index) else { continue };
        for ci in mig.compute_instances(gi, profile.id).unwrap_or_default() {
            match mig.destroy_ci(ci) {
                Ok(()) => {}
                Err(NVML_ERROR_IN_USE) => return Err(in_use()),
                Err(NVML_ERROR_NO_PERMISSION) => return Err(MigError::NoPermission(no_permission_line())),
                Err(rc) => return Err(MigError::Driver(format!("destroying a compute instance of {} failed (NVML error {rc})", entry.mig_uuid))),
            }
        }
    }
    match mig.destroy_gi(gi) {
        Ok(()) => Ok(Destroyed::Now),
        Err(NVML_ERROR_IN_USE) => Err(in_use()),
        Err(NVML_ERROR_NO_PERMISSION) => Err(MigError::NoPermission(no_permission_line())),
        Err(rc) => Err(MigError::Driver(format!("destroying GPU {} instance {} failed (NVML error {rc})", entry.gpu_index, entry.gpu_instance))),
    }
}

/// Destroys the instances of the record whose job is gone and that no process uses, and
/// drops the entries of instances already gone. Returns one line per entry acted on.
pub fn gc() -> Result<Vec<String>, MigError> {
    let record = Record::open()?;
    let entries = record.entries();
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    may_configure()?;
    let session = Session::open()?;
    let mig = session.mig()?;
    let mut lines = Vec::new();
    for entry in entries.iter().filter(|e| e.orphaned()) {
        let job = entry.owner.map(|o| o.pid).unwrap_or(0);
        match destroy_instance(&session, &mig, entry) {
            Ok(Destroyed::Now) => {
                record.remove(entry);
                lines.push(format!(
                    "destroyed {} ({} on GPU {}, instance {}): its job (fgpu run PID {job}) is gone",
                    entry.mig_uuid, entry.profile, entry.gpu_index, entry.gpu_instance
                ));
            }
            Ok(Destroyed::Gone) => {
                record.remove(entry);
                lines.push(format!("forgot {} ({} on GPU {}): no longer there", entry.mig_uuid, entry.profile, entry.gpu_index));
            }
            Err(e) => lines.push(format!("kept {}: {e}", entry.mig_uuid)),
        }
    }
    Ok(lines)
}

/// An instance made for one `fgpu run --mig`: destroyed when dropped, or kept (its entry
/// then has no owner, and `fgpu mig destroy` removes it).
pub struct Carved {
    pub entry: Entry,
    pub keep: bool,
}

impl Carved {
    /// Destroys orphaned instances of the record first (quietly unless something is kept),
    /// then creates one of `profile` owned by this process.
    pub fn new(profile: &str, keep: bool) -> Result<Carved, MigError> {
        may_configure()?;
        for line in gc().unwrap_or_default() {
            eprintln!("fgpu run: {line}");
        }
        let pid = std::process::id();
        let start = super::record::start_time(pid).ok_or_else(|| MigError::Driver("cannot read this process's start time".into()))?;
        let created = create(profile, None, None, Some(Owner { pid, start }))?;
        Ok(Carved { entry: created.entry, keep })
    }
}

impl Drop for Carved {
    fn drop(&mut self) {
        let Ok(record) = Record::open() else { return };
        if self.keep {
            let kept = Entry { owner: None, ..self.entry.clone() };
            if let Err(e) = record.put(&kept) {
                eprintln!("fgpu run: {e}");
            } else {
                eprintln!("fgpu run: kept {} ({} on GPU {}); `fgpu mig destroy {}` removes it", kept.mig_uuid, kept.profile, kept.gpu_index, kept.mig_uuid);
            }
            return;
        }
        let outcome = Session::open().and_then(|s| {
            let mig = s.mig()?;
            destroy_instance(&s, &mig, &self.entry)
        });
        match outcome {
            Ok(_) => record.remove(&self.entry),
            Err(e) => eprintln!("fgpu run: {e}; left for `fgpu mig gc`"),
        }
    }
}
