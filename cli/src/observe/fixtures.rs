//! Unit tests only: reports and snapshots for the observers' tests.

use crate::observe::ledgers::Target;
use crate::observe::report::{LedgerReport, LedgerState, ProcessReport};
use fgpu_core::ledger::{DeviceId, ProcessView, Snapshot};
use fgpu_core::ledger::{DeviceView, SlotId};
use std::path::PathBuf;

pub fn empty(target: &Target) -> LedgerReport {
    LedgerReport::empty(target, LedgerState::Missing, None)
}

pub fn process() -> ProcessReport {
    ProcessReport {
        pid: Some(1),
        pid_in_namespace: 1,
        host_pid: None,
        host_pid_vouched: false,
        name: "p".into(),
        started_unix_ms: 0,
        used_bytes: 0,
        context_bytes: 0,
        devices: vec![],
    }
}

pub const GIB: u64 = 1 << 30;

pub fn process_view(slot: usize, pid: u32, alive: bool, used0: u64, ctx0: u64) -> ProcessView {
    let mut used = vec![0; 16];
    let mut context = vec![0; 16];
    used[0] = used0;
    context[0] = ctx0;
    ProcessView {
        slot: SlotId(slot),
        pid,
        pid_here: Some(pid),
        host_pid: Some(pid + 1000),
        host_pid_vouched: false,
        dying: false,
        name: format!("p{pid}"),
        alive,
        started_unix_ms: 1,
        reserved: used.clone(),
        used,
        context,
    }
}

pub fn snapshot(processes: Vec<ProcessView>, used: u64) -> Snapshot {
    Snapshot {
        path: PathBuf::from("/l"),
        devices: vec![DeviceView {
            id: DeviceId(0),
            uuid: fgpu_core::uuid::DeviceUuid::gpu([0xab; 16]),
            cap: 8 * GIB,
            used,
            peak: 6 * GIB,
            refusals: 2,
            total_memory: 80 * GIB,
        }],
        processes,
    }
}
