//! File-system calls std has no safe form of: `access(2)`, `flock(2)`, `mkdtemp(3)`,
//! `mkfifo(3)`.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `access(2)` with `mode` (`libc::R_OK`, `W_OK`, `X_OK`, or'ed), for the real user.
pub fn access(path: &Path, mode: i32) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: models access(2) with a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How [`flock`] takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlockWait {
    /// `LOCK_EX`: waits until it is free.
    Wait,
    /// `LOCK_EX | LOCK_NB`: fails with `EWOULDBLOCK` if another holds it.
    NoWait,
}

/// `flock(2)`: an exclusive lock on the open file `fd`, which the kernel drops when the
/// last descriptor of that open file closes (its holder's death included).
pub fn flock(fd: BorrowedFd<'_>, wait: FlockWait) -> io::Result<()> {
    let operation = match wait {
        FlockWait::Wait => libc::LOCK_EX,
        FlockWait::NoWait => libc::LOCK_EX | libc::LOCK_NB,
    };
    // SAFETY: models flock(2) on a descriptor the caller keeps open.
    if unsafe { libc::flock(fd.as_raw_fd(), operation) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mkdtemp(3)`: makes a new directory (mode 0700) from `template`, whose name ends in
/// `XXXXXX`, and returns its path.
pub fn mkdtemp(template: &Path) -> io::Result<PathBuf> {
    let mut bytes = c_path(template)?.into_bytes_with_nul();
    // SAFETY: models mkdtemp(3), which rewrites the trailing XXXXXX of a writable,
    // NUL-terminated buffer in place.
    if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    bytes.pop();
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// `mkfifo(3)` of `path` with `mode`.
pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: models mkfifo(3) with a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_directory_a_fifo_and_a_lock() {
        let dir = mkdtemp(&std::env::temp_dir().join("fgpu-sys-files-XXXXXX")).unwrap();
        assert!(dir.is_dir() && !dir.to_string_lossy().ends_with("XXXXXX"), "{}", dir.display());
        assert!(access(&dir, libc::W_OK | libc::X_OK).is_ok());
        let fifo = dir.join("fifo");
        mkfifo(&fifo, 0o600).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        let file = std::fs::File::create(dir.join("lock")).unwrap();
        use std::os::fd::AsFd;
        flock(file.as_fd(), FlockWait::NoWait).unwrap();
        let other = std::fs::File::open(dir.join("lock")).unwrap();
        assert!(flock(other.as_fd(), FlockWait::NoWait).is_err(), "a second open file cannot take it");
        drop(file);
        flock(other.as_fd(), FlockWait::NoWait).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(access(&dir, libc::F_OK).is_err());
    }
}
