//! A ledger's System V segment as the kernel shows it: the segments of a ledger's size in
//! this IPC namespace, attaching one that holds a ledger of this version, reading its
//! header, detaching; the lock file a live ledger's members still hold, reached through
//! one of them; the path a segment records; and entering another IPC namespace to look.

use super::layout::*;
use super::lock_file::{any_slot_locked, identity};
use crate::sys::shm_stat;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

pub(super) fn ns_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}")).map(|m| m.ino()).unwrap_or(0)
}

pub(super) fn header_at(base: NonNull<u8>) -> &'static Header {
    // SAFETY: `base` is an attached segment of SEGMENT_SIZE bytes (attach_checked checks
    // the size first); Header is all atomics at offset 0. The 'static lifetime is only used
    // inside find_or_create, before the segment is detached or handed to a Store.
    unsafe { &*base.as_ptr().cast::<Header>() }
}

pub(super) fn header_path(header: &Header) -> Vec<u8> {
    let mut bytes: Vec<u8> = header.path.iter().flat_map(|w| w.load(Relaxed).to_le_bytes()).collect();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    bytes.truncate(end);
    bytes
}

/// Segments of exactly our size in this IPC namespace, with their attach counts.
pub(super) fn candidate_segments() -> Vec<(i32, u64)> {
    let Ok(text) = std::fs::read_to_string("/proc/sysvipc/shm") else { return Vec::new() };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let shmid: i32 = fields.get(1)?.parse().ok()?;
            let size: usize = fields.get(3)?.parse().ok()?;
            let nattch: u64 = fields.get(6)?.parse().ok()?;
            (size == SEGMENT_SIZE).then_some((shmid, nattch))
        })
        .collect()
}

/// Attaches `shmid` if it is a segment of our size holding a ledger of this version.
pub(super) fn attach_ledger(shmid: i32, read_only: bool) -> Option<NonNull<u8>> {
    let ds = shm_stat(shmid)?;
    if ds.shm_segsz != SEGMENT_SIZE {
        return None;
    }
    let base = crate::sys::shm_attach(shmid, read_only).ok()?;
    if !header_ok(header_at(base)) {
        detach(base);
        return None;
    }
    Some(base)
}

/// Whether a header is that of a ledger of this version and size.
pub(super) fn header_ok(header: &Header) -> bool {
    header.magic.load(Acquire) == MAGIC
        && header.version.load(Relaxed) == VERSION
        && header.segment_size.load(Relaxed) == SEGMENT_SIZE as u64
        && header.max_slots.load(Relaxed) == MAX_SLOTS as u32
}

pub(super) fn detach(base: NonNull<u8>) {
    // SAFETY: callers pass an attachment of their own that nothing refers to any more.
    unsafe { crate::sys::shm_detach(base) };
}

/// Whether the process `pid` (in this PID namespace) maps segment `shmid`: the kernel's
/// word, where a slot's PID is only what the ledger's processes wrote. Decided from the
/// maps line alone (`maps.rs`): a file of the process's own named like a segment is not one.
pub(super) fn maps_segment(pid: u32, shmid: i32) -> bool {
    let Some(device) = super::maps::shm_device() else { return false };
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return false };
    maps.lines().filter_map(|line| super::maps::attachment(line, device)).any(|a| a.shared && a.shmid == shmid)
}

/// The lock file a live ledger's members still hold, reached through `/proc/PID/fd` of a
/// member in this PID namespace (needs the same user, or CAP_SYS_PTRACE). A slot's PID is
/// used only if the kernel shows that process mapping this segment, and the file only if
/// it is the recorded one (device and inode), a regular file, and holds live slot locks.
pub(super) fn reach_old_lock_file(shmid: i32, base: NonNull<u8>, header: &Header, write: bool) -> Option<(File, PathBuf)> {
    let want = (header.lock_dev.load(Relaxed), header.lock_ino.load(Relaxed));
    let own_ns = ns_inode("pid");
    let slots = header.slot_high.load(Relaxed).min(MAX_SLOTS as u32) as usize;
    for index in 0..slots {
        // SAFETY: in bounds (index < MAX_SLOTS) of the attached SEGMENT_SIZE segment; Slot
        // is all atomics and 16-byte aligned at this offset.
        let slot = unsafe { &*base.as_ptr().add(SLOTS_OFFSET).cast::<Slot>().add(index) };
        if slot.state.load(Acquire) != SLOT_LIVE || slot.pidns.load(Relaxed) != own_ns {
            continue;
        }
        let pid = slot.pid.load(Relaxed);
        if pid == 0 || !maps_segment(pid, shmid) {
            continue;
        }
        let fds = PathBuf::from(format!("/proc/{pid}/fd"));
        let Ok(entries) = std::fs::read_dir(&fds) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
            if (meta.dev(), meta.ino()) != want || !meta.file_type().is_file() {
                continue;
            }
            let opened = OpenOptions::new().read(true).write(write).custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK).open(entry.path());
            if let Ok(file) = opened {
                if identity(&file).ok() == Some(want) && file.metadata().is_ok_and(|m| m.file_type().is_file()) && any_slot_locked(&file) {
                    return Some((file, entry.path()));
                }
            }
        }
    }
    None
}

/// The path recorded in segment `shmid` of this IPC namespace, if it is a ledger of this
/// version that this user may read (for `fgpu status --all`).
pub fn segment_path(shmid: i32) -> Option<PathBuf> {
    let base = attach_ledger(shmid, true)?;
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&header_path(header_at(base))));
    detach(base);
    Some(path)
}

/// The path recorded in a ledger segment's bytes (read through `/proc/PID/map_files`).
pub fn path_in_header_bytes(bytes: &[u8]) -> Option<PathBuf> {
    let offset = std::mem::offset_of!(Header, path);
    if bytes.len() < offset + PATH_BYTES || u64::from_le_bytes(bytes[..8].try_into().ok()?) != MAGIC {
        return None;
    }
    let raw = &bytes[offset..offset + PATH_BYTES];
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&raw[..end])))
}

/// Runs `f` on a thread that joined the IPC namespace at `ns` (a `/proc/PID/ns/ipc` file),
/// so that segment ids are looked up there. Needs CAP_SYS_ADMIN over that namespace.
pub fn in_ipc_namespace<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // The thread ends after `f`: the namespace goes with it.
                crate::sys::enter_ipc_namespace(ns.as_fd())?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("panicked in another IPC namespace")))
    })
}
