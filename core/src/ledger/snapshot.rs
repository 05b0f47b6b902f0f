//! A picture of the ledger, for `fgpu status`, `top`, the exporter and NVML's process
//! lists: every live slot's process and what it holds, every device and its figures
//! ([`Snapshot`]).

use super::layout::*;
use super::*;

impl Ledger {
    /// A picture of the ledger for display and NVML process lists. Each device's `used` is
    /// the sum of the listed processes' `used`, read once. PIDs are given as the caller's
    /// PID namespace sees them.
    pub fn snapshot(&self, own: Option<SlotId>) -> Snapshot {
        let my_ns = pidns::own_pidns();
        let in_host = my_ns == pidns::INIT_PIDNS_INODE;
        let mut processes = Vec::new();
        for id in self.live_slots() {
            let slot = self.slot(id);
            let index = id.0;
            let alive = Some(id) == own || self.is_alive(id);
            let pid = slot.pid.load(Relaxed);
            let same_ns = slot.pidns.load(Relaxed) == my_ns;
            // The kernel's word: the PID, as seen here, of the process holding the slot's
            // classic lock (members skip the call for their own namespace, where the slot's
            // PID is the one they would get). What the slot states, its processes wrote.
            let held_by = if same_ns && self.store.is_member() { None } else { lock::posix_holder(self.fd(), pid_lock(index)) };
            let pid_here = held_by.or(same_ns.then_some(pid));
            let stated = slot.host_pid.load(Relaxed);
            let (host_pid, host_pid_vouched) = match held_by {
                Some(p) if in_host => {
                    if stated == 0 && self.store.writable() {
                        slot.host_pid.store(p, Relaxed);
                    }
                    (Some(p), true)
                }
                _ => ((stated != 0).then_some(stated), false),
            };
            let mut comm = [0u8; 16];
            comm[..8].copy_from_slice(&slot.comm[0].load(Relaxed).to_le_bytes());
            comm[8..].copy_from_slice(&slot.comm[1].load(Relaxed).to_le_bytes());
            let name_len = comm.iter().position(|b| *b == 0).unwrap_or(16);
            processes.push(ProcessView {
                slot: id,
                pid,
                pid_here,
                host_pid,
                host_pid_vouched,
                dying: !alive && slot.dying_since_ns.load(Relaxed) != 0,
                name: String::from_utf8_lossy(&comm[..name_len]).into_owned(),
                alive,
                started_unix_ms: slot.started_unix_ms.load(Relaxed),
                used: (0..MAX_DEVICES).map(|d| self.holding(id, DeviceId(d)).held()).collect(),
                reserved: (0..MAX_DEVICES).map(|d| self.holding(id, DeviceId(d)).reserved).collect(),
                context: (0..MAX_DEVICES).map(|d| slot.context[d].load(Relaxed)).collect(),
            });
        }
        let devices = (0..MAX_DEVICES)
            .map(DeviceId)
            .filter(|id| self.device(*id).state.load(Acquire) == DEVICE_READY)
            .map(|id| {
                let e = self.device(id);
                DeviceView {
                    id,
                    uuid: devices::entry_uuid(e),
                    cap: e.cap.load(Relaxed),
                    used: processes.iter().map(|p| p.used[id.0]).fold(0u64, u64::saturating_add),
                    peak: e.peak.load(Relaxed),
                    refusals: e.refusals.load(Relaxed),
                    total_memory: e.total_memory.load(Relaxed),
                }
            })
            .collect();
        Snapshot { path: self.path().to_path_buf(), devices, processes }
    }
}
