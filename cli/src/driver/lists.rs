//! The driver's word, for a tool that observes ledgers (`fgpu status`, `top`, the exporter,
//! `fgpu run`), on a process of a ledger that died: does a GPU still list it?
//!
//! The kernel drops a dead process's ledger lock when its files close, which can be well
//! before the driver has freed its memory (`fgpu_core::ledger::dying`). A process of the
//! ledger asks NVML before it drops such a slot; a tool that drops it without asking would
//! hand a newcomer memory the driver still holds, and the device would hold more than the
//! cap. So the tools ask too: NVML is loaded into this process once, the first time a dead
//! slot is found (never for a ledger with none), and its functions are found with glibc's
//! own `dlsym` (`driver_probe::Library`), so a preloaded shim never answers for the driver.
//!
//! Where NVML cannot be asked here (no NVML, a list it did not give in full) the process
//! counts as still listed, and the slot is left for a process of the ledger to drop. A dead
//! process that cannot be named as NVML would list it here (in another PID namespace, its
//! host PID never learnt) is judged as the ledger's processes judge it (`shim/`,
//! `nvml_still_lists`): not listed, the kernel having dropped its lock. Keeping it would keep
//! its bytes counted for good, as nothing could ever show it gone.

use crate::driver::probe::{Library, NvmlCount, NvmlHandle, NvmlInit, NvmlProcessInfoV1, NvmlProcesses};
use fgpu_core::ledger::DeadProcess;
use fgpu_core::pidns;
use std::collections::HashSet;
use std::sync::OnceLock;

/// `NVML_ERROR_INSUFFICIENT_SIZE` (nvml.h).
const INSUFFICIENT_SIZE: u32 = 7;
/// At most this many devices are asked (more than any machine has).
const MAX_DEVICES: u32 = 64;

/// NVML, initialised, and the three functions the lists need.
struct Nvml {
    _library: Library,
    count: NvmlCount,
    handle: NvmlHandle,
    processes: NvmlProcesses,
}

// SAFETY: NVML is documented thread-safe (nvml.h: "NVML is thread-safe so it is safe to
// make simultaneous NVML calls from multiple threads"); the library handle is only kept
// (never used after the lookups, never closed) and the rest are plain function pointers.
unsafe impl Send for Nvml {}
// SAFETY: as for Send: nothing here is mutated after construction.
unsafe impl Sync for Nvml {}

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        let library = Library::open(c"libnvidia-ml.so.1").ok()?;
        // SAFETY: each type is the prototype nvml.h gives the function named
        // (`nvmlInit_v2`/`nvmlInit`: `nvmlReturn_t (void)`; `nvmlDeviceGetCount_v2`:
        // `(unsigned *)`; `nvmlDeviceGetHandleByIndex_v2`: `(unsigned, nvmlDevice_t *)`;
        // `nvmlDeviceGetComputeRunningProcesses`: `(nvmlDevice_t, unsigned *,
        // nvmlProcessInfo_v1_t *)`, the unversioned name keeping the v1 entry).
        unsafe {
            let init = library.get::<NvmlInit>(c"nvmlInit_v2").or_else(|| library.get::<NvmlInit>(c"nvmlInit"))?;
            let count = library.get::<NvmlCount>(c"nvmlDeviceGetCount_v2").or_else(|| library.get::<NvmlCount>(c"nvmlDeviceGetCount"))?;
            let handle = library.get::<NvmlHandle>(c"nvmlDeviceGetHandleByIndex_v2")?;
            let processes = library.get::<NvmlProcesses>(c"nvmlDeviceGetComputeRunningProcesses")?;
            if init() != 0 {
                return None;
            }
            Some(Nvml { _library: library, count, handle, processes })
        }
    })
    .as_ref()
}

/// The PIDs NVML lists as running compute work on any GPU, as it gives them to this process;
/// `None` when NVML is not here or did not answer in full.
fn listed_pids() -> Option<HashSet<u32>> {
    let nvml = nvml()?;
    let mut pids = HashSet::new();
    let mut count = 0u32;
    // SAFETY: models nvmlDeviceGetCount_v2 with a pointer to a live local.
    if unsafe { (nvml.count)(&mut count) } != 0 {
        return None;
    }
    for index in 0..count.min(MAX_DEVICES) {
        let mut device = std::ptr::null_mut();
        // SAFETY: models nvmlDeviceGetHandleByIndex_v2 with an index below the count and a
        // pointer to a live local.
        if unsafe { (nvml.handle)(index, &mut device) } != 0 {
            return None;
        }
        pids.extend(device_pids(nvml, device)?);
    }
    Some(pids)
}

/// One device's list, asked again with room for what it said it needs while it grows.
fn device_pids(nvml: &Nvml, device: *mut std::ffi::c_void) -> Option<Vec<u32>> {
    let mut room = 64usize;
    for _ in 0..4 {
        let mut entries = vec![NvmlProcessInfoV1::default(); room];
        let mut n = room as u32;
        // SAFETY: models nvmlDeviceGetComputeRunningProcesses (v1 entries) with a handle
        // NVML gave, `n` set to the number of entries the live buffer holds.
        match unsafe { (nvml.processes)(device, &mut n, entries.as_mut_ptr()) } {
            0 => return Some(entries[..(n as usize).min(room)].iter().map(|e| e.pid).collect()),
            INSUFFICIENT_SIZE => room = (n as usize).max(room) + 16,
            _ => return None,
        }
    }
    None
}

/// Whether the driver may still hold memory of `dead`: NVML lists it on a GPU, or NVML
/// cannot be asked here. Installed with `Ledger::set_still_held` by every tool that
/// may drop dead processes' slots.
pub fn may_still_hold(dead: &DeadProcess) -> bool {
    let Some(listed) = listed_pids() else { return true };
    match wanted_pids(dead, pidns::own_pidns(), pidns::in_host_pidns()) {
        Some(pids) => pids.iter().any(|pid| listed.contains(pid)),
        None => false,
    }
}

/// The PIDs under which NVML may list `dead` to a caller in PID namespace `own_ns`; `None`
/// when none can be named. In the host's namespace NVML gives host PIDs, on every driver.
/// Elsewhere a current driver gives PIDs as the caller's namespace sees them and an older
/// one host PIDs: both are looked for (a stranger listed under one of them only keeps the
/// slot a little longer).
fn wanted_pids(dead: &DeadProcess, own_ns: u64, in_host_ns: bool) -> Option<Vec<u32>> {
    let same_ns = dead.pidns == own_ns;
    let host = (dead.host_pid != 0).then_some(dead.host_pid);
    let pids: Vec<u32> = match (in_host_ns, same_ns) {
        (true, true) => vec![dead.pid],
        (true, false) => host.into_iter().collect(),
        (false, true) => [Some(dead.pid), host].into_iter().flatten().collect(),
        (false, false) => Vec::new(),
    };
    (!pids.is_empty()).then_some(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(pid: u32, host_pid: u32, pidns: u64) -> DeadProcess {
        DeadProcess { pid, host_pid, pidns, joined_unix_ms: 0 }
    }

    #[test]
    fn the_pids_looked_for_are_those_nvml_gives_here() {
        // In the host's namespace: its own PID if it was there too, else its host PID.
        assert_eq!(wanted_pids(&dead(40, 40, 1), 1, true), Some(vec![40]));
        assert_eq!(wanted_pids(&dead(7, 4007, 2), 1, true), Some(vec![4007]));
        assert_eq!(wanted_pids(&dead(7, 0, 2), 1, true), None, "a host PID never learnt cannot be looked for");
        // In a container: either numbering, for a process of the same namespace.
        assert_eq!(wanted_pids(&dead(7, 4007, 2), 2, false), Some(vec![7, 4007]));
        assert_eq!(wanted_pids(&dead(7, 0, 2), 2, false), Some(vec![7]));
        assert_eq!(wanted_pids(&dead(7, 4007, 3), 2, false), None, "another container's process is not visible here");
    }
}
