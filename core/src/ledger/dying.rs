//! Processes that died while the driver may still hold their memory.
//!
//! A process's slot is known dead when the kernel drops its liveness lock, which happens
//! as its descriptors are closed at exit. The driver frees the process's GPU memory when
//! *its* descriptors (`/dev/nvidia*`) are closed, which may come after the ledger's (they
//! are closed in order of their numbers), takes time for large allocations, and can be
//! deferred further (NVIDIA's kernel module defers a close that cannot take its power
//! management lock; UVM defers releases to a queue). Handing a dead process's bytes to
//! others at once could grant memory the driver still holds, and the device would hold
//! more than the cap.
//!
//! So a dead slot that holds bytes is kept, its bytes counted against the cap, while:
//!
//! * the process still exists and is not a zombie (it is still closing its descriptors:
//!   [`still_exiting`]), seen in the caller's PID namespace, or through its host PID from
//!   the host's; a zombie has closed them all, and a PID now held by a process that started
//!   after the slot was claimed is another process;
//! * or the driver still lists it (the shim asks NVML: `Ledger::set_still_held`).
//!
//! Such a slot is "dying" (`Slot::dying_since_ns`). Its bytes go back at the first look
//! after both say it is gone. A request that does not fit meanwhile waits for it a little
//! (`Ledger::reserve`), then is refused: it is never granted into memory the driver may
//! still hold.

use crate::pidns;

/// What is known of a dead slot's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadProcess {
    /// PID in its own PID namespace.
    pub pid: u32,
    /// PID in the host's, 0 if never learnt.
    pub host_pid: u32,
    /// Inode of its PID namespace.
    pub pidns: u64,
    /// When it joined the ledger (Unix ms): a process with its PID that started later is
    /// another one.
    pub joined_unix_ms: u64,
}

impl DeadProcess {
    /// Its PID as the caller's PID namespace sees it, where that can be known.
    pub fn pid_here(&self) -> Option<u32> {
        if self.pidns == pidns::own_pidns() {
            Some(self.pid)
        } else if self.host_pid != 0 && pidns::in_host_pidns() {
            Some(self.host_pid)
        } else {
            None
        }
    }
}

/// Whether the dead slot's process still exists and is not yet a zombie: it is still in
/// `exit`, closing its descriptors, the driver's among them.
pub fn still_exiting(dead: &DeadProcess) -> bool {
    let Some(pid) = dead.pid_here() else { return false };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some((state, start_ticks)) = parse_stat(&stat) else { return false };
    if matches!(state, 'Z' | 'X' | 'x') {
        return false;
    }
    match boot_unix_ms() {
        // A PID now used by a process that started after the slot was claimed: not it.
        Some(boot) => boot + start_ticks * 1000 / crate::sys::clock_ticks_per_second() <= dead.joined_unix_ms + 1000,
        None => true,
    }
}

/// Whether a process the ledger knows only by its PID (a slot whose liveness is its
/// process's: `LIVENESS_PROCESS`) still runs. Where this namespace cannot see it, it counts
/// as running: never drop accounting on doubt.
pub fn process_alive(owner: &DeadProcess) -> bool {
    if owner.pid_here().is_none() {
        return true;
    }
    still_exiting(owner)
}

/// The state letter and start time (clock ticks after boot) of a `/proc/PID/stat` line.
/// The command name (field 2) may hold spaces and parentheses: fields are counted after
/// its last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 (starttime); `rest` starts at field 3.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// When the machine booted, in Unix ms (`btime` of `/proc/stat`).
fn boot_unix_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    Some(line["btime ".len()..].trim().parse::<u64>().ok()? * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_awkward_names() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (x) Z 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 5"), Some(('Z', 5)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_running_process_is_still_exiting_a_reaped_one_is_not() {
        let joined = super::super::store::unix_now_ms() as u64;
        let me = DeadProcess { pid: std::process::id(), host_pid: 0, pidns: pidns::own_pidns(), joined_unix_ms: joined };
        assert!(still_exiting(&me), "a live process counts as not done");
        // A process that started after the slot was claimed holds the PID now: not it.
        let earlier = DeadProcess { joined_unix_ms: 1_000, ..me };
        assert!(!still_exiting(&earlier));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // A zombie: it has closed every descriptor.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!still_exiting(&DeadProcess { pid, ..me }), "a zombie has closed its descriptors");
        child.wait().unwrap();
        assert!(!still_exiting(&DeadProcess { pid, ..me }), "a reaped process is gone");
        // Another PID namespace, no host PID known: nothing to look at.
        assert!(!still_exiting(&DeadProcess { pidns: 1, ..me }));
    }
}
