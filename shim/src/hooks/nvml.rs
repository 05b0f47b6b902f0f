//! NVML as the container should see it: `nvidia-smi`, pynvml, gpustat, nvitop and the
//! frameworks' NVML use all read memory and processes from here.
//!
//! * Memory info: total = the cap, used = what the ledger's processes hold (contexts
//!   included), free = the rest. `_v2`'s
//!   `reserved` is 0: the driver's reservation belongs to the card, not the container, so
//!   total = used + free holds in both layouts.
//! * Compute process lists are built from the ledger: only this container's processes, with
//!   PIDs as the caller's PID namespace sees them and the memory the ledger counts. Graphics
//!   and MPS lists, utilisation samples and accounting data are filtered to the ledger's
//!   processes whose host PID is known; everything else is hidden.

use crate::abi::nvml::*;
use crate::real::Sym;
use crate::state::{self, Active, Mode};
use fgpu_core::ledger::{DeviceId, Snapshot};
use fgpu_core::uuid::{format_gpu_uuid, parse_gpu_uuid};
use std::ffi::{c_char, c_uint};

/// Calls into the real NVML that fgpu itself needs (context measurement, UUIDs).
// NVML device handles are opaque tokens handed back to NVML, never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub mod query {
    use super::*;
    use crate::state::Dev;
    use std::sync::OnceLock;

    pub fn ready() -> bool {
        static READY: OnceLock<bool> = OnceLock::new();
        *READY.get_or_init(|| {
            crate::real::library_present(crate::real::Lib::Nvml)
                && crate::call_real!(nvmlInit_v2: fn() -> NvmlReturn) == Some(NVML_SUCCESS)
        })
    }

    pub fn handle_for(uuid: &[u8; 16]) -> Option<NvmlDevice> {
        if !ready() {
            return None;
        }
        let text = format!("{}\0", format_gpu_uuid(uuid));
        let mut handle: NvmlDevice = std::ptr::null_mut();
        let rc = crate::call_real!(nvmlDeviceGetHandleByUUID: fn(*const c_char, *mut NvmlDevice) -> NvmlReturn, text.as_ptr().cast(), &mut handle)?;
        (rc == NVML_SUCCESS).then_some(handle)
    }

    pub fn device_uuid(device: NvmlDevice) -> Option<[u8; 16]> {
        let mut buf = [0u8; 96];
        let rc = crate::call_real!(nvmlDeviceGetUUID: fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn, device, buf.as_mut_ptr().cast(), buf.len() as c_uint)?;
        if rc != NVML_SUCCESS {
            return None;
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        parse_gpu_uuid(std::str::from_utf8(&buf[..end]).ok()?)
    }

    pub fn device_memory(device: NvmlDevice) -> Option<NvmlMemory> {
        let mut memory = NvmlMemory::default();
        let rc = crate::call_real!(nvmlDeviceGetMemoryInfo: fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn, device, &mut memory)?;
        (rc == NVML_SUCCESS).then_some(memory)
    }

    /// The real compute-process list (v3 layout, falling back to v2 and v1).
    pub fn compute_processes(device: NvmlDevice) -> Option<Vec<NvmlProcessInfoV2>> {
        for sym in [Sym::nvmlDeviceGetComputeRunningProcesses_v3, Sym::nvmlDeviceGetComputeRunningProcesses_v2] {
            if crate::real::get(sym).is_null() {
                continue;
            }
            let mut entries = vec![NvmlProcessInfoV2::default(); 256];
            let mut count = entries.len() as c_uint;
            let rc = if sym == Sym::nvmlDeviceGetComputeRunningProcesses_v3 {
                crate::call_real!(nvmlDeviceGetComputeRunningProcesses_v3: fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV2) -> NvmlReturn, device, &mut count, entries.as_mut_ptr())?
            } else {
                crate::call_real!(nvmlDeviceGetComputeRunningProcesses_v2: fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV2) -> NvmlReturn, device, &mut count, entries.as_mut_ptr())?
            };
            if rc == NVML_SUCCESS {
                entries.truncate(count as usize);
                return Some(entries);
            }
        }
        let mut entries = vec![NvmlProcessInfoV1::default(); 256];
        let mut count = entries.len() as c_uint;
        let rc = crate::call_real!(nvmlDeviceGetComputeRunningProcesses: fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV1) -> NvmlReturn, device, &mut count, entries.as_mut_ptr())?;
        (rc == NVML_SUCCESS).then(|| {
            entries[..count as usize]
                .iter()
                .map(|e| NvmlProcessInfoV2 { pid: e.pid, used_gpu_memory: e.used_gpu_memory, gpu_instance_id: NVML_NO_INSTANCE, compute_instance_id: NVML_NO_INSTANCE })
                .collect()
        })
    }

    /// Device-wide used memory before a context is created, when this process's host PID
    /// is unknown (otherwise the per-process figure is used and this is not needed).
    pub fn before_context(dev: &Dev) -> Option<u64> {
        if own_host_pid().is_some() {
            return None;
        }
        device_memory(handle_for(&dev.uuid)?).map(|m| m.used)
    }

    pub fn own_host_pid() -> Option<u32> {
        match state::mode() {
            Mode::On(active) => *active.host_pid.get_or_init(fgpu_core::pidns::host_pid),
            _ => None,
        }
    }

    /// The size of the context just created on `dev`, while `reserved` bytes for it are
    /// already in this process's slot.
    pub fn context_size(active: &Active, dev: &Dev, reserved: u64, before: Option<u64>) -> Option<u64> {
        let handle = handle_for(&dev.uuid)?;
        if let Some(pid) = own_host_pid() {
            let mine = compute_processes(handle)?.into_iter().find(|p| p.pid == pid)?.used_gpu_memory;
            let slot = active.slot_if_joined()?;
            let held_before = active.ledger.slot_used(slot, dev.id).saturating_sub(reserved);
            return Some(mine.saturating_sub(held_before));
        }
        let after = device_memory(handle)?.used;
        Some(after.saturating_sub(before?))
    }
}

/// The ledger's view of one NVML device: (ledger device, cap, used), or None to leave the
/// driver's answer alone (no cap configured for it).
fn container_view(active: &Active, device: NvmlDevice, real_total: u64) -> Option<(Option<DeviceId>, u64, u64)> {
    let uuid = query::device_uuid(device)?;
    let mut cap = active.config.cap_for(&format_gpu_uuid(&uuid), real_total)?;
    // Not the rate-limited scan: a process that has just exited must already be gone from
    // `used`, as it is from the process list (the driver frees its memory at exit).
    active.ledger.reclaim_dead(active.slot_if_joined());
    let id = active.ledger.find_device(uuid);
    let used = match id {
        Some(id) => {
            cap = cap.min(active.ledger.cap(id));
            active.ledger.used(id)
        }
        None => 0,
    };
    Some((id, cap, used))
}

/// How a memory answer from the driver is to be rewritten.
enum MemoryAnswer {
    /// No cap for this device, or no cap at all: the driver's answer stands.
    Keep,
    /// Failing closed: nothing is free.
    NothingFree,
    /// The container's view.
    Container { total: u64, free: u64, used: u64 },
}

fn memory_answer(device: NvmlDevice, real_total: u64) -> MemoryAnswer {
    match state::mode() {
        Mode::On(active) => match container_view(active, device, real_total) {
            Some((_, cap, used)) => MemoryAnswer::Container { total: cap, free: cap.saturating_sub(used), used },
            None => MemoryAnswer::Keep,
        },
        Mode::Closed(_) => MemoryAnswer::NothingFree,
        Mode::Off => MemoryAnswer::Keep,
    }
}

/// # Safety
/// `nvmlDeviceGetMemoryInfo` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    let rc = crate::call_real!(nvmlDeviceGetMemoryInfo: fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn, device, memory).unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: the driver just filled *memory, a caller-provided nvmlMemory_t.
    let m = unsafe { &mut *memory };
    super::guard(rc, || {
        match memory_answer(device, m.total) {
            MemoryAnswer::Keep => {}
            MemoryAnswer::NothingFree => m.free = 0,
            MemoryAnswer::Container { total, free, used } => *m = NvmlMemory { total, free, used },
        }
        rc
    })
}

/// # Safety
/// `nvmlDeviceGetMemoryInfo_v2` contract (`version` set by the caller).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn {
    let rc = crate::call_real!(nvmlDeviceGetMemoryInfo_v2: fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn, device, memory).unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: the driver just filled *memory, a caller-provided nvmlMemory_v2_t.
    let m = unsafe { &mut *memory };
    super::guard(rc, || {
        match memory_answer(device, m.total) {
            MemoryAnswer::Keep => {}
            MemoryAnswer::NothingFree => m.free = 0,
            MemoryAnswer::Container { total, free, used } => (m.total, m.reserved, m.free, m.used) = (total, 0, free, used),
        }
        rc
    })
}

/// A process as the container's process lists report it.
struct Listed {
    pid: u32,
    used: u64,
}

/// The ledger's live processes holding memory on `id`, with PIDs as the caller sees them.
fn ledger_processes(snapshot: &Snapshot, id: DeviceId) -> Vec<Listed> {
    snapshot
        .processes
        .iter()
        .filter(|p| p.alive && p.used.get(id.0).copied().unwrap_or(0) > 0)
        .filter_map(|p| Some(Listed { pid: p.pid_here.or(p.host_pid)?, used: p.used[id.0] }))
        .collect()
}

/// Host PID -> PID as the caller sees it, for the ledger's processes whose host PID is known.
fn host_pid_map(snapshot: &Snapshot) -> Vec<(u32, u32)> {
    snapshot.processes.iter().filter(|p| p.alive).filter_map(|p| Some((p.host_pid?, p.pid_here.or(p.host_pid)?))).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum ListKind {
    Compute,
    Other,
}

/// Writes `listed` into the caller's buffer with NVML's size-query rules.
///
/// # Safety
/// `count` writable; `infos` null or writable for `*count` entries of `T`.
unsafe fn write_list<T>(listed: &[Listed], count: *mut c_uint, infos: *mut T, make: impl Fn(&Listed) -> T) -> NvmlReturn {
    // SAFETY: checked non-null by the caller.
    let capacity = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = listed.len() as c_uint };
    if listed.is_empty() {
        return NVML_SUCCESS;
    }
    if infos.is_null() || capacity < listed.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, entry) in listed.iter().enumerate() {
        // SAFETY: i < listed.len() <= capacity, the caller's buffer size.
        unsafe { infos.add(i).write(make(entry)) };
    }
    NVML_SUCCESS
}

/// Shared body of the nine process-list entry points.
///
/// # Safety
/// NVML process-list contract for the layout `T`.
unsafe fn process_list<T>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    kind: ListKind,
    real: impl Fn(*mut c_uint, *mut T) -> NvmlReturn,
    pid_and_memory: impl Fn(&T) -> (u32, u64),
    make: impl Fn(&Listed) -> T,
) -> NvmlReturn {
    let active = match state::mode() {
        Mode::On(active) => active,
        Mode::Off => return real(count, infos),
        // Fail closed: a broken configuration shows no other tenant's processes either.
        Mode::Closed(_) if count.is_null() => return NVML_ERROR_INVALID_ARGUMENT,
        // SAFETY: count checked non-null; infos per the caller's contract.
        Mode::Closed(_) => return unsafe { write_list(&[], count, infos, &make) },
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let uuid = query::device_uuid(device);
    let id = uuid.and_then(|u| active.ledger.find_device(u));
    active.ledger.reclaim_dead(active.slot_if_joined());
    let snapshot = active.ledger.snapshot(active.slot_if_joined());
    let listed = match (kind, id) {
        (ListKind::Compute, Some(id)) => {
            // Ask the driver first so invalid handles still get its error.
            let mut probe: c_uint = 0;
            let rc = real(&mut probe, std::ptr::null_mut());
            if rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE {
                return rc;
            }
            ledger_processes(&snapshot, id)
        }
        (ListKind::Compute, None) => Vec::new(),
        (ListKind::Other, _) => {
            let mut entries: Vec<T> = Vec::with_capacity(256);
            let mut n: c_uint = 256;
            let rc = real(&mut n, entries.as_mut_ptr());
            if rc != NVML_SUCCESS {
                if rc == NVML_ERROR_INSUFFICIENT_SIZE {
                    // More graphics processes than we asked for: list ours only if we can
                    // see them all; an empty answer leaks nothing.
                    Vec::new()
                } else {
                    return rc;
                }
            } else {
                // SAFETY: the driver initialised the first n entries.
                unsafe { entries.set_len(n as usize) };
                let map = host_pid_map(&snapshot);
                entries
                    .iter()
                    .map(&pid_and_memory)
                    .filter_map(|(pid, used)| map.iter().find(|(host, _)| *host == pid).map(|(_, here)| Listed { pid: *here, used }))
                    .collect()
            }
        }
    };
    // SAFETY: count checked non-null; infos per the caller's contract.
    unsafe { write_list(&listed, count, infos, make) }
}

fn v1(l: &Listed) -> NvmlProcessInfoV1 {
    NvmlProcessInfoV1 { pid: l.pid, used_gpu_memory: l.used }
}

fn v2(l: &Listed) -> NvmlProcessInfoV2 {
    NvmlProcessInfoV2 { pid: l.pid, used_gpu_memory: l.used, gpu_instance_id: NVML_NO_INSTANCE, compute_instance_id: NVML_NO_INSTANCE }
}

/// Drivers 535.43 to 535.86 wrote 32-byte `nvmlProcessInfo_t` entries for the `_v3` calls
/// (with `usedGpuCcProtectedMemory`); every other driver writes 24 bytes. Answer in the
/// layout the driver in this process uses, as its callers (nvitop checks the version) expect.
fn v3_entries_are_wide() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        let mut buf = [0u8; 96];
        let rc = crate::call_real!(nvmlSystemGetDriverVersion: fn(*mut c_char, c_uint) -> NvmlReturn, buf.as_mut_ptr().cast(), buf.len() as c_uint);
        if rc != Some(NVML_SUCCESS) {
            return false;
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        wide_v3_driver(std::str::from_utf8(&buf[..end]).unwrap_or(""))
    })
}

fn wide_v3_driver(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    major == 535 && (43..=86).contains(&minor)
}

fn v3_wide(l: &Listed) -> NvmlProcessInfoV3Cc {
    NvmlProcessInfoV3Cc { pid: l.pid, used_gpu_memory: l.used, gpu_instance_id: NVML_NO_INSTANCE, compute_instance_id: NVML_NO_INSTANCE, used_cc_protected_memory: 0 }
}

macro_rules! process_list_hook {
    ($name:ident, $ty:ty, $kind:expr, $make:expr) => {
        /// # Safety
        /// NVML process-list contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: NvmlDevice, count: *mut c_uint, infos: *mut $ty) -> NvmlReturn {
            let real = |c, i| crate::call_real!($name: fn(NvmlDevice, *mut c_uint, *mut $ty) -> NvmlReturn, device, c, i);
            // SAFETY: forwarded caller pointers per the NVML contract.
            unsafe { list_in_layout::<$ty>(device, count, infos, $kind, real, $make) }
        }
    };
    ($name:ident, v3, $kind:expr) => {
        /// # Safety
        /// NVML process-list contract (`_v3`: 24- or 32-byte entries, by driver).
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn {
            if v3_entries_are_wide() {
                let real = |c, i| crate::call_real!($name: fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV3Cc) -> NvmlReturn, device, c, i);
                // SAFETY: on these drivers the caller's buffer holds 32-byte entries.
                unsafe { list_in_layout(device, count, infos.cast::<NvmlProcessInfoV3Cc>(), $kind, real, v3_wide) }
            } else {
                let real = |c, i| crate::call_real!($name: fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV2) -> NvmlReturn, device, c, i);
                // SAFETY: forwarded caller pointers per the NVML contract.
                unsafe { list_in_layout(device, count, infos, $kind, real, v2) }
            }
        }
    };
}

/// A process list in entry layout `T`, with the panic guard.
///
/// # Safety
/// NVML process-list contract for `T`.
unsafe fn list_in_layout<T: ProcessEntry>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    kind: ListKind,
    real: impl Fn(*mut c_uint, *mut T) -> Option<NvmlReturn>,
    make: impl Fn(&Listed) -> T,
) -> NvmlReturn {
    let real = |c: *mut c_uint, i: *mut T| real(c, i).unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    super::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { process_list(device, count, infos, kind, real, |e: &T| e.pid_and_memory(), make) }
    })
}

/// The two fields every process-entry layout starts with.
trait ProcessEntry {
    fn pid_and_memory(&self) -> (u32, u64);
}

impl ProcessEntry for NvmlProcessInfoV1 {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

impl ProcessEntry for NvmlProcessInfoV2 {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

impl ProcessEntry for NvmlProcessInfoV3Cc {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

process_list_hook!(nvmlDeviceGetComputeRunningProcesses, NvmlProcessInfoV1, ListKind::Compute, v1);
process_list_hook!(nvmlDeviceGetComputeRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Compute, v2);
process_list_hook!(nvmlDeviceGetComputeRunningProcesses_v3, v3, ListKind::Compute);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses, NvmlProcessInfoV1, ListKind::Other, v1);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Other, v2);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses_v3, v3, ListKind::Other);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses, NvmlProcessInfoV1, ListKind::Other, v1);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Other, v2);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses_v3, v3, ListKind::Other);

#[cfg(test)]
mod tests {
    #[test]
    fn only_early_535_drivers_use_wide_v3_entries() {
        assert!(super::wide_v3_driver("535.54.03"));
        assert!(super::wide_v3_driver("535.43.02"));
        assert!(!super::wide_v3_driver("535.104.05"));
        assert!(!super::wide_v3_driver("570.26"));
        assert!(!super::wide_v3_driver("530.30.02"));
    }
}

/// The driver's whole list, read into our own buffer: a size query, then the call, again
/// while the list grows. The caller's buffer is sized for the container's entries only, so
/// the driver never writes into it directly.
fn fetch_all<T: Copy + Default>(real: impl Fn(*mut T, *mut c_uint) -> NvmlReturn) -> Result<Vec<T>, NvmlReturn> {
    let mut n: c_uint = 0;
    let rc = real(std::ptr::null_mut(), &mut n);
    if rc == NVML_SUCCESS {
        return Ok(Vec::new());
    }
    for _ in 0..4 {
        if rc != NVML_ERROR_INSUFFICIENT_SIZE && rc != NVML_SUCCESS {
            return Err(rc);
        }
        let mut entries = vec![T::default(); n as usize * 2 + 8];
        let mut got = entries.len() as c_uint;
        match real(entries.as_mut_ptr(), &mut got) {
            NVML_SUCCESS => {
                entries.truncate((got as usize).min(entries.len()));
                return Ok(entries);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => n = got,
            other => return Err(other),
        }
    }
    Err(NVML_ERROR_INSUFFICIENT_SIZE)
}

/// Keeps only samples of the ledger's processes, with PIDs as the caller sees them. The
/// size query answers the container's count, not the card's.
///
/// # Safety
/// `nvmlDeviceGetProcessUtilization` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    samples: *mut NvmlProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: u64,
) -> NvmlReturn {
    let real = |s: *mut NvmlProcessUtilizationSample, c: *mut c_uint| {
        crate::call_real!(
            nvmlDeviceGetProcessUtilization: fn(NvmlDevice, *mut NvmlProcessUtilizationSample, *mut c_uint, u64) -> NvmlReturn,
            device, s, c, last_seen
        )
        .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        let Mode::On(active) = state::mode() else { return real(samples, count) };
        if count.is_null() {
            return real(samples, count);
        }
        let all = match fetch_all(real) {
            Ok(all) => all,
            Err(rc) => {
                if rc == NVML_ERROR_NOT_FOUND {
                    // SAFETY: count is non-null.
                    unsafe { *count = 0 };
                }
                return rc;
            }
        };
        let map = host_pid_map(&active.ledger.snapshot(active.slot_if_joined()));
        let kept: Vec<NvmlProcessUtilizationSample> = all
            .iter()
            .filter_map(|s| map.iter().find(|(host, _)| *host == s.pid).map(|(_, here)| NvmlProcessUtilizationSample { pid: *here, ..*s }))
            .collect();
        if kept.is_empty() {
            // What the driver answers when it has no sample.
            // SAFETY: count is non-null.
            unsafe { *count = 0 };
            return NVML_ERROR_NOT_FOUND;
        }
        // SAFETY: count is non-null.
        let capacity = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = kept.len() as c_uint };
        if samples.is_null() || capacity < kept.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        // SAFETY: the caller's buffer holds `capacity` >= kept.len() samples.
        unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), samples, kept.len()) };
        NVML_SUCCESS
    })
}

/// The ledger's processes among the driver's accounting PIDs, as the caller sees them. The
/// size query answers the container's count, not the card's.
///
/// # Safety
/// `nvmlDeviceGetAccountingPids` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(device: NvmlDevice, count: *mut c_uint, pids: *mut c_uint) -> NvmlReturn {
    let real = |p: *mut c_uint, c: *mut c_uint| {
        crate::call_real!(nvmlDeviceGetAccountingPids: fn(NvmlDevice, *mut c_uint, *mut c_uint) -> NvmlReturn, device, c, p)
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        let Mode::On(active) = state::mode() else { return real(pids, count) };
        if count.is_null() {
            return real(pids, count);
        }
        let all = match fetch_all(real) {
            Ok(all) => all,
            Err(rc) => return rc,
        };
        let map = host_pid_map(&active.ledger.snapshot(active.slot_if_joined()));
        let kept: Vec<c_uint> = all.iter().filter_map(|pid| map.iter().find(|(host, _)| host == pid).map(|(_, here)| *here)).collect();
        // SAFETY: count is non-null.
        let capacity = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = kept.len() as c_uint };
        if kept.is_empty() {
            return NVML_SUCCESS;
        }
        if pids.is_null() || capacity < kept.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        // SAFETY: the caller's buffer holds `capacity` >= kept.len() PIDs.
        unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), pids, kept.len()) };
        NVML_SUCCESS
    })
}

/// Only the ledger's processes have accounting stats; the caller names them by its own PIDs.
///
/// # Safety
/// `nvmlDeviceGetAccountingStats` contract (`stats` is an opaque out-struct here).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(device: NvmlDevice, pid: c_uint, stats: *mut std::ffi::c_void) -> NvmlReturn {
    let real = |p: c_uint| {
        crate::call_real!(nvmlDeviceGetAccountingStats: fn(NvmlDevice, c_uint, *mut std::ffi::c_void) -> NvmlReturn, device, p, stats)
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        let Mode::On(active) = state::mode() else { return real(pid) };
        let map = host_pid_map(&active.ledger.snapshot(active.slot_if_joined()));
        match map.iter().find(|(_, here)| *here == pid) {
            Some((host, _)) => real(*host),
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}
