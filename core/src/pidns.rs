//! Which PID namespace a process is in, and its host PID where the kernel lets it know.
//!
//! No probe: a process in the host namespace knows its host PID from `getpid()`; a process
//! in a nested namespace usually cannot learn it at all. The ledger does not need it for
//! accounting (liveness comes from file locks), and a process in the host namespace that
//! looks at the ledger fills host PIDs in for the others (see `ledger::Ledger::snapshot`).

/// Inode number of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel, fixed ABI).
pub const INIT_PIDNS_INODE: u64 = 0xEFFF_FFFC;

/// Inode of the PID namespace of the calling process, 0 if /proc is unavailable.
pub fn own_pidns() -> u64 {
    pidns_of("/proc/self/ns/pid")
}

fn pidns_of(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// True when the caller is in the host's (initial) PID namespace.
pub fn in_host_pidns() -> bool {
    own_pidns() == INIT_PIDNS_INODE
}

/// Inode number of the initial user namespace (`PROC_USER_INIT_INO`, fixed ABI).
pub const INIT_USERNS_INODE: u64 = 0xEFFF_FFFD;

/// True when the caller is in the initial user namespace, where uid 0 is the host's root.
/// In any other (a rootless container, `unshare --user --map-root-user`) the uid a peer
/// shows as may belong to anyone outside; false too when /proc cannot tell.
pub fn in_initial_userns() -> bool {
    pidns_of("/proc/self/ns/user") == INIT_USERNS_INODE
}

/// The caller's PID in the host PID namespace, if it can be known without help.
pub fn host_pid() -> Option<u32> {
    if in_host_pidns() {
        return Some(std::process::id());
    }
    // A nested namespace whose /proc is still the host's (unshare --pid without --mount-proc):
    // the first NSpid field is the PID in the namespace of that procfs.
    if pidns_of("/proc/1/ns/pid") != INIT_PIDNS_INODE {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_first_nspid(&status)
}

fn parse_first_nspid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..].split_whitespace().next()?.parse().ok()
}

/// The calling thread's command name (at most 15 bytes), without touching the filesystem.
pub fn comm() -> [u8; 16] {
    crate::sys::thread_name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_first_field() {
        let status = "Name:\tx\nNSpid:\t4242\t17\t1\nTgid:\t1\n";
        assert_eq!(parse_first_nspid(status), Some(4242));
        assert_eq!(parse_first_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn the_initial_user_namespace_is_recognised() {
        // The test runs in some user namespace; /proc/1 (when it is ours) is in the same one
        // unless the test runs in a container of its own.
        if pidns_of("/proc/1/ns/user") == INIT_USERNS_INODE && pidns_of("/proc/self/ns/user") == pidns_of("/proc/1/ns/user") {
            assert!(in_initial_userns());
        }
        assert_ne!(pidns_of("/proc/self/ns/user"), 0);
    }

    #[test]
    fn own_namespace_is_readable() {
        assert_ne!(own_pidns(), 0);
        if in_host_pidns() {
            assert_eq!(host_pid(), Some(std::process::id()));
        }
    }
}
