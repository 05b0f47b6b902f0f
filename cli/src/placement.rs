//! Where a job goes on a machine with several GPUs (`fgpu run --gpus auto`), and what each
//! GPU has committed (`fgpu status`).
//!
//! A GPU's room is its memory less what is committed there: the caps of the live ledgers
//! on it that this user can see (root sees every ledger), and what the driver says is used
//! on it beyond what those ledgers hold (processes fgpu does not cap, the driver's own
//! reserve). A job goes to the GPU with the most room that fits its cap, the lower index on
//! a tie. Choosing and claiming happen under a placement lock, and `fgpu run` registers the
//! job's cap in the job's ledger before the lock is let go, so the next job counts it.

use crate::driver_probe::ProbedDevice;
use crate::report::{GpuRoom, LedgerReport, LedgerState};
use fgpu_core::limit::format_bytes;

/// The room on each GPU the driver lists, from the ledgers seen (a scan of every ledger
/// this user may look at).
pub fn rooms(devices: &[ProbedDevice], ledgers: &[LedgerReport]) -> Vec<GpuRoom> {
    devices
        .iter()
        .map(|d| {
            let on_it = ledgers
                .iter()
                .filter(|l| matches!(l.state, LedgerState::Ok | LedgerState::Unverified) && !l.processes.is_empty())
                .flat_map(|l| l.devices.iter())
                .filter(|g| g.uuid.eq_ignore_ascii_case(&d.uuid));
            let (mut committed, mut held, mut count) = (0u64, 0u64, 0usize);
            for g in on_it {
                committed = committed.saturating_add(g.cap_bytes.min(d.total_bytes).max(g.used_bytes));
                held = held.saturating_add(g.used_bytes);
                count += 1;
            }
            let outside = d.used_bytes.saturating_sub(held);
            GpuRoom {
                index: d.index,
                uuid: d.uuid.clone(),
                total_bytes: d.total_bytes,
                committed_bytes: committed,
                ledgers: count,
                used_outside_bytes: outside,
                left_bytes: d.total_bytes.saturating_sub(committed).saturating_sub(outside),
            }
        })
        .collect()
}

/// The GPU with the most room that fits `need(gpu)` bytes (the lower index on a tie), or
/// one line naming each GPU and what it has left.
pub fn choose(rooms: &[GpuRoom], need: impl Fn(&GpuRoom) -> u64) -> Result<&GpuRoom, String> {
    let best = rooms.iter().filter(|r| need(r) <= r.left_bytes).max_by(|a, b| a.left_bytes.cmp(&b.left_bytes).then(b.index.cmp(&a.index)));
    best.ok_or_else(|| {
        if rooms.is_empty() {
            return "no GPU is listed by the driver".to_string();
        }
        let each: Vec<String> = rooms
            .iter()
            .map(|r| {
                format!(
                    "GPU {} ({}) has {} left of {}, needs {}",
                    r.index,
                    r.uuid,
                    format_bytes(r.left_bytes),
                    format_bytes(r.total_bytes),
                    format_bytes(need(r))
                )
            })
            .collect();
        format!("no GPU has room for the job: {}", each.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::DeviceReport;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, used: u64) -> ProbedDevice {
        ProbedDevice { index, uuid: format!("GPU-{index}"), name: "x".into(), total_bytes: 80 * GIB, used_bytes: used, ..Default::default() }
    }

    fn ledger(uuid: &str, cap: u64, used: u64) -> LedgerReport {
        let target = crate::ledgers::Target::plain("/l".into(), crate::ledgers::Origin::Scan);
        let mut l = crate::report::tests_support::empty(&target);
        l.state = LedgerState::Ok;
        l.devices.push(DeviceReport {
            index: 0,
            uuid: uuid.into(),
            cap_bytes: cap,
            used_bytes: used,
            peak_bytes: 0,
            total_bytes: 80 * GIB,
            refusals: 0,
            processes: 1,
            compute_share: None,
            compute_used: None,
            compute_seconds: 0.0,
            compute_wait_seconds: 0.0,
        });
        l.processes.push(crate::report::tests_support::process());
        l
    }

    #[test]
    fn most_room_wins_and_ties_go_to_the_lower_index() {
        let devices = [gpu(0, 0), gpu(1, 0)];
        let r = rooms(&devices, &[]);
        assert_eq!(choose(&r, |_| 50 * GIB).unwrap().index, 0, "a tie goes to the lower index");
        let first = [ledger("GPU-0", 50 * GIB, GIB)];
        let r = rooms(&[gpu(0, GIB + (32 << 20)), gpu(1, 0)], &first);
        assert_eq!(r[0].committed_bytes, 50 * GIB);
        assert_eq!(r[0].used_outside_bytes, 32 << 20, "the driver's own reserve is outside any ledger");
        assert_eq!(choose(&r, |_| 50 * GIB).unwrap().index, 1);
        let both = [ledger("GPU-0", 50 * GIB, GIB), ledger("GPU-1", 50 * GIB, 0)];
        let r = rooms(&devices, &both);
        let err = choose(&r, |_| 50 * GIB).unwrap_err();
        assert!(err.contains("GPU 0 (GPU-0) has 30 GiB left of 80 GiB, needs 50 GiB") && err.contains("GPU 1"), "{err}");
        // A small job still fits on the one with more room.
        assert_eq!(choose(&r, |_| 10 * GIB).unwrap().index, 0);
    }

    #[test]
    fn memory_used_outside_ledgers_counts_and_a_cap_never_counts_past_the_gpu() {
        let r = rooms(&[gpu(0, 70 * GIB), gpu(1, 10 * GIB)], &[ledger("GPU-1", 500 * GIB, 0)]);
        assert_eq!(r[0].left_bytes, 10 * GIB);
        assert_eq!(r[1].committed_bytes, 80 * GIB);
        assert_eq!(r[1].left_bytes, 0);
    }
}
