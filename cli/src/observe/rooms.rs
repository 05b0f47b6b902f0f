//! What each GPU has committed (`fgpu status`, and `fgpu run --gpus auto`'s placement).
//!
//! A GPU's room is its memory less what is committed there: the caps of the caller's own
//! live ledgers on it, and what the driver says is used on it beyond what those ledgers
//! hold (processes fgpu does not cap, other users' and containers' jobs, the driver's own
//! reserve).
//!
//! Only the caller's own ledgers (verified, made and owned by the user who places, in its
//! IPC namespace: [`LedgerReport::own`]) count with their caps. Every other ledger (another
//! user's, a container's, one that is not verified) was written by processes that can
//! write anything into it, a cap of 16 GiB on a GPU they never use included: it counts as
//! the memory the driver shows its processes holding, which is in the GPU's used memory.

use super::report::{DeviceReport, GpuRoom, LedgerReport, LedgerState};
use crate::driver::probe::ProbedDevice;

/// The caller's own live ledgers with a cap on GPU `uuid`, and their entry for it.
pub fn own_on<'a>(ledgers: &'a [LedgerReport], uuid: &'a str) -> impl Iterator<Item = (&'a LedgerReport, &'a DeviceReport)> + 'a {
    ledgers
        .iter()
        .filter(|l| l.own && l.state == LedgerState::Ok && !l.processes.is_empty())
        .flat_map(move |l| l.devices.iter().filter(move |g| g.uuid.eq_ignore_ascii_case(uuid)).map(move |g| (l, g)))
}

/// The room on each GPU the driver lists, from the ledgers seen (a scan of every ledger
/// this user may look at).
pub fn rooms(devices: &[ProbedDevice], ledgers: &[LedgerReport]) -> Vec<GpuRoom> {
    devices
        .iter()
        .map(|d| {
            let (mut committed, mut held, mut count) = (0u64, 0u64, 0usize);
            for (_, g) in own_on(ledgers, &d.uuid) {
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
