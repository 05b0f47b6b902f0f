//! What one process sees of one device, worked out in one place: the cap its reservations
//! are held to, the memory it is told the device has and has free, and the line that says
//! why it is held below what it asked for. The shim's CUDA answers (`cuMemGetInfo`,
//! `cuDeviceTotalMem`), its NVML answers (`nvmlDeviceGetMemoryInfo`), its device
//! registration and compute shares, and `fgpu doctor` all read it from here.

use crate::compute::format_share;
use crate::limit::format_bytes;
use std::path::Path;

/// One process's view of one device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryView {
    /// What the ledger holds the process's reservations to: the smaller of its own cap and
    /// the ledger's. Never clamped to the device: at the device's own limit the driver's
    /// answer stands (what fits is granted, what does not is refused by the driver).
    pub cap: u64,
    /// The memory the process is told the device has: the cap, but never more than the
    /// device (a cap never makes a GPU look larger than it is).
    pub total: u64,
}

impl MemoryView {
    /// The view of a device of `device` bytes for a process whose own cap there is `own`
    /// (`None`: its configuration names no cap for the device, which is then counted but
    /// not capped: its whole size) under a ledger that keeps `ledger` for it (`None`: the
    /// ledger has no entry for the device yet).
    pub fn new(own: Option<u64>, ledger: Option<u64>, device: u64) -> MemoryView {
        let cap = own.unwrap_or(device).min(ledger.unwrap_or(u64::MAX));
        MemoryView { cap, total: cap.min(device) }
    }

    /// What the process is told is free while the ledger's processes hold `used`: what is
    /// left of [`MemoryView::total`], and never more than the device really has free where
    /// that is given (`device_free`; NVML's answer leaves it out, so that total = used + free).
    pub fn free(&self, used: u64, device_free: Option<u64>) -> u64 {
        let left = self.total.saturating_sub(used);
        device_free.map_or(left, |free| left.min(free))
    }

    /// Whether the cap is larger than the device (the device's own size is shown instead).
    pub fn above_device(&self) -> bool {
        self.cap > self.total
    }
}

/// A limit a process asks for on a device, beside the one its ledger already keeps for
/// the processes running under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// A memory cap in bytes; the ledger's is [`crate::ledger::Registration::ledger_cap`].
    Cap { asked: u64, ledger: u64 },
    /// A compute share in parts per million; 0 for the ledger: it has none yet.
    Share { asked: u64, ledger: u64 },
}

impl Kept {
    /// What the process is held to: the smaller of the two (its own share where the ledger
    /// has none).
    pub fn held_to(self) -> u64 {
        match self {
            Kept::Cap { asked, ledger } => asked.min(ledger),
            Kept::Share { asked, ledger: 0 } => asked,
            Kept::Share { asked, ledger } => asked.min(ledger),
        }
    }

    /// The warning that the ledger keeps its own limit and this process is held to the
    /// smaller one, when the two differ; `None` when they agree (or the ledger has no share).
    pub fn message(self, uuid: &str, ledger_path: &Path) -> Option<String> {
        let (what, asked, ledger, held): (&str, String, String, String) = match self {
            Kept::Cap { asked, ledger } if asked != ledger => ("a cap", format_bytes(asked), format_bytes(ledger), format_bytes(self.held_to())),
            Kept::Share { asked, ledger } if ledger != 0 && asked != ledger => {
                ("a compute share", format_share(asked), format_share(ledger), format_share(self.held_to()))
            }
            _ => return None,
        };
        Some(format!(
            "this process asks for {what} of {asked} on {uuid}, but ledger {} already holds {ledger} for running processes; the ledger keeps {ledger} and this process is held to {held}",
            ledger_path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const GIB: u64 = 1 << 30;

    /// Every combination of a process's cap, the ledger's cap and the device's size (none,
    /// zero, below, equal to and above each other), with the used and free figures around
    /// them: each answer is checked against the rule written out plainly.
    #[test]
    fn every_combination_of_cap_ledger_cap_and_device_size() {
        let sizes = [0, 1, GIB, 2 * GIB, 8 * GIB, 80 * GIB, 200 * GIB, u64::MAX];
        let caps: Vec<Option<u64>> = std::iter::once(None).chain(sizes.iter().copied().map(Some)).collect();
        let mut seen = 0;
        for own in &caps {
            for ledger in &caps {
                for &device in &sizes {
                    let view = MemoryView::new(*own, *ledger, device);
                    let asked = own.unwrap_or(device);
                    let cap = match ledger {
                        Some(l) if *l < asked => *l,
                        _ => asked,
                    };
                    assert_eq!(view.cap, cap, "cap for own {own:?}, ledger {ledger:?}, device {device}");
                    let total = if cap > device { device } else { cap };
                    assert_eq!(view.total, total, "total for own {own:?}, ledger {ledger:?}, device {device}");
                    assert!(view.total <= device && view.total <= view.cap);
                    assert_eq!(view.above_device(), cap > device);
                    for used in [0, 1, GIB, total, total.saturating_add(1), u64::MAX] {
                        let left = total.saturating_sub(used);
                        assert_eq!(view.free(used, None), left, "NVML's free: total - used");
                        for device_free in [0, GIB, device] {
                            let free = view.free(used, Some(device_free));
                            assert_eq!(free, left.min(device_free), "CUDA's free: never more than the device has");
                            assert!(free <= view.total);
                        }
                    }
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, caps.len() * caps.len() * sizes.len());
    }

    #[test]
    fn the_ledger_keeps_its_limit_and_says_so_once_they_differ() {
        let path = Path::new("/run/fgpu/ledger");
        let cap = Kept::Cap { asked: 4 * GIB, ledger: 2 * GIB };
        assert_eq!(cap.held_to(), 2 * GIB);
        assert_eq!(
            cap.message("GPU-1234", path).unwrap(),
            "this process asks for a cap of 4 GiB on GPU-1234, but ledger /run/fgpu/ledger already holds 2 GiB for running processes; the ledger keeps 2 GiB and this process is held to 2 GiB"
        );
        let lower = Kept::Cap { asked: GIB, ledger: 2 * GIB };
        assert_eq!(lower.held_to(), GIB);
        assert!(lower.message("GPU-1234", path).unwrap().ends_with("the ledger keeps 2 GiB and this process is held to 1 GiB"));
        assert_eq!(Kept::Cap { asked: GIB, ledger: GIB }.message("GPU-1234", path), None);

        let share = Kept::Share { asked: 500_000, ledger: 300_000 };
        assert_eq!(share.held_to(), 300_000);
        let line = share.message("GPU-1234", path).unwrap();
        assert!(line.starts_with("this process asks for a compute share of 50%"), "{line}");
        assert!(line.ends_with("the ledger keeps 30% and this process is held to 30%"), "{line}");
        // A ledger without a share yet keeps nothing: the process's own share holds.
        let first = Kept::Share { asked: 500_000, ledger: 0 };
        assert_eq!((first.held_to(), first.message("GPU-1234", path)), (500_000, None));
        assert_eq!(Kept::Share { asked: 500_000, ledger: 500_000 }.message("GPU-1234", path), None);
    }
}
