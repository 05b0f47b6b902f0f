//! What NVML shows of the ledger's processes: the container's memory view of a device,
//! its processes with the PIDs the caller sees, and which PID of a driver answer stands for
//! which of them (by which PIDs NVML gives here, `fgpu_core::nvmlpids`). The NVML hooks
//! (`hooks/nvml/`) write these answers in the caller's layouts.

use super::active::Active;
use super::nvml_look;
use crate::abi::nvml::{NvmlDevice, NVML_NO_INSTANCE};
use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use fgpu_core::ledger::{DeviceId, SlotId, Snapshot};
use fgpu_core::nvmlpids::NvmlPids;
use fgpu_core::uuid::DeviceUuid;
use fgpu_core::view::MemoryView;

/// The UUID of an NVML device (a GPU's, or a MIG device's on a MIG device handle).
pub fn nvml_device_uuid(device: NvmlDevice) -> Option<DeviceUuid> {
    DeviceUuid::parse(&driver().nvml_device_uuid(device)?)
}

/// A process as the container's process lists report it.
pub struct Listed {
    pub pid: u32,
    pub used: u64,
    /// The GPU and compute instance it runs in on a MIG device, as NVML's lists name them
    /// (`NVML_NO_INSTANCE` elsewhere); filled in for the device listed.
    pub instance: (u32, u32),
}

/// `NVML_NO_INSTANCE` twice: a process not on a MIG device.
pub const NO_INSTANCE: (u32, u32) = (NVML_NO_INSTANCE, NVML_NO_INSTANCE);

/// The ledger's live processes holding memory on `id`, with PIDs as the caller sees them.
pub fn ledger_processes(snapshot: &Snapshot, id: DeviceId) -> Vec<Listed> {
    snapshot
        .processes
        .iter()
        .filter(|p| p.alive && p.used.get(id.0).copied().unwrap_or(0) > 0)
        .filter_map(|p| Some(Listed { pid: p.pid_here.or(p.host_pid)?, used: p.used[id.0], instance: NO_INSTANCE }))
        .collect()
}

/// Host PID -> PID as the caller sees it, for the ledger's processes whose host PID is known.
pub fn host_pid_map(snapshot: &Snapshot) -> Vec<(u32, u32)> {
    snapshot.processes.iter().filter(|p| p.alive).filter_map(|p| Some((p.host_pid?, p.pid_here.or(p.host_pid)?))).collect()
}

/// What the PIDs of a driver answer are.
#[derive(Clone, Copy, PartialEq)]
pub enum Keyed {
    /// Process lists (graphics, MPS): host PIDs, or the caller's, by the driver.
    Lists,
    /// Utilisation samples: as lists, except that in the caller modes a process the caller
    /// cannot see keeps its raw host PID (`kern_perf_ctrl.c` in NVIDIA's open modules).
    Samples,
    /// Accounting and encoder / frame-buffer-capture sessions: the raw host PID the driver
    /// recorded (`pClient->ProcID`), on every driver.
    Raw,
}

/// Leaves out every driver PID that stands for two different processes (slots) in `map`.
fn drop_ambiguous<T: PartialEq + Copy>(map: &mut Vec<(u32, u32, T)>) {
    let twice: Vec<u32> = map.iter().filter(|(k, _, a)| map.iter().any(|(k2, _, b)| k2 == k && b != a)).map(|(k, _, _)| *k).collect();
    map.retain(|(k, _, _)| !twice.contains(k));
}

impl Active {
    /// The container's view of one NVML device (`fgpu_core::view`) and what the ledger's
    /// processes hold there, or `None` to leave the driver's answer alone (no cap
    /// configured for it).
    pub fn nvml_memory_view(&self, device: NvmlDevice, real_total: u64) -> Option<(MemoryView, u64)> {
        let account = &self.account;
        let uuid = nvml_device_uuid(device)?;
        let own = account.config().cap_for(&uuid.to_string(), real_total)?;
        // Not the rate-limited scan: a process that has just exited must already be gone
        // from `used`, as it is from the process list (the driver frees its memory at exit).
        account.ledger().reclaim_dead(account.slot_if_joined());
        let id = account.ledger().find_device(uuid.bytes);
        let view = MemoryView::new(Some(own), id.map(|id| account.ledger().cap(id)), real_total);
        Some((view, id.map_or(0, |id| account.ledger().used(id))))
    }

    /// The ledger as a process list of `device` sees it: its entry for the device (if the
    /// ledger knows it), and a snapshot of its processes, the dead ones reclaimed first.
    pub fn listing(&self, device: NvmlDevice) -> (Option<DeviceId>, Snapshot) {
        let account = &self.account;
        let id = nvml_device_uuid(device).and_then(|u| account.ledger().find_device(u.bytes));
        account.ledger().reclaim_dead(account.slot_if_joined());
        (id, account.ledger().snapshot(account.slot_if_joined()))
    }

    /// A snapshot of the ledger's processes.
    pub fn snapshot(&self) -> Snapshot {
        self.account.ledger().snapshot(self.account.slot_if_joined())
    }

    /// The host PID of the ledger process the caller knows as `pid`.
    pub fn host_pid_of(&self, pid: u32) -> Option<u32> {
        host_pid_map(&self.snapshot()).iter().find(|(_, here)| *here == pid).map(|(host, _)| *host)
    }

    /// Driver PID -> PID as the caller sees it, for the ledger's live processes, by what NVML
    /// gives here ([`NvmlPids`]). A driver PID that could stand for two of them stands for none:
    /// nothing of one process is shown, or charged, as another's.
    pub fn pid_map(&self, device: NvmlDevice, snapshot: &Snapshot, keyed: Keyed) -> Vec<(u32, u32)> {
        let alive = || snapshot.processes.iter().filter(|p| p.alive);
        let by_host = || alive().filter_map(|p| Some((p.host_pid?, p.pid_here.or(p.host_pid)?, p.slot))).collect::<Vec<_>>();
        let mut map: Vec<(u32, u32, SlotId)> = if keyed == Keyed::Raw {
            by_host()
        } else {
            match self.settled_behaviour(device) {
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

    /// Which PIDs NVML gives here, looked for now (at most every [`LOOK_EVERY_NS`]) while it is
    /// not known: from this process's own entry if it holds a context on `device`, else from
    /// the ledger's other processes.
    fn settled_behaviour(&self, device: NvmlDevice) -> NvmlPids {
        const LOOK_EVERY_NS: u64 = 200_000_000;
        static LAST_LOOK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let account = &self.account;
        let behaviour = account.nvml_pid().behaviour();
        if behaviour != NvmlPids::Unknown {
            return behaviour;
        }
        let now = fgpu_core::log::monotonic_ns();
        let last = LAST_LOOK.load(std::sync::atomic::Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < LOOK_EVERY_NS {
            return behaviour;
        }
        LAST_LOOK.store(now, std::sync::atomic::Ordering::Relaxed);
        let Some(id) = nvml_device_uuid(device).and_then(|u| account.ledger().find_device(u.bytes)) else { return behaviour };
        let Some(entries) = nvml_look::compute_entries(device) else { return behaviour };
        let own = account.slot_if_joined().filter(|_| self.untracked.quiet()).and_then(|slot| {
            let dev = account.registered_devices().find(|d| d.id == id)?;
            self.contexts.holds_on(dev.ordinal).then(|| account.ledger().slot_used(slot, id))
        });
        nvml_look::identify(account, id, &entries, own);
        account.nvml_pid().behaviour()
    }
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
}
