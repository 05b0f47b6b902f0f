//! Where a new GPU instance goes: the rule, computed in this one place over what the driver
//! says of each GPU (its profiles, their placements, and the instances there), so that
//! `fgpu mig create` and `fgpu run --mig` choose alike and the rule is unit-tested without
//! a driver.
//!
//! **The rule.** A GPU's *room* is, summed over its profiles, how many more instances of
//! each profile it could still take one at a time (its free placements, those that overlap
//! no instance's memory slices, at most its instance count less the instances of it there),
//! each weighed by the memory slices one instance spans: losing the one 7g placement weighs
//! 8, losing a 1g placement 1. Among every free placement of the asked profile on every GPU
//! in MIG mode, fgpu takes the one that costs the least room (room before less room after),
//! then the lower GPU index, then the lower first slice. An instance thus goes where it
//! blocks the least of what larger instances would need: beside instances already there
//! rather than on an empty GPU (which keeps whole GPUs for whole-GPU profiles), and at the
//! end of a GPU rather than the start. NVIDIA documents no rule for its own choice without
//! a placement; this one is fgpu's.

/// One GPU instance profile of a GPU: its ID, how many instances of it the GPU can hold,
/// and its placements (first memory slice, slice count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub id: u32,
    pub instance_count: u32,
    pub placements: Vec<(u32, u32)>,
}

/// A GPU as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLayout {
    pub index: u32,
    pub shapes: Vec<Shape>,
    /// The instances there: (profile ID, first slice, slice count).
    pub taken: Vec<(u32, u32, u32)>,
}

fn mask(start: u32, size: u32) -> u32 {
    (((1u64 << size) - 1) << start) as u32
}

impl GpuLayout {
    fn occupied(&self) -> u32 {
        self.taken.iter().fold(0, |m, &(_, s, n)| m | mask(s, n))
    }

    /// The placements of profile `id` that overlap no instance.
    pub fn free(&self, id: u32) -> Vec<(u32, u32)> {
        let occupied = self.occupied();
        let Some(shape) = self.shapes.iter().find(|s| s.id == id) else { return Vec::new() };
        let existing = self.taken.iter().filter(|t| t.0 == id).count() as u32;
        if existing >= shape.instance_count {
            return Vec::new();
        }
        shape.placements.iter().copied().filter(|&(s, n)| occupied & mask(s, n) == 0).collect()
    }

    /// How many more instances of profile `id` fit, one at a time: the free placements
    /// (each profile's placements are disjoint), at most what its instance count allows.
    pub fn fits(&self, id: u32) -> u32 {
        let Some(shape) = self.shapes.iter().find(|s| s.id == id) else { return 0 };
        let existing = self.taken.iter().filter(|t| t.0 == id).count() as u32;
        (self.free(id).len() as u32).min(shape.instance_count.saturating_sub(existing))
    }

    /// The rule's room: [`GpuLayout::fits`] times the memory slices of one instance,
    /// summed over the profiles.
    pub fn room(&self) -> u32 {
        self.shapes.iter().map(|s| self.fits(s.id) * s.placements.first().map_or(0, |p| p.1)).sum()
    }

    /// This layout with one more instance.
    pub fn with(&self, id: u32, placement: (u32, u32)) -> GpuLayout {
        let mut next = self.clone();
        next.taken.push((id, placement.0, placement.1));
        next
    }
}

/// A choice: the GPU (its index) and the placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub gpu: u32,
    pub placement: (u32, u32),
    /// The room it costs.
    pub cost: u32,
}

/// Every free placement of profile `id` (as each GPU numbers it: `ids` maps a GPU index to
/// the profile's ID there, `None` where the GPU lacks it), best first by the rule.
pub fn candidates(gpus: &[GpuLayout], ids: impl Fn(u32) -> Option<u32>) -> Vec<(Choice, u32)> {
    let mut out = Vec::new();
    for gpu in gpus {
        let Some(id) = ids(gpu.index) else { continue };
        let before = gpu.room();
        for placement in gpu.free(id) {
            let cost = before - gpu.with(id, placement).room();
            out.push((Choice { gpu: gpu.index, placement, cost }, id));
        }
    }
    out.sort_by_key(|(c, _)| (c.cost, c.gpu, c.placement.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100 80GB's profiles as the MIG user guide's `nvidia-smi mig -lgipp` prints them
    /// (ID: placements {starts}:slices, instance count).
    pub(crate) fn h100() -> Vec<Shape> {
        let shape = |id, starts: &[u32], size, count| Shape { id, instance_count: count, placements: starts.iter().map(|&s| (s, size)).collect() };
        vec![
            shape(19, &[0, 1, 2, 3, 4, 5, 6], 1, 7),
            shape(20, &[0, 1, 2, 3, 4, 5, 6], 1, 1),
            shape(15, &[0, 2, 4, 6], 2, 4),
            shape(14, &[0, 2, 4], 2, 3),
            shape(9, &[0, 4], 4, 2),
            shape(5, &[0], 4, 1),
            shape(0, &[0], 8, 1),
        ]
    }

    fn gpu(index: u32) -> GpuLayout {
        GpuLayout { index, shapes: h100(), taken: Vec::new() }
    }

    fn best(gpus: &[GpuLayout], id: u32) -> Choice {
        candidates(gpus, |_| Some(id))[0].0
    }

    #[test]
    fn an_empty_gpu_has_all_its_room_and_a_7g_takes_it_all() {
        let g = gpu(0);
        assert_eq!(g.room(), 7 + 1 + 4 * 2 + 3 * 2 + 2 * 4 + 4 + 8);
        assert_eq!(g.with(0, (0, 8)).room(), 0);
        assert_eq!(g.fits(19), 7);
    }

    /// A 1g goes to the end of the GPU (slice 6, which no 2-slice profile but the 1g.20gb
    /// uses), not the start; a 3g beside it on the other half.
    #[test]
    fn small_instances_go_where_they_block_least() {
        let g = gpu(0);
        let first = best(std::slice::from_ref(&g), 19);
        assert_eq!(first.placement, (6, 1), "{first:?}");
        let g = g.with(19, first.placement);
        assert_eq!(best(std::slice::from_ref(&g), 9).placement, (0, 4));
    }

    /// A second small instance joins the GPU that has one rather than break a whole GPU.
    #[test]
    fn a_used_gpu_is_filled_before_an_empty_one() {
        let gpus = [gpu(0), gpu(1).with(19, (6, 1))];
        let c = best(&gpus, 19);
        assert_eq!(c.gpu, 1, "{c:?}");
        // Also beside a 3g on the other half.
        let gpus = [gpu(0).with(9, (4, 4)), gpu(1)];
        let c = best(&gpus, 19);
        assert_eq!(c.gpu, 0, "{c:?}");
        let gpus = [gpu(0), gpu(1).with(19, (6, 1))];
        let c = best(&gpus, 19);
        assert_eq!(c.gpu, 1, "{c:?}");
        assert!(c.placement.0 >= 4, "on the half the first one took: {c:?}");
        // A whole GPU only fits where nothing is.
        assert_eq!(best(&gpus, 0).gpu, 0);
        assert!(candidates(&[gpu(0).with(19, (0, 1))], |_| Some(0)).is_empty());
    }

    /// One step of the fragmentation figure: create a profile (by the chooser) or destroy
    /// the n-th instance created.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Create(u32),
        Destroy(usize),
    }

    /// Runs `steps` on an empty H100, placing each creation with `choose`; `None` when one
    /// does not fit. Returns the layout at the end.
    /// Where a chooser puts a profile on a GPU.
    type Chooser<'a> = &'a dyn Fn(&GpuLayout, u32) -> Option<(u32, u32)>;

    fn replay(steps: &[Step], choose: Chooser<'_>) -> Option<GpuLayout> {
        let mut g = gpu(0);
        let mut made: Vec<(u32, u32, u32)> = Vec::new();
        for step in steps {
            match *step {
                Step::Create(id) => {
                    let p = choose(&g, id)?;
                    g = g.with(id, p);
                    made.push((id, p.0, p.1));
                }
                Step::Destroy(n) => {
                    let gone = made[n];
                    g.taken.retain(|t| *t != gone);
                }
            }
        }
        Some(g)
    }

    /// The most 1g instances that fit at the end over every way of placing the creations
    /// (exhaustive search).
    fn best_possible(g: &GpuLayout, made: &[(u32, u32, u32)], steps: &[Step]) -> Option<u32> {
        let Some((step, rest)) = steps.split_first() else { return Some(g.fits(19)) };
        match *step {
            Step::Create(id) => g
                .free(id)
                .into_iter()
                .filter_map(|p| {
                    let mut m = made.to_vec();
                    m.push((id, p.0, p.1));
                    best_possible(&g.with(id, p), &m, rest)
                })
                .max(),
            Step::Destroy(n) => {
                let mut next = g.clone();
                next.taken.retain(|t| *t != made[n]);
                best_possible(&next, made, rest)
            }
        }
    }

    /// The most 1g.10gb that fit beside `survivors` (profile IDs) placed as well as they
    /// can be: exhaustive search over every placement of each.
    fn best_arrangement(g: &GpuLayout, survivors: &[u32]) -> Option<u32> {
        let Some((&id, rest)) = survivors.split_first() else { return Some(g.fits(19)) };
        g.free(id).into_iter().filter_map(|p| best_arrangement(&g.with(id, p), rest)).max()
    }

    /// The closing note's fragmentation figure, on one H100 80GB: seven 1g.10gb created,
    /// the 2nd, 4th and 6th destroyed, then a 2g.20gb asked; then how many 1g.10gb still
    /// fit, under fgpu's rule and under the first free placement (the lowest slice), against
    /// the best arrangement of the same instances (exhaustive search). `None`: a creation
    /// found no room.
    #[test]
    fn fragmentation_figure() {
        use Step::*;
        let steps = [Create(19), Create(19), Create(19), Create(19), Create(19), Create(19), Destroy(1), Destroy(3), Destroy(5), Create(14)];
        let rule = replay(&steps, &|g, id| candidates(std::slice::from_ref(g), |_| Some(id)).first().map(|(c, _)| c.placement));
        let first_fit = replay(&steps, &|g, id| g.free(id).first().copied());
        let best = best_possible(&gpu(0), &[], &steps);
        let arranged = best_arrangement(&gpu(0), &[19, 19, 19, 14]);
        println!(
            "fragmentation (H100 80GB, {steps:?}): 1g.10gb that still fit: fgpu's rule {:?} (layout {:?}), first free placement {:?}, best placement of the sequence {best:?}, best arrangement of the survivors {arranged:?}",
            rule.as_ref().map(|g| g.fits(19)),
            rule.as_ref().map(|g| &g.taken),
            first_fit.as_ref().map(|g| g.fits(19)),
        );
        assert_eq!(rule.map(|g| g.fits(19)), best, "the rule matches the search here");
        assert_eq!(first_fit.map(|g| g.fits(19)), None, "first fit leaves no room for the 2g");
        assert_eq!(arranged, best);
    }
}
