//! Sealed memory files (`memfd_create(2)`, seals, shared mappings of them) and other
//! processes' descriptors (`pidfd_open(2)`, `pidfd_getfd(2)`): a served ledger's data
//! (`ledger/memfd.rs`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// `memfd_create(2)` with `MFD_CLOEXEC | MFD_ALLOW_SEALING`: a file in memory that no path
/// names, whose size can be sealed.
pub fn memfd_create(name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: models memfd_create(2) (the system call: glibc 2.17, which release builds
    // target, has no wrapper) with a NUL-terminated name; the result is checked before it
    // is owned.
    let fd = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `fcntl(F_ADD_SEALS)`.
pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: models fcntl(2) F_ADD_SEALS, which takes an int.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fcntl(F_GET_SEALS)`: `EINVAL` for a file that is not a memfd (no file system is asked:
/// the kernel answers from the open file itself).
pub fn get_seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: models fcntl(2) F_GET_SEALS, which takes no argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(seals)
}

/// `mmap(2)` of the first `len` bytes of `fd`, shared, read-write or read-only, at an
/// address the kernel chooses.
pub fn mmap_shared(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<NonNull<u8>> {
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    // SAFETY: models mmap(2) of a file at a kernel-chosen address: nothing existing is
    // replaced, and the result is checked.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned a null address"))
}

/// `munmap(2)`.
///
/// # Safety
/// `base` and `len` are a mapping [`mmap_shared`] returned, not unmapped yet, and no
/// reference into it is used afterwards.
pub unsafe fn munmap(base: NonNull<u8>, len: usize) {
    // SAFETY: models munmap(2) of a mapping mmap returned (the caller's contract).
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
}

/// `pidfd_open(2)`: a descriptor that stays this very process (`ESRCH` if it is gone;
/// `ENOSYS` before Linux 5.3). `pid` is in this process's PID namespace.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: models pidfd_open(2), which takes a PID and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `pidfd_getfd(2)`: a duplicate, in this process, of descriptor `target` of the process
/// `pidfd` names (the same open file: nothing is opened, no file system is asked). Needs
/// the right to ptrace that process (`EPERM`); `ENOSYS` before Linux 5.6.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: i32) -> io::Result<OwnedFd> {
    // SAFETY: models pidfd_getfd(2) with an open pidfd, a descriptor number and no flags;
    // the result is checked. The kernel sets O_CLOEXEC on the new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
