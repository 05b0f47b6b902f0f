//! A ledger's data in a sealed memory file (a memfd) instead of a System V segment: the
//! storage of a ledger that processes of several IPC namespaces share (a Kubernetes claim's
//! pods), handed to them by a keeper (`served.rs`).
//!
//! A memfd has no path and no IPC namespace: whoever holds a descriptor of it can map it,
//! and nobody else can reach it. Its size is fixed by seals, set once by its maker:
//!
//! * `F_SEAL_SHRINK`: nobody can truncate it, so no process that maps it can be made to
//!   fault (`SIGBUS`) on it, whatever any process does with its own descriptor;
//! * `F_SEAL_GROW`: nor grow it;
//! * `F_SEAL_SEAL`: nor add a seal (`F_SEAL_FUTURE_WRITE` would stop new processes from
//!   mapping it writable, and so from joining).
//!
//! A process given a descriptor checks those seals and the size before it maps anything.
//!
//! **Told apart without I/O.** Observers (`fgpu status --all`) find such a ledger as a line
//! of `/proc/PID/maps` on the kernel's internal shmem device (the same device as System V
//! segments: `maps.rs`) named `/memfd:fgpu-ledger...`. A name is only what its maker chose,
//! so the memfd itself is then taken from that process with `pidfd_getfd(2)`, which opens
//! nothing and asks no file system; the descriptor taken is checked before anything else is
//! done with it, from `/proc/self/fdinfo` (its mount is the internal one of memfds, its
//! inode the one the maps showed) and its seals (`F_GET_SEALS` answers for a memfd alone),
//! all answered by the kernel from the open file. A file of another kind that a process put
//! at that descriptor number in between is closed on a thread of its own (closing a file of
//! a FUSE mount waits for its server).

use super::layout::SEGMENT_SIZE;
use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The name every ledger memfd is made with (`memfd_create`'s name, then `:` and a label).
pub const NAME: &str = "fgpu-ledger";
/// How `/proc/PID/maps` names a ledger memfd's mapping (then the label, then ` (deleted)`).
pub const MAPS_PREFIX: &str = "/memfd:fgpu-ledger";
/// The seals a ledger memfd carries.
pub const SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// Seals a ledger memfd must not carry: each stops processes from writing it.
const NO_WRITE: i32 = libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE;

/// A new ledger memfd of [`SEGMENT_SIZE`] zero bytes, sealed. `label` goes into its name
/// (`fgpu-ledger:LABEL`, shown in `/proc/PID/maps`).
pub fn create(label: &str) -> io::Result<File> {
    let name: String = format!("{NAME}:{label}").chars().filter(|c| *c != '\0' && *c != '\n').take(240).collect();
    let name = std::ffi::CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the label"))?;
    let file = File::from(sys::memfd_create(&name)?);
    file.set_len(SEGMENT_SIZE as u64)?;
    sys::add_seals(file.as_fd(), SEALS)?;
    Ok(file)
}

/// Why a file is not a ledger memfd that may be mapped.
#[derive(Debug, thiserror::Error)]
pub enum NotALedgerFile {
    #[error("it is not a sealed memory file (memfd)")]
    NotMemfd,
    #[error("its memory file is not sealed against shrinking and growing (seals {0:#x})")]
    Unsealed(i32),
    #[error("its memory file is sealed against writing (seals {0:#x})")]
    WriteSealed(i32),
    #[error("its memory file cannot be looked at: {0}")]
    Stat(io::Error),
    #[error("its memory file holds {0} bytes, not a ledger's {SEGMENT_SIZE}")]
    Size(i64),
}

/// Whether `file` is a ledger memfd that may be mapped: a memfd sealed against shrinking,
/// growing and new seals, not against writing, of exactly [`SEGMENT_SIZE`] bytes.
pub fn check(file: &File) -> Result<(), NotALedgerFile> {
    let seals = sys::get_seals(file.as_fd()).map_err(|_| NotALedgerFile::NotMemfd)?;
    if seals & SEALS != SEALS {
        return Err(NotALedgerFile::Unsealed(seals));
    }
    if seals & NO_WRITE != 0 {
        return Err(NotALedgerFile::WriteSealed(seals));
    }
    // A memfd (the seals say so): its size is the kernel's, asked of no file system.
    let size = sys::fstat(file.as_fd()).map_err(NotALedgerFile::Stat)?.st_size;
    if size != SEGMENT_SIZE as i64 {
        return Err(NotALedgerFile::Size(size));
    }
    Ok(())
}

/// Maps a checked ledger memfd (read-write for a member or a verified observer).
pub fn map(file: &File, writable: bool) -> io::Result<NonNull<u8>> {
    sys::mmap_shared(file.as_fd(), SEGMENT_SIZE, writable)
}

/// Unmaps what [`map`] mapped.
///
/// # Safety
/// `base` came from [`map`], is not unmapped yet, and nothing refers into it afterwards.
pub unsafe fn unmap(base: NonNull<u8>) {
    // SAFETY: the caller's contract; SEGMENT_SIZE is what `map` mapped.
    unsafe { sys::munmap(base, SEGMENT_SIZE) };
}

/// The `mnt_id` and `ino` fields of a `/proc/PID/fdinfo/N` file.
pub fn fdinfo_fields(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok());
    (field("mnt_id:"), field("ino:"))
}

/// The mount `/proc/PID/fdinfo` gives memfds (the kernel's internal shmem mount; no mount
/// a user makes has it): learnt once from a memfd this process makes itself.
pub fn memfd_mount_id() -> Option<u64> {
    static ID: OnceLock<Option<u64>> = OnceLock::new();
    *ID.get_or_init(|| {
        let probe = sys::memfd_create(c"fgpu-probe").ok()?;
        fdinfo_fields(&std::fs::read_to_string(format!("/proc/self/fdinfo/{}", probe.as_raw_fd())).ok()?).0
    })
}

/// What `/proc/self/fdinfo` says of one of this process's descriptors: (mount, inode).
fn own_fdinfo(fd: &OwnedFd) -> (Option<u64>, Option<u64>) {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).map(|t| fdinfo_fields(&t)).unwrap_or((None, None))
}

/// Closes a descriptor taken from another process that is not what was looked for, on a
/// thread of its own: closing a file of a FUSE mount sends its server a flush and waits.
fn dispose(fd: OwnedFd) {
    let raw = fd.into_raw_fd();
    // No thread to be had: the descriptor stays open rather than wait on a tenant's file system.
    let _ = std::thread::Builder::new().name("fgpu-dispose".into()).spawn(move || {
        // SAFETY: `raw` was an OwnedFd's, given up above and handed to this thread alone.
        drop(unsafe { OwnedFd::from_raw_fd(raw) })
    });
}

/// The ledger memfds the process `pid` (in this PID namespace; `proc_root` is this
/// process's `/proc`) holds open, taken with `pidfd_getfd(2)`: descriptors whose fdinfo
/// shows the memfd mount and, when `ino` is given, that inode, each checked again once
/// taken (the process may have changed the descriptor meanwhile), sealed, and accepted by
/// `accept`. Nothing is opened, and no file system asked. Needs the right to ptrace `pid`.
pub fn take_from_process(proc_root: &Path, pid: u32, ino: Option<u64>, accept: &dyn Fn(&File) -> bool) -> io::Result<Option<File>> {
    let mount = memfd_mount_id().ok_or_else(|| io::Error::other("this kernel shows no mount for memory files"))?;
    let pidfd = sys::pidfd_open(pid)?;
    let dir = proc_root.join(pid.to_string()).join("fdinfo");
    let mut denied = None;
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let Some(number) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        let (mnt, found_ino) = fdinfo_fields(&text);
        if mnt != Some(mount) || ino.is_some_and(|want| found_ino != Some(want)) {
            continue;
        }
        let fd = match sys::pidfd_getfd(pidfd.as_fd(), number) {
            Ok(fd) => fd,
            Err(e) => {
                denied.get_or_insert(e);
                continue;
            }
        };
        let (mnt_now, ino_now) = own_fdinfo(&fd);
        if mnt_now != Some(mount) || ino.is_some_and(|want| ino_now != Some(want)) || sys::get_seals(fd.as_fd()).is_err() {
            dispose(fd);
            continue;
        }
        let file = File::from(fd);
        if check(&file).is_ok() && accept(&file) {
            return Ok(Some(file));
        }
    }
    match denied {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn a_ledger_memfd_can_be_neither_shrunk_nor_grown_nor_sealed_further() {
        let file = create("test").unwrap();
        check(&file).unwrap();
        assert_eq!(file.metadata().unwrap().len(), SEGMENT_SIZE as u64);
        let base = map(&file, true).unwrap();
        for len in [0, SEGMENT_SIZE as u64 - 1, SEGMENT_SIZE as u64 + 4096] {
            let e = file.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "truncating to {len}: {e}");
        }
        assert!(file.write_at(b"x", SEGMENT_SIZE as u64).is_err(), "a write past its end grew it");
        let e = sys::add_seals(file.as_fd(), libc::F_SEAL_FUTURE_WRITE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        // Reopened through /proc (a new open file of the same inode): the same seals.
        let again = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        assert!(again.set_len(0).is_err());
        check(&again).unwrap();
        // The mapping is whole and writable.
        // SAFETY: `base` maps SEGMENT_SIZE bytes, read-write; nothing else refers to them.
        unsafe { base.as_ptr().add(SEGMENT_SIZE - 1).write(7) };
        let mut last = [0u8];
        file.read_exact_at(&mut last, SEGMENT_SIZE as u64 - 1).unwrap();
        assert_eq!(last, [7]);
        // SAFETY: mapped above, unmapped once.
        unsafe { unmap(base) };
    }

    #[test]
    fn files_that_are_not_sealed_ledgers_are_refused() {
        let plain = File::from(sys::memfd_create(c"fgpu-ledger:forged").unwrap());
        plain.set_len(SEGMENT_SIZE as u64).unwrap();
        assert!(check(&plain).unwrap_err().to_string().contains("not sealed"));
        let small = File::from(sys::memfd_create(c"fgpu-ledger:small").unwrap());
        small.set_len(4096).unwrap();
        sys::add_seals(small.as_fd(), SEALS).unwrap();
        assert!(check(&small).unwrap_err().to_string().contains("4096 bytes"));
        let write_sealed = File::from(sys::memfd_create(c"fgpu-ledger:ro").unwrap());
        write_sealed.set_len(SEGMENT_SIZE as u64).unwrap();
        sys::add_seals(write_sealed.as_fd(), libc::F_SEAL_WRITE | SEALS).unwrap();
        assert!(check(&write_sealed).unwrap_err().to_string().contains("against writing"));
        let regular = File::open("/proc/self/status").unwrap();
        assert!(check(&regular).unwrap_err().to_string().contains("not a sealed memory file"));
    }

    #[test]
    fn a_ledger_memfd_is_taken_from_a_process_by_its_inode() {
        let file = create("take").unwrap();
        let ino = file.metadata().unwrap().ino();
        let me = std::process::id();
        let taken = take_from_process(Path::new("/proc"), me, Some(ino), &|_| true).unwrap().expect("our own memfd");
        assert_eq!(taken.metadata().unwrap().ino(), ino);
        assert!(take_from_process(Path::new("/proc"), me, Some(ino + 1_000_000), &|_| true).unwrap().is_none());
        assert!(take_from_process(Path::new("/proc"), me, Some(ino), &|_| false).unwrap().is_none(), "refused by the caller");
    }
}
