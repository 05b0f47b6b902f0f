//! Where a GPU instance goes and what it is called: GPU instance IDs from placements, and
//! the placement chosen when the caller names none.

use super::profiles::{GiProfile, MEMORY_SLICES};

/// The GPU instance ID of the instance at `start` spanning `size` memory slices: the
/// driver's partition ("swizz") ID, 0 for the whole GPU, 1-2 for the halves, 3-6 for the
/// quarters and 7-14 for the eighths (`kmigmgrSwizzIdToSpan_GA100`, NVIDIA's open GPU
/// kernel modules, `src/nvidia/src/kernel/gpu/mig_mgr/arch/ampere/kmigmgr_ga100.c`). The
/// guide's examples agree (`-cgi 14,19,19,19,19,19` makes instance 5 at 4:2 and 13 at 6:1),
/// as do H100's (instances 7 to 13 at 0:1 to 6:1).
pub fn gi_id(start: u32, size: u32) -> Option<u32> {
    match size {
        8 if start == 0 => Some(0),
        4 if start.is_multiple_of(4) && start < 8 => Some(1 + start / 4),
        2 if start.is_multiple_of(2) && start < 8 => Some(3 + start / 2),
        1 if start < 8 => Some(7 + start),
        _ => None,
    }
}

/// Number of GPU instance IDs (0..=14).
pub const GI_IDS: usize = 15;

/// Bit mask of the memory slices `[start, start + size)`.
pub fn span_mask(start: u32, size: u32) -> u32 {
    (((1u32 << size) - 1) << start) & ((1 << MEMORY_SLICES) - 1)
}

/// How many placements of all `profiles` would still be free with `occupied` taken.
fn free_placements(profiles: &[GiProfile], occupied: u32) -> usize {
    profiles.iter().map(|p| p.placement_starts().iter().filter(|&&s| span_mask(s, p.memory_slices) & occupied == 0).count()).sum()
}

/// The placement the driver picks for a new instance of `profile` when none is requested,
/// with the memory slices in `occupied` taken; `None` when no placement is free.
///
/// NVIDIA does not document the rule. This one (among the free placements, the one after
/// which the most placements of every profile stay free; the lowest start on a tie)
/// reproduces every sequence the published outputs show: the guide's `-cgi 9,3g.20gb`
/// (instances 2 then 1), `-cgi 19,19,14,9` (13, 11, 3, then Insufficient Resources),
/// `-cgi 9,19,14,19` (2, 7, 4, 8) and `-cgi 14,19,19,19,19,19` (5, 13, 7, 8, 9, 10), and
/// an H100's `-cgi 19,19,19,19,19,19,19` (13, 11, 12, 7, 8, 9, 10).
pub fn default_start(profiles: &[GiProfile], profile: &GiProfile, occupied: u32) -> Option<u32> {
    let mut best: Option<(usize, u32)> = None;
    for &s in profile.placement_starts() {
        let span = span_mask(s, profile.memory_slices);
        if span & occupied != 0 {
            continue;
        }
        let left = free_placements(profiles, occupied | span);
        if best.is_none_or(|(b, _)| left > b) {
            best = Some((left, s));
        }
    }
    best.map(|(_, s)| s)
}
