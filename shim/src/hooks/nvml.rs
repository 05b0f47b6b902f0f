//! NVML as the container should see it: `nvidia-smi`, pynvml, gpustat, nvitop and the
//! frameworks' NVML use all read memory and processes from here.
//!
//! * Memory info: total = the cap (the GPU's own memory when the cap is larger), used = what
//!   the ledger's processes hold (contexts included), free = the rest. `_v2`'s
//!   `reserved` is 0: the driver's reservation belongs to the card, not the container, so
//!   total = used + free holds in both layouts.
//! * Compute process lists (and compute mode of the r550 detail list) are built from the
//!   ledger: only this container's processes, with PIDs as the caller's PID namespace sees
//!   them and the memory the ledger counts, whatever PIDs the driver gives.
//! * Graphics and MPS lists, utilisation samples, accounting data and encoder /
//!   frame-buffer-capture sessions are the driver's, filtered to the ledger's processes and
//!   given with the PIDs the caller sees. What a driver PID stands for depends on the
//!   driver, which is found out, not assumed (`host_pid.rs`, `fgpu_core::nvmlpids`): host
//!   PIDs (older drivers, and any caller in the host's namespace) map through the ledger's
//!   host PIDs; caller-namespace PIDs (current drivers) are the ledger's PIDs as this
//!   namespace sees them, and in utilisation samples a process this namespace cannot see
//!   keeps its raw host PID. Accounting and session records carry the raw host PID on every
//!   driver (the driver stores `pClient->ProcID`). A driver PID that could stand for two of
//!   the ledger's processes stands for neither; while it is not known which PIDs the driver
//!   gives, nothing of the driver's lists is shown. With a broken configuration all of
//!   them are empty.

use crate::driver::raw;
use crate::abi::nvml::*;
use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use crate::state::{self, Active, Mode};
use fgpu_core::ledger::{DeviceId, SlotId, Snapshot};
use fgpu_core::nvmlpids::{Entry, Look, Member, NvmlPids, Own, Verdict};
use fgpu_core::uuid::{format_gpu_uuid, parse_gpu_uuid};
use fgpu_core::view::MemoryView;
use std::ffi::c_uint;

/// Calls into the real NVML that fgpu itself needs (context measurement, UUIDs).
// NVML device handles are opaque tokens handed back to NVML, never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub mod query {
    use super::*;
    use crate::state::Dev;

    pub fn handle_for(uuid: &[u8; 16]) -> Option<NvmlDevice> {
        driver().nvml_device_by_uuid(uuid)
    }

    pub fn device_uuid(device: NvmlDevice) -> Option<[u8; 16]> {
        parse_gpu_uuid(&driver().nvml_device_uuid(device)?)
    }

    pub fn device_memory(device: NvmlDevice) -> Option<NvmlMemory> {
        driver().nvml_memory(device)
    }

    /// The real compute-process list (v3 layout, falling back to v2 and v1).
    pub fn compute_processes(device: NvmlDevice) -> Option<Vec<NvmlProcessInfoV2>> {
        driver().nvml_compute_processes(device)
    }

    /// NVML's compute list for a device as [`Entry`]s (memory figures read as
    /// `fgpu_core::nvmlpids` reads them).
    pub fn compute_entries(device: NvmlDevice) -> Option<Vec<Entry>> {
        compute_processes(device).map(|list| list.into_iter().map(|p| Entry::new(p.pid, p.used_gpu_memory)).collect())
    }

    /// The ledger's other live processes on `dev`, for telling which PIDs NVML gives.
    fn members(snapshot: &Snapshot, own: Option<SlotId>, dev: DeviceId) -> Vec<Member> {
        snapshot
            .processes
            .iter()
            .filter(|p| p.alive && Some(p.slot) != own)
            .map(|p| Member { here: p.pid_here, host: p.host_pid, counted: p.used.get(dev.0).copied().unwrap_or(0) })
            .collect()
    }

    /// One look at `entries`, NVML's compute list for `dev`, to find out which PIDs NVML
    /// gives (`host_pid.rs`), while that is not known; a no-op in the host's namespace.
    /// `counted` is a lower bound on what this process holds on the device when it holds a
    /// context there (so the driver lists it), `None` otherwise.
    pub fn identify(active: &Active, dev: DeviceId, entries: &[Entry], counted: Option<u64>) -> Option<Verdict> {
        if fgpu_core::pidns::in_host_pidns() || !active.host_pid.needs_a_look() {
            return None;
        }
        let slot = active.slot_if_joined();
        let snapshot = active.ledger.snapshot(slot);
        let others = members(&snapshot, slot, dev);
        // The service's answer (asked when the process joined its ledger; a process without a
        // slot, such as nvidia-smi, asks nothing), or what a process of the host's namespace
        // filled in.
        let told = if slot.is_some() { active.own_host_pid() } else { active.host_pid.known() };
        let host = told.or_else(|| snapshot.processes.iter().find(|p| Some(p.slot) == slot).and_then(|p| p.host_pid));
        let own = counted.map(|counted| Own { here: std::process::id(), host, counted });
        Some(active.host_pid.observe(&Look { at_ns: fgpu_core::log::monotonic_ns(), own, others: &others, entries }, |pid| {
            if let Some(slot) = slot {
                active.ledger.set_host_pid(slot, pid);
            }
        }))
    }

    /// Whether this process holds a context on `ordinal` (so the driver lists it); `false`
    /// also while a retain or release holds the books (never waits for them: a context
    /// creation takes them around calls that come back here).
    pub fn has_context(active: &Active, ordinal: i32) -> bool {
        let primary = active.primary.try_lock().is_some_and(|p| p.contains_key(&ordinal));
        primary || active.contexts.try_lock().is_some_and(|c| c.values().any(|(o, _)| *o == ordinal))
    }

    /// Device-wide used memory before a context is created, when NVML's per-process figure
    /// for this process is not known to be usable (otherwise that figure is used).
    pub fn before_context(dev: &Dev) -> Option<u64> {
        if let Mode::On(active) = state::mode() {
            if active.host_pid.memory_pid().is_some() {
                return None;
            }
        }
        device_memory(handle_for(&dev.uuid)?).map(|m| m.used)
    }

    pub fn own_host_pid() -> Option<u32> {
        match state::mode() {
            Mode::On(active) => active.own_host_pid(),
            _ => None,
        }
    }

    /// The PID NVML's utilisation samples name this process by, once known (the compute
    /// sampler's). While it is not, a look at NVML's lists is taken now and then.
    /// Where the driver gives PIDs as this namespace sees them, a process of the ledger that
    /// this namespace cannot see keeps its raw host PID in the samples: if that equals this
    /// process's PID, the samples under it could be either's, and none is taken as this
    /// process's (its events measure it instead).
    pub fn sampled_pid() -> Option<u32> {
        let Mode::On(active) = state::mode() else { return None };
        if active.slot_if_joined().is_some() {
            let _ = active.own_host_pid();
        }
        if active.host_pid.needs_a_look() {
            crate::hooks::untracked::count_untracked(active);
        }
        let pid = active.host_pid.nvml_pid()?;
        if active.host_pid.behaviour().lists_in_caller_namespace() {
            let snapshot = active.ledger.snapshot(active.slot_if_joined());
            let own = active.slot_if_joined();
            if snapshot.processes.iter().any(|p| p.alive && Some(p.slot) != own && p.pid_here.is_none() && p.host_pid == Some(pid)) {
                return None;
            }
        }
        Some(pid)
    }

    /// The size of the context just created on `dev`, while `reserved` bytes for it are
    /// already in this process's slot: this process's own figure in NVML's list where it is
    /// known which entry that is and the entry has one, else the device's usage before
    /// (`before`) and after.
    pub fn context_size(active: &Active, dev: &Dev, reserved: u64, before: Option<u64>) -> Option<u64> {
        let handle = handle_for(&dev.uuid)?;
        let slot = active.slot_if_joined()?;
        let held_before = active.ledger.slot_used(slot, dev.id).saturating_sub(reserved);
        let entries = compute_entries(handle);
        if let Some(entries) = &entries {
            identify(active, dev.id, entries, Some(held_before));
            if let Some(pid) = active.host_pid.memory_pid() {
                if let Some(mine) = entries.iter().find(|e| e.pid == pid).and_then(|e| e.used) {
                    return Some(mine.saturating_sub(held_before));
                }
            }
        }
        let after = device_memory(handle)?.used;
        Some(after.saturating_sub(before?))
    }
}

/// The ledger's view of one NVML device: what the container is shown
/// (`fgpu_core::view`) and what its processes hold, or None to leave the driver's answer
/// alone (no cap configured for it).
fn container_view(active: &Active, device: NvmlDevice, real_total: u64) -> Option<(MemoryView, u64)> {
    let uuid = query::device_uuid(device)?;
    let own = active.config.cap_for(&format_gpu_uuid(&uuid), real_total)?;
    // Not the rate-limited scan: a process that has just exited must already be gone from
    // `used`, as it is from the process list (the driver frees its memory at exit).
    active.ledger.reclaim_dead(active.slot_if_joined());
    let id = active.ledger.find_device(uuid);
    let view = MemoryView::new(Some(own), id.map(|id| active.ledger.cap(id)), real_total);
    Some((view, id.map_or(0, |id| active.ledger.used(id))))
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
            Some((view, used)) => MemoryAnswer::Container { total: view.total, free: view.free(used, None), used },
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
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::nvmlDeviceGetMemoryInfo(device, memory) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
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
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::nvmlDeviceGetMemoryInfo_v2(device, memory) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
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

/// What the PIDs of a driver answer are.
#[derive(Clone, Copy, PartialEq)]
enum Keyed {
    /// Process lists (graphics, MPS): host PIDs, or the caller's, by the driver.
    Lists,
    /// Utilisation samples: as lists, except that in the caller modes a process the caller
    /// cannot see keeps its raw host PID (`kern_perf_ctrl.c` in NVIDIA's open modules).
    Samples,
    /// Accounting and encoder / frame-buffer-capture sessions: the raw host PID the driver
    /// recorded (`pClient->ProcID`), on every driver.
    Raw,
}

/// Driver PID -> PID as the caller sees it, for the ledger's live processes, by what NVML
/// gives here ([`NvmlPids`]). A driver PID that could stand for two of them stands for none:
/// nothing of one process is shown, or charged, as another's.
fn pid_map(active: &Active, device: NvmlDevice, snapshot: &Snapshot, keyed: Keyed) -> Vec<(u32, u32)> {
    let alive = || snapshot.processes.iter().filter(|p| p.alive);
    let by_host = || alive().filter_map(|p| Some((p.host_pid?, p.pid_here.or(p.host_pid)?, p.slot))).collect::<Vec<_>>();
    let mut map: Vec<(u32, u32, SlotId)> = if keyed == Keyed::Raw {
        by_host()
    } else {
        match settled_behaviour(active, device) {
            NvmlPids::HostNamespace | NvmlPids::Host => by_host(),
            NvmlPids::Absent if keyed == Keyed::Samples => by_host(),
            NvmlPids::Caller | NvmlPids::CallerNoMemory => {
                let mut map: Vec<(u32, u32, SlotId)> = alive().filter_map(|p| p.pid_here.map(|h| (h, h, p.slot))).collect();
                if keyed == Keyed::Samples {
                    map.extend(alive().filter(|p| p.pid_here.is_none()).filter_map(|p| p.host_pid.map(|h| (h, h, p.slot))));
                }
                map
            }
            // Lists name nobody (Absent), or it is not known yet how: nothing is shown.
            NvmlPids::Absent | NvmlPids::Unknown => Vec::new(),
        }
    };
    drop_ambiguous(&mut map);
    map.into_iter().map(|(driver, here, _)| (driver, here)).collect()
}

/// Leaves out every driver PID that stands for two different processes (slots) in `map`.
fn drop_ambiguous<T: PartialEq + Copy>(map: &mut Vec<(u32, u32, T)>) {
    let twice: Vec<u32> = map.iter().filter(|(k, _, a)| map.iter().any(|(k2, _, b)| k2 == k && b != a)).map(|(k, _, _)| *k).collect();
    map.retain(|(k, _, _)| !twice.contains(k));
}

/// Which PIDs NVML gives here, looked for now (at most every [`LOOK_EVERY_NS`]) while it is
/// not known: from this process's own entry if it holds a context on `device`, else from
/// the ledger's other processes.
fn settled_behaviour(active: &Active, device: NvmlDevice) -> NvmlPids {
    const LOOK_EVERY_NS: u64 = 200_000_000;
    static LAST_LOOK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let behaviour = active.host_pid.behaviour();
    if behaviour != NvmlPids::Unknown {
        return behaviour;
    }
    let now = fgpu_core::log::monotonic_ns();
    let last = LAST_LOOK.load(std::sync::atomic::Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < LOOK_EVERY_NS {
        return behaviour;
    }
    LAST_LOOK.store(now, std::sync::atomic::Ordering::Relaxed);
    let Some(id) = query::device_uuid(device).and_then(|u| active.ledger.find_device(u)) else { return behaviour };
    let Some(entries) = query::compute_entries(device) else { return behaviour };
    let own = active.slot_if_joined().filter(|_| active.settling.load(std::sync::atomic::Ordering::SeqCst) == 0).and_then(|slot| {
        let dev = active.registered_devices().find(|d| d.id == id)?;
        query::has_context(active, dev.ordinal).then(|| active.ledger.slot_used(slot, id))
    });
    query::identify(active, id, &entries, own);
    active.host_pid.behaviour()
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
                // A driver that answers with more entries than the buffer holds is not
                // believed past the buffer.
                let n = (n as usize).min(entries.capacity());
                // SAFETY: n is at most the capacity (bounded just above), and the driver
                // initialised the first n entries of the buffer it was given.
                unsafe { entries.set_len(n) };
                let map = pid_map(active, device, &snapshot, Keyed::Lists);
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
    *WIDE.get_or_init(|| driver().nvml_driver_version().is_some_and(|v| wide_v3_driver(&v)))
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
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let real = |c, i| unsafe { raw::$name(device, c, i) };
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
                // SAFETY: the caller's own count and buffer, which on these drivers holds 32-byte
                // entries: the driver writes the layout it always writes.
                let real = |c, i: *mut NvmlProcessInfoV3Cc| unsafe { raw::$name(device, c, i.cast()) };
                // SAFETY: on these drivers the caller's buffer holds 32-byte entries.
                unsafe { list_in_layout(device, count, infos.cast::<NvmlProcessInfoV3Cc>(), $kind, real, v3_wide) }
            } else {
                // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
                let real = |c, i| unsafe { raw::$name(device, c, i) };
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

/// The r550 process list, one call for all three kinds: compute mode is built from the
/// ledger as `nvmlDeviceGetComputeRunningProcesses` is, graphics and MPS modes are the
/// driver's list filtered like the other graphics and MPS calls.
///
/// # Safety
/// `nvmlDeviceGetRunningProcessDetailList` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(device: NvmlDevice, plist: *mut NvmlProcessDetailList) -> NvmlReturn {
    let call = |list: *mut NvmlProcessDetailList| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetRunningProcessDetailList(device, list) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        if plist.is_null() || matches!(state::mode(), Mode::Off) {
            return call(plist);
        }
        // SAFETY: non-null, the caller's nvmlProcessDetailList_t.
        let (version, mode, array) = unsafe { ((*plist).version, (*plist).mode, (*plist).proc_array) };
        if version != NVML_PROCESS_DETAIL_LIST_V1 {
            // A layout fgpu does not know: refused rather than passed through unfiltered.
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let kind = match mode {
            NVML_PROCESS_MODE_COMPUTE => ListKind::Compute,
            NVML_PROCESS_MODE_GRAPHICS | NVML_PROCESS_MODE_MPS => ListKind::Other,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        // The driver's list of this mode, read through a list struct of our own so that the
        // driver never writes the caller's.
        let real = |count: *mut c_uint, infos: *mut NvmlProcessDetailV1| {
            // SAFETY: process_list passes a pointer to a live count.
            let mut ours = NvmlProcessDetailList { version, mode, num_proc_array_entries: unsafe { *count }, proc_array: infos };
            let rc = call(&mut ours);
            // SAFETY: as above.
            unsafe { *count = ours.num_proc_array_entries };
            rc
        };
        // SAFETY: the count field of the caller's struct; its array null or holding that many
        // entries, per the NVML contract.
        unsafe { process_list(device, std::ptr::addr_of_mut!((*plist).num_proc_array_entries), array, kind, real, |e| e.pid_and_memory(), v3_wide) }
    })
}


/// The driver's whole list, read into our own buffer: a size query, then the call, again
/// while the list grows. The caller's buffer is sized for the container's entries only, so
/// the driver never writes into it directly.
fn fetch_all<T: Copy + Default>(real: impl Fn(*mut T, *mut c_uint) -> NvmlReturn) -> Result<Vec<T>, NvmlReturn> {
    let mut n: c_uint = 0;
    let rc = real(std::ptr::null_mut(), &mut n);
    // Most lists answer a size query with INSUFFICIENT_SIZE; session lists with SUCCESS and
    // the count.
    if rc == NVML_SUCCESS && n == 0 {
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

/// The entries of `all` whose PID stands for a ledger process ([`pid_map`]), each with the
/// PID as the caller sees it.
fn keep_ours<T: Copy>(active: &Active, device: NvmlDevice, keyed: Keyed, all: &[T], pid: impl Fn(&T) -> c_uint, with_pid: impl Fn(T, c_uint) -> T) -> Vec<T> {
    let map = pid_map(active, device, &active.ledger.snapshot(active.slot_if_joined()), keyed);
    all.iter().filter_map(|e| map.iter().find(|(driver, _)| *driver == pid(e)).map(|(_, here)| with_pid(*e, *here))).collect()
}

/// Hands `kept` to the caller with NVML's size rules: `*count` is the caller's capacity on
/// entry and the container's count on return; a NULL array or a short one gets
/// `NVML_ERROR_INSUFFICIENT_SIZE` and nothing written. `none` is the answer when nothing is
/// kept; with `zero_is_query` a capacity of 0 is a size query answered `NVML_SUCCESS` (the
/// session lists' rule).
///
/// # Safety
/// `count` non-null and writable; `out` null or writable for `*count` entries.
unsafe fn answer<T: Copy>(kept: &[T], count: *mut c_uint, out: *mut T, none: NvmlReturn, zero_is_query: bool) -> NvmlReturn {
    // SAFETY: count is non-null, per the contract.
    let capacity = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = kept.len() as c_uint };
    if kept.is_empty() {
        return none;
    }
    if zero_is_query && capacity == 0 {
        return NVML_SUCCESS;
    }
    if out.is_null() || capacity < kept.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `capacity` >= kept.len() entries.
    unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), out, kept.len()) };
    NVML_SUCCESS
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
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetProcessUtilization(device, s, c, last_seen) }
        .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        if count.is_null() {
            return real(samples, count);
        }
        let kept = match state::mode() {
            Mode::Off => return real(samples, count),
            // Fail closed: no samples.
            Mode::Closed(_) => Vec::new(),
            Mode::On(active) => match fetch_all(real) {
                Ok(all) => keep_ours(active, device, Keyed::Samples, &all, |s| s.pid, |s, pid| NvmlProcessUtilizationSample { pid, ..s }),
                Err(NVML_ERROR_NOT_FOUND) => Vec::new(),
                Err(rc) => return rc,
            },
        };
        // No sample of ours: what the driver answers when it has none, NOT_FOUND.
        // SAFETY: count is non-null; samples per the caller's contract.
        unsafe { answer(&kept, count, samples, NVML_ERROR_NOT_FOUND, false) }
    })
}

/// The r550 form of per-process utilisation, filtered the same way.
///
/// # Safety
/// `nvmlDeviceGetProcessesUtilizationInfo` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(device: NvmlDevice, info: *mut NvmlProcessesUtilizationInfo) -> NvmlReturn {
    let call = |i: *mut NvmlProcessesUtilizationInfo| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetProcessesUtilizationInfo(device, i) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        if info.is_null() || matches!(state::mode(), Mode::Off) {
            return call(info);
        }
        // SAFETY: non-null, the caller's nvmlProcessesUtilizationInfo_t.
        let (version, last_seen, out) = unsafe { ((*info).version, (*info).last_seen_time_stamp, (*info).proc_util_array) };
        if version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            // A layout fgpu does not know: refused rather than passed through unfiltered.
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let kept = match state::mode() {
            Mode::On(active) => {
                let real = |p: *mut NvmlProcessUtilizationInfoV1, c: *mut c_uint| {
                    // SAFETY: fetch_all passes a pointer to its own live count.
                    let mut ours = NvmlProcessesUtilizationInfo { version, process_samples_count: unsafe { *c }, last_seen_time_stamp: last_seen, proc_util_array: p };
                    let rc = call(&mut ours);
                    // SAFETY: as above.
                    unsafe { *c = ours.process_samples_count };
                    rc
                };
                match fetch_all(real) {
                    Ok(all) => keep_ours(active, device, Keyed::Samples, &all, |s| s.pid, |s, pid| NvmlProcessUtilizationInfoV1 { pid, ..s }),
                    Err(NVML_ERROR_NOT_FOUND) => Vec::new(),
                    Err(rc) => return rc,
                }
            }
            _ => Vec::new(),
        };
        // SAFETY: the count field of the caller's struct; its array per the NVML contract.
        unsafe { answer(&kept, std::ptr::addr_of_mut!((*info).process_samples_count), out, NVML_ERROR_NOT_FOUND, false) }
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
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingPids(device, c, p) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        if count.is_null() {
            return real(pids, count);
        }
        let kept = match state::mode() {
            Mode::Off => return real(pids, count),
            Mode::Closed(_) => Vec::new(),
            Mode::On(active) => match fetch_all(real) {
                Ok(all) => keep_ours(active, device, Keyed::Raw, &all, |p| *p, |_, pid| pid),
                Err(rc) => return rc,
            },
        };
        // SAFETY: count is non-null; pids per the caller's contract.
        unsafe { answer(&kept, count, pids, NVML_SUCCESS, false) }
    })
}

/// Only the ledger's processes have accounting stats; the caller names them by its own PIDs.
///
/// # Safety
/// `nvmlDeviceGetAccountingStats` contract (`stats` is an opaque out-struct here).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(device: NvmlDevice, pid: c_uint, stats: *mut std::ffi::c_void) -> NvmlReturn {
    let real = |p: c_uint| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingStats(device, p, stats) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || match state::mode() {
        Mode::Off => real(pid),
        Mode::Closed(_) => NVML_ERROR_NOT_FOUND,
        Mode::On(active) => match host_pid_of(active, pid) {
            Some(host) => real(host),
            None => NVML_ERROR_NOT_FOUND,
        },
    })
}

/// The host PID of the ledger process the caller knows as `pid`.
fn host_pid_of(active: &Active, pid: c_uint) -> Option<c_uint> {
    let map = host_pid_map(&active.ledger.snapshot(active.slot_if_joined()));
    map.iter().find(|(_, here)| *here == pid).map(|(host, _)| *host)
}

/// The r610 form: the PID is a field of `stats`, translated for the driver and put back.
///
/// # Safety
/// `nvmlDeviceGetAccountingStats_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats_v2(device: NvmlDevice, stats: *mut NvmlAccountingStatsV2) -> NvmlReturn {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingStats_v2(device, stats) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        if stats.is_null() {
            return real();
        }
        let active = match state::mode() {
            Mode::Off => return real(),
            Mode::Closed(_) => return NVML_ERROR_NOT_FOUND,
            Mode::On(active) => active,
        };
        // SAFETY: non-null, the caller's nvmlAccountingStats_v2_t.
        let pid = unsafe { (*stats).pid };
        let Some(host) = host_pid_of(active, pid) else { return NVML_ERROR_NOT_FOUND };
        // SAFETY: as above.
        unsafe { (*stats).pid = host };
        let rc = real();
        // SAFETY: as above.
        unsafe { (*stats).pid = pid };
        rc
    })
}

/// Encoder or frame-buffer-capture sessions: the driver's list less other containers'
/// processes, with the sessions' size rules (a count of 0 is a query answered NVML_SUCCESS).
///
/// # Safety
/// The session-list contract for `T`.
unsafe fn session_list<T: Copy + Default>(
    device: NvmlDevice,
    count: *mut c_uint,
    out: *mut T,
    real: impl Fn(*mut c_uint, *mut T) -> NvmlReturn,
    pid: impl Fn(&T) -> c_uint,
    with_pid: impl Fn(T, c_uint) -> T,
) -> NvmlReturn {
    if count.is_null() {
        return real(count, out);
    }
    let kept = match state::mode() {
        Mode::Off => return real(count, out),
        Mode::Closed(_) => Vec::new(),
        Mode::On(active) => match fetch_all(|p, c| real(c, p)) {
            Ok(all) => keep_ours(active, device, Keyed::Raw, &all, pid, with_pid),
            Err(rc) => return rc,
        },
    };
    // SAFETY: count is non-null; out per the caller's contract.
    unsafe { answer(&kept, count, out, NVML_SUCCESS, true) }
}

/// # Safety
/// `nvmlDeviceGetEncoderSessions` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(device: NvmlDevice, count: *mut c_uint, sessions: *mut NvmlEncoderSessionInfo) -> NvmlReturn {
    let real = |c, s| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetEncoderSessions(device, c, s) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { session_list(device, count, sessions, real, |s| s.pid, |s, pid| NvmlEncoderSessionInfo { pid, ..s }) }
    })
}

/// # Safety
/// `nvmlDeviceGetFBCSessions` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(device: NvmlDevice, count: *mut c_uint, sessions: *mut NvmlFbcSessionInfo) -> NvmlReturn {
    let real = |c, s| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetFBCSessions(device, c, s) }
            .unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    super::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { session_list(device, count, sessions, real, |s| s.pid, |s, pid| NvmlFbcSessionInfo { pid, ..s }) }
    })
}

#[cfg(test)]
mod tests {
    /// A raw host PID can equal a PID of the caller's namespace: a sample under such a
    /// number is nobody's.
    #[test]
    fn a_driver_pid_that_could_be_two_processes_is_neither() {
        // 7: this namespace's process 7 (slot 0), and a process it cannot see whose host PID
        // is 7 (slot 1): both would be shown as 7.
        let mut map = vec![(7, 7, 0), (40123, 40123, 2), (7, 7, 1), (12, 12, 3)];
        super::drop_ambiguous(&mut map);
        assert_eq!(map, [(40123, 40123, 2), (12, 12, 3)]);
        let mut map = vec![(7, 7, 0), (7, 7, 0)];
        super::drop_ambiguous(&mut map);
        assert_eq!(map, [(7, 7, 0), (7, 7, 0)], "the same process twice is still that process");
    }

    #[test]
    fn only_early_535_drivers_use_wide_v3_entries() {
        assert!(super::wide_v3_driver("535.54.03"));
        assert!(super::wide_v3_driver("535.43.02"));
        assert!(!super::wide_v3_driver("535.104.05"));
        assert!(!super::wide_v3_driver("570.26"));
        assert!(!super::wide_v3_driver("530.30.02"));
    }
}
