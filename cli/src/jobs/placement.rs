//! Where a job goes on a machine with several GPUs (`fgpu run --gpus auto`): the GPU with
//! the most room (`crate::observe::rooms`) that fits its cap, the lower index on a tie.
//! Choosing and claiming happen under a placement lock, and `fgpu run` registers the job's
//! cap in the job's ledger before the lock is let go, so the next job counts it.

use crate::driver::probe::ProbedDevice;
use crate::observe::report::{GpuRoom, LedgerReport};
use crate::observe::rooms::own_on;
use fgpu_core::limit::format_bytes;

/// Why no GPU has room for a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    #[error("no GPU is listed by the driver")]
    NoGpu,
    /// Each GPU and what it has left, as `GPU 0 (GPU-...) has 30 GiB left of 80 GiB, needs 50 GiB`.
    #[error("no GPU has room for the job: {}", .0.join("; "))]
    Full(Vec<String>),
}

/// The GPU with the most room that fits `need(gpu)` bytes (the lower index on a tie), or
/// one line naming each GPU and what it has left.
pub fn choose(rooms: &[GpuRoom], need: impl Fn(&GpuRoom) -> u64) -> Result<&GpuRoom, NoRoom> {
    let best = rooms.iter().filter(|r| need(r) <= r.left_bytes).max_by(|a, b| a.left_bytes.cmp(&b.left_bytes).then(b.index.cmp(&a.index)));
    best.ok_or_else(|| {
        if rooms.is_empty() {
            return NoRoom::NoGpu;
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
        NoRoom::Full(each)
    })
}

/// What a job that found no room waits for, GPU by GPU: what it needs and what is left,
/// which of the caller's ledgers commit what (their paths and PIDs), and what the driver
/// says other processes use (their PIDs and memory, as NVML lists them). The job goes
/// when enough of that is let go.
pub fn waiting_for(devices: &[ProbedDevice], rooms: &[GpuRoom], ledgers: &[LedgerReport], need: impl Fn(&GpuRoom) -> u64) -> String {
    let mut out = String::from("waiting for room: ");
    for (i, (d, r)) in devices.iter().zip(rooms).enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out += &format!(
            "GPU {} ({}) needs {}, has {} left of {}",
            r.index,
            r.uuid,
            format_bytes(need(r)),
            format_bytes(r.left_bytes),
            format_bytes(r.total_bytes)
        );
        let own: Vec<String> = own_on(ledgers, &d.uuid)
            .map(|(l, g)| {
                let pids: Vec<String> = l.processes.iter().filter_map(|p| p.pid).map(|p| p.to_string()).collect();
                format!(
                    "{} by {} (PID {})",
                    format_bytes(g.cap_bytes.min(d.total_bytes).max(g.used_bytes)),
                    crate::observe::text::clean(&l.path),
                    pids.join(", ")
                )
            })
            .collect();
        if !own.is_empty() {
            out += &format!(": committed {}", own.join(", "));
        }
        if r.used_outside_bytes > 0 {
            let counted: Vec<u32> = own_on(ledgers, &d.uuid).flat_map(|(l, _)| l.processes.iter().filter_map(|p| p.pid)).collect();
            let mut listed: Vec<&(u32, u64)> = d.compute_processes.iter().filter(|(pid, used)| *used > 0 && !counted.contains(pid)).collect();
            listed.sort_by_key(|(pid, used)| (std::cmp::Reverse(*used), *pid));
            let named: Vec<String> = listed.iter().take(8).map(|(pid, used)| format!("PID {pid} {}", format_bytes(*used))).collect();
            let more = if listed.len() > named.len() { format!(" and {} more", listed.len() - named.len()) } else { String::new() };
            out += &format!("; {} used outside this user's ledgers, as the driver says", format_bytes(r.used_outside_bytes));
            if !named.is_empty() {
                out += &format!(" ({}{more})", named.join(", "));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::report::{DeviceReport, LedgerState};
    use crate::observe::rooms::rooms;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, used: u64) -> ProbedDevice {
        ProbedDevice { index, uuid: format!("GPU-{index}"), name: "x".into(), total_bytes: 80 * GIB, used_bytes: used, ..Default::default() }
    }

    fn ledger(uuid: &str, cap: u64, used: u64) -> LedgerReport {
        let target = crate::observe::ledgers::Target::plain("/l".into(), crate::observe::ledgers::Origin::Scan);
        let mut l = crate::observe::fixtures::empty(&target);
        l.state = LedgerState::Ok;
        l.own = true;
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
        l.processes.push(crate::observe::fixtures::process());
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
        let err = choose(&r, |_| 50 * GIB).unwrap_err().to_string();
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

    /// F3 of the second security review: a tenant capped at 1 GiB wrote an entry claiming
    /// 16 GiB on GPU 1 into its ledger, and root's 12 GiB job went to GPU 0. Another user's
    /// ledger (or one that is not verified) counts as what the driver shows its processes
    /// holding, never by what it claims.
    #[test]
    fn caps_written_in_ledgers_not_ones_own_do_not_steer_placement() {
        let devices = [gpu(0, GIB + (300 << 20)), gpu(1, 0)];
        let mut forged = ledger("GPU-1", 80 * GIB, 0);
        forged.devices.push(forged.devices[0].clone());
        forged.devices[1].uuid = "GPU-0".into();
        forged.devices[1].cap_bytes = 80 * GIB;
        forged.own = false;
        let r = rooms(&devices, std::slice::from_ref(&forged));
        assert_eq!((r[0].committed_bytes, r[1].committed_bytes), (0, 0), "{r:?}");
        assert_eq!(r[0].used_outside_bytes, GIB + (300 << 20), "what the driver shows counts");
        assert_eq!(choose(&r, |_| 12 * GIB).unwrap().index, 1, "the job goes where the memory is");
        let mut unverified = ledger("GPU-1", 80 * GIB, 0);
        unverified.state = LedgerState::Unverified;
        assert_eq!(rooms(&devices, &[unverified])[1].committed_bytes, 0);
        // The caller's own ledger counts with its cap, even before it holds anything.
        let own = ledger("GPU-1", 70 * GIB, 0);
        assert_eq!(choose(&rooms(&devices, &[own]), |_| 12 * GIB).unwrap().index, 0);
    }

    #[test]
    fn the_wait_says_what_holds_the_room() {
        let mut d0 = gpu(0, 10 * GIB);
        d0.compute_processes = vec![(4242, 6 * GIB), (1, GIB)];
        let mut own = ledger("GPU-0", 70 * GIB, GIB);
        own.path = "/tmp/fgpu-run-x/ledger".into();
        let r = rooms(std::slice::from_ref(&d0), std::slice::from_ref(&own));
        let text = waiting_for(&[d0], &r, &[own], |_| 12 * GIB);
        assert!(text.contains("GPU 0 (GPU-0) needs 12 GiB, has 1 GiB left of 80 GiB"), "{text}");
        assert!(text.contains("committed 70 GiB by /tmp/fgpu-run-x/ledger (PID 1)"), "{text}");
        assert!(text.contains("9 GiB used outside this user's ledgers, as the driver says (PID 4242 6 GiB)"), "{text}");
    }
}
