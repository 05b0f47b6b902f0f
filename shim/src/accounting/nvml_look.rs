//! What NVML's compute list says of this process: which PIDs NVML gives here (looked at
//! while it is not known, `process/nvml_pid.rs`), and how much memory a context just created takes.

use crate::abi::nvml::NvmlDevice;
use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use crate::process::account::Account;
use crate::process::devices::Dev;
use fgpu_core::ledger::{DeviceId, SlotId, Snapshot};
use fgpu_core::nvmlpids::{Entry, Look, Member, Own, Verdict};

/// NVML's compute list for a device as [`Entry`]s (memory figures read as
/// `fgpu_core::nvmlpids` reads them).
pub fn compute_entries(device: NvmlDevice) -> Option<Vec<Entry>> {
    driver().nvml_compute_processes(device).map(|list| list.into_iter().map(|p| Entry::new(p.pid, p.used_gpu_memory)).collect())
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
/// gives (`process/nvml_pid.rs`), while that is not known; a no-op in the host's namespace.
/// `counted` is a lower bound on what this process holds on the device when it holds a
/// context there (so the driver lists it), `None` otherwise.
pub fn identify(account: &Account, dev: DeviceId, entries: &[Entry], counted: Option<u64>) -> Option<Verdict> {
    if fgpu_core::pidns::in_host_pidns() || !account.nvml_pid().needs_a_look() {
        return None;
    }
    let slot = account.slot_if_joined();
    let snapshot = account.ledger().snapshot(slot);
    let others = members(&snapshot, slot, dev);
    // The service's answer (asked when the process joined its ledger; a process without a
    // slot, such as nvidia-smi, asks nothing), or what a process of the host's namespace
    // filled in.
    let told = if slot.is_some() { account.own_host_pid() } else { account.nvml_pid().host_known() };
    let host = told.or_else(|| snapshot.processes.iter().find(|p| Some(p.slot) == slot).and_then(|p| p.host_pid));
    let own = counted.map(|counted| Own { here: std::process::id(), host, counted });
    Some(account.nvml_pid().observe(&Look { at_ns: fgpu_core::log::monotonic_ns(), own, others: &others, entries }, |pid| {
        if let Some(slot) = slot {
            account.ledger().set_host_pid(slot, pid);
        }
    }))
}

/// Device-wide used memory before a context is created, when NVML's per-process figure
/// for this process is not known to be usable (otherwise that figure is used).
pub fn before_context(account: &Account, dev: &Dev) -> Option<u64> {
    if account.nvml_pid().memory_pid().is_some() {
        return None;
    }
    driver().nvml_memory(driver().nvml_device_by_uuid(&dev.uuid)?).map(|m| m.used)
}

/// The size of the context just created on `dev`, while `reserved` bytes for it are
/// already in this process's slot: this process's own figure in NVML's list where it is
/// known which entry that is and the entry has one, else the device's usage before
/// (`before`) and after.
pub fn context_size(account: &Account, dev: &Dev, reserved: u64, before: Option<u64>) -> Option<u64> {
    let handle = driver().nvml_device_by_uuid(&dev.uuid)?;
    let slot = account.slot_if_joined()?;
    let held_before = account.ledger().slot_used(slot, dev.id).saturating_sub(reserved);
    let entries = compute_entries(handle);
    if let Some(entries) = &entries {
        identify(account, dev.id, entries, Some(held_before));
        if let Some(pid) = account.nvml_pid().memory_pid() {
            if let Some(mine) = entries.iter().find(|e| e.pid == pid).and_then(|e| e.used) {
                return Some(mine.saturating_sub(held_before));
            }
        }
    }
    let after = driver().nvml_memory(handle)?.used;
    Some(after.saturating_sub(before?))
}
