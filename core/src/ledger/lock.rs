//! Byte-range locks on the ledger file: the only cross-process locks fgpu uses, chosen
//! because the kernel releases them when their holder dies, however it dies.
//!
//! * Open-file-description locks (`F_OFD_*`, Linux 3.15+) belong to one `open()`, so two
//!   ledgers opened in one process behave like two processes, and closing some other
//!   descriptor of the file does not drop them.
//! * Classic POSIX locks (`F_SETLK`/`F_GETLK`) are used only for their one extra property:
//!   `F_GETLK` reports the holder's PID translated into the asker's PID namespace
//!   (0 when the holder is not visible there).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

fn flock_for(kind: i32, offset: i64) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all-zero bytes are a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset;
    lock.l_len = 1;
    lock
}

fn fcntl_lock(fd: BorrowedFd<'_>, cmd: i32, lock: &mut libc::flock) -> io::Result<()> {
    loop {
        // SAFETY: models fcntl(2) with a lock command; `lock` is a valid, exclusively
        // borrowed flock and `fd` is open for the duration of the borrow.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, lock as *mut libc::flock) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Takes a write OFD lock on one byte. `Ok(false)` if someone else holds it and `wait` is false.
pub fn ofd_lock(fd: BorrowedFd<'_>, offset: i64, wait: bool) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    match fcntl_lock(fd, cmd, &mut lock) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes a read OFD lock on one byte without waiting; `Ok(false)` if someone holds a write
/// lock on it. Needs only a descriptor open for reading: observers of a ledger use it to
/// show that a slot's owner is gone (its write lock was dropped) and to keep any member
/// from claiming the slot while they clear it.
pub fn ofd_read_lock(fd: BorrowedFd<'_>, offset: i64) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_RDLCK, offset);
    match fcntl_lock(fd, libc::F_OFD_SETLK, &mut lock) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes a write OFD lock on one byte, waiting at most [`LOCK_WAIT`]. The locks guard
/// short critical sections; one held longer belongs to a process that is stuck or hostile,
/// and waiting for it forever would hang the host program in a driver call.
pub fn ofd_lock_timed(fd: BorrowedFd<'_>, offset: i64) -> io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        if ofd_lock(fd, offset, false)? {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("a lock of the ledger was held for over {} s", LOCK_WAIT.as_secs())));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(2));
    }
}

/// How long [`ofd_lock_timed`] waits.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub fn ofd_unlock(fd: BorrowedFd<'_>, offset: i64) {
    let mut lock = flock_for(libc::F_UNLCK, offset);
    let _ = fcntl_lock(fd, libc::F_OFD_SETLK, &mut lock);
}

/// Whether another open file description holds a lock on the byte.
pub fn ofd_held_by_other(fd: BorrowedFd<'_>, offset: i64) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut lock)?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// The lock another open file description holds on the byte, if any: its start and length
/// (0: to the end of the file).
pub fn ofd_conflict(fd: BorrowedFd<'_>, offset: i64) -> io::Result<Option<(i64, i64)>> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut lock)?;
    Ok((lock.l_type != libc::F_UNLCK as libc::c_short).then_some((lock.l_start, lock.l_len)))
}

/// Whether another open file description holds a lock on any byte of `[offset, offset+len)`.
pub fn ofd_any_held(fd: BorrowedFd<'_>, offset: i64, len: i64) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    lock.l_len = len;
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut lock)?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// Takes a classic POSIX write lock on one byte, not waiting.
pub fn posix_lock(fd: BorrowedFd<'_>, offset: i64) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    match fcntl_lock(fd, libc::F_SETLK, &mut lock) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes a classic POSIX read lock on one byte, not waiting: `/proc/locks` shows its
/// holder's PID (an OFD lock shows none). Dropped when the process closes any descriptor of
/// the file, so it is only ever a second lock beside an OFD one.
pub fn posix_read_lock(fd: BorrowedFd<'_>, offset: i64) -> io::Result<bool> {
    let mut lock = flock_for(libc::F_RDLCK, offset);
    match fcntl_lock(fd, libc::F_SETLK, &mut lock) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Drops this process's classic POSIX lock on one byte.
pub fn posix_unlock(fd: BorrowedFd<'_>, offset: i64) {
    let mut lock = flock_for(libc::F_UNLCK, offset);
    let _ = fcntl_lock(fd, libc::F_SETLK, &mut lock);
}

/// PID, in the caller's PID namespace, of the process holding a classic lock on the byte;
/// `None` if nobody holds it or the holder is not visible from here.
pub fn posix_holder(fd: BorrowedFd<'_>, offset: i64) -> Option<u32> {
    let mut lock = flock_for(libc::F_WRLCK, offset);
    fcntl_lock(fd, libc::F_GETLK, &mut lock).ok()?;
    (lock.l_type != libc::F_UNLCK as libc::c_short && lock.l_pid > 0).then_some(lock.l_pid as u32)
}
