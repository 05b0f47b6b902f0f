//! The driver's word, for a tool that observes ledgers (`fgpu status`, `top`, the exporter,
//! `fgpu run`), on a process of a ledger that died: does a GPU still list it?
//!
//! The kernel drops a dead process's ledger lock when its files close, which can be well
//! before the driver has freed its memory (`fgpu_core::ledger::dying`). A process of the
//! ledger asks NVML before it drops such a slot; a tool that drops it without asking would
//! hand a newcomer memory the driver still holds, and the device would hold more than the
//! cap. So the tools ask too: NVML is loaded into this process once, the first time a dead
//! slot is found (never for a ledger with none), and its functions are found with glibc's
//! own `dlsym` (`calls.rs`), so a preloaded shim never answers for the driver.
//!
//! Where NVML cannot be asked here (no NVML, a list it did not give in full) the process
//! counts as still listed, and the slot is left for a process of the ledger to drop. A dead
//! process that cannot be named as NVML would list it here (in another PID namespace, its
//! host PID never learnt) is judged as the ledger's processes judge it (`shim/`,
//! `nvml_still_lists`): not listed, the kernel having dropped its lock. Keeping it would keep
//! its bytes counted for good, as nothing could ever show it gone.

use super::calls::{Device, ListError, Nvml};
use fgpu_core::ledger::DeadProcess;
use fgpu_core::pidns;
use std::collections::HashSet;
use std::sync::OnceLock;

/// At most this many devices are asked (more than any machine has).
const MAX_DEVICES: u32 = 64;

/// NVML, opened and initialised once in this process (never shut down: a tool that scans
/// again and again, as the exporter does, keeps it); `None` when it cannot be.
fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        let nvml = Nvml::open().ok()?;
        if !nvml.can_list_processes() {
            return None;
        }
        nvml.init()?.ok()?;
        Some(nvml)
    })
    .as_ref()
}

/// The PIDs NVML lists as running compute work on any GPU, as it gives them to this process;
/// `None` when NVML is not here or did not answer in full.
fn listed_pids() -> Option<HashSet<u32>> {
    let nvml = nvml()?;
    let count = nvml.device_count()?.ok()?;
    let mut pids = HashSet::new();
    for index in 0..count.min(MAX_DEVICES) {
        let device = nvml.device(index)?.ok()?;
        pids.extend(device_pids(nvml, device)?);
    }
    Some(pids)
}

/// One device's list, asked again with room for what it said it needs while it grows.
pub(crate) fn device_pids(nvml: &Nvml, device: Device<'_>) -> Option<Vec<u32>> {
    let mut room = 64usize;
    for _ in 0..4 {
        match nvml.compute_processes(device, room) {
            Ok(entries) => return Some(entries.iter().map(|e| e.pid).collect()),
            Err(ListError::TooSmall(n)) => room = (n as usize).max(room) + 16,
            Err(_) => return None,
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
