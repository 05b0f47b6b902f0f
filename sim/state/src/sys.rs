//! The system calls the state file needs (paths, `fcntl` locks, randomness) and who the
//! calling process is: its pid, PID namespace, host pid and owner key.

use crate::layout::PROC_PID_INIT_INO;
use crate::timeline::{self, now_ns};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;

pub(crate) fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

pub(crate) fn flock(fd: i32, cmd: i32, ty: i32, off: i64) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = off as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: fd is a descriptor we own and fl is a valid, initialised struct flock.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(fl);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
}

pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Inode of a namespace link such as `/proc/self/ns/pid` (follows the link).
pub(crate) fn ns_inode(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// 64 random bits (`getrandom`), or the clocks and pid mixed where that fails.
pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writing at most 8 bytes into a local u64.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if n == 8 {
        return v;
    }
    splitmix(timeline::realtime_offset_ns() as u64 ^ now_ns().rotate_left(17) ^ ((getpid() as u64) << 32))
}

pub(crate) fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Whether the calling process is in the initial PID namespace.
pub fn in_init_pid_namespace() -> bool {
    ns_inode("/proc/self/ns/pid") == Some(PROC_PID_INIT_INO)
}

/// The calling process's pid in the initial PID namespace, where it can know it: its own
/// namespace is the initial one, or `/proc` belongs to the initial namespace and
/// `/proc/self/status` lists `NSpid`. Otherwise 0.
pub fn own_host_pid() -> u32 {
    let pid = getpid();
    if in_init_pid_namespace() {
        return pid;
    }
    if ns_inode("/proc/1/ns/pid") == Some(PROC_PID_INIT_INO) {
        if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
            for line in s.lines() {
                if let Some(rest) = line.strip_prefix("NSpid:") {
                    if let Some(first) = rest.split_whitespace().next() {
                        return first.parse().unwrap_or(0);
                    }
                }
            }
        }
    }
    0
}

/// A key that names this process uniquely on the machine (pid namespace, pid, start
/// time), the same in every copy of this crate loaded into the process.
pub(crate) fn compute_owner_key() -> u64 {
    let pid = getpid() as u64;
    let ns = ns_inode("/proc/self/ns/pid").unwrap_or(0);
    let start = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rfind(')').map(|i| &s[i + 1..])?.to_string();
            // Fields after the command: state is field 3, starttime field 22.
            after.split_whitespace().nth(19).and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let k = splitmix(splitmix(splitmix(pid) ^ ns) ^ start);
    if k == 0 {
        1
    } else {
        k
    }
}

static KEY_CACHE: Mutex<(u32, u64)> = Mutex::new((0, 0));

pub(crate) fn owner_key() -> u64 {
    let pid = getpid();
    let mut g = KEY_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if g.0 != pid || g.1 == 0 {
        *g = (pid, compute_owner_key());
    }
    g.1
}

pub(crate) fn tag_of(key: u64) -> u32 {
    (key as u32) | 1
}
