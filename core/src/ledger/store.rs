//! Where a ledger lives: a lock file at the ledger's path, and a System V shared-memory
//! segment that holds the data.
//!
//! Why not one mapped file: every process of a ledger must be able to write it, and whoever
//! can write a file can truncate it, after which every process that touches its mapping dies
//! of SIGBUS. A System V segment has a size fixed at creation. It is marked for removal as
//! soon as it is made (`IPC_RMID`), so the kernel frees it when the last process detaches;
//! Linux still lets processes attach it by id until then.
//!
//! How processes find it: the lock file holds a [`Hint`] (the segment's id). The hint is
//! only a hint: anyone who can write the file can garble it. The segment records the lock
//! file's identity (device and inode); a process uses a segment only if it matches the lock
//! file it opened. When the hint is wrong, `/proc/sysvipc/shm` is searched for a segment
//! that matches. So truncating or overwriting the lock file harms nothing, and deleting or
//! replacing it is noticed: the segment still names the old file, and new processes either
//! reach that old file through a live member's `/proc/PID/fd` or refuse (fail closed).
//!
//! Segments live in an IPC namespace: processes that share a ledger must share one (every
//! container has its own; `docker exec` joins it). A process from another IPC namespace
//! that finds the lock file in use refuses rather than start a second ledger.
//!
//! Two kinds of opener:
//!
//! * **Members** (the shim: [`Store::open`]) create the lock file and the segment, keep the
//!   file's mode what the ledger's sharing asks, write the hint, and lock.
//! * **Observers** (`fgpu status`, `top`, `exporter`, `doctor`, `run`'s look at its ledger:
//!   [`Store::observe_path`], [`Store::observe_file`]) never create, chmod or write a file
//!   and never take a lock they would wait for. What they read, every process of the ledger
//!   can write: they open the file read-only (a regular file only), and they write to the
//!   segment (dropping dead processes, filling in host PIDs) only when the ledger passes
//!   [`verify`]. An unverified ledger is attached read-only and only shown.

use super::error::LedgerError;
use super::layout::*;
use super::lock;
use super::lock_file::{any_slot_locked, io_err, older_format_in_use, open_lock_file, read_hint, write_hint};
pub use super::lock_file::{euid, identity, Sharing};
use super::segment::{attach_ledger, candidate_segments, detach, header_at, header_path, ns_inode, reach_old_lock_file};
pub use super::segment::{in_ipc_namespace, path_in_header_bytes, segment_path};
use super::verify::{file_facts, segment_facts};
pub use super::verify::{verify, FileFacts, SegmentFacts};
use crate::sys::shm_stat;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Relaxed, Release};

/// What an observer may do to a ledger it opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// A process of the ledger (the shim).
    Member,
    /// An observer of a ledger that passed [`verify`]: it may drop dead processes and fill
    /// in host PIDs.
    Verified,
    /// An observer of a ledger that did not: attached read-only, shown, never written.
    Unverified(String),
}

/// The lock file and the attached segment.
pub struct Store {
    pub file: File,
    pub base: NonNull<u8>,
    pub shmid: i32,
    pub path: PathBuf,
    /// How the lock file was reached: the path itself, or a live member's `/proc/PID/fd`.
    pub adopted_from: Option<PathBuf>,
    /// A member's, or an observer's and how far it may act on the ledger.
    pub trust: Trust,
}

// SAFETY: the segment is process-wide and only reached through atomics; File is Send + Sync.
unsafe impl Send for Store {}
// SAFETY: as above.
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `base` came from shm_attach and is detached only here; no reference into
        // the segment outlives `self` (accessors borrow the Ledger that owns the Store).
        unsafe { crate::sys::shm_detach(self.base) };
    }
}

fn check_cpu(path: &Path) -> Result<(), LedgerError> {
    // The ledger's words are 16-byte atomics, built to use cmpxchg16b (.cargo/config.toml).
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("cmpxchg16b") {
        return Err(LedgerError::Untrusted {
            path: path.to_path_buf(),
            why: "this CPU has no cmpxchg16b instruction, which the ledger's 16-byte atomics need".into(),
        });
    }
    let _ = path;
    Ok(())
}

impl Store {
    /// Opens the lock file at `path` as a member of the ledger and attaches its segment,
    /// creating either if needed.
    pub fn open(path: &Path, sharing: Sharing) -> Result<Store, LedgerError> {
        check_cpu(path)?;
        let file = match open_lock_file(path, sharing) {
            Ok(file) => file,
            // The directory of a per-user ledger is gone (logind removes /run/user/UID at
            // logout) while processes of the ledger run on: join them, never start another.
            Err(e @ LedgerError::Io { .. }) if sharing == Sharing::User => return adopt_orphan(path).ok_or(e),
            Err(e) => return Err(e),
        };
        lock::ofd_lock_timed(file.as_fd(), INIT_LOCK).map_err(io_err(path, "lock"))?;
        let found = find_or_create(&file, path, sharing);
        lock::ofd_unlock(file.as_fd(), INIT_LOCK);
        let (shmid, base, adopted) = found?;
        let (file, adopted_from) = match adopted {
            Some((old_file, via)) => (old_file, Some(via)),
            None => (file, None),
        };
        Ok(Store { file, base, shmid, path: path.to_path_buf(), adopted_from, trust: Trust::Member })
    }

    /// Opens the ledger at `path` (the caller's own file system; a link in its last
    /// component is refused) to look at it: see [`Store::observe_file`].
    pub fn observe_path(path: &Path) -> Result<Store, LedgerError> {
        let file = crate::resolve::open_plain(path).map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied if e.raw_os_error().is_none() => LedgerError::Untrusted { path: path.to_path_buf(), why: e.to_string() },
            // Deleted while its processes run: say so rather than "not in use".
            io::ErrorKind::NotFound => match live_segment_named(path) {
                Some(shmid) => LedgerError::Replaced { path: path.to_path_buf(), shmid },
                None => io_err(path, "open")(e),
            },
            _ => io_err(path, "open")(e),
        })?;
        Self::observe_file(file, path, None)
    }

    /// Looks at a ledger whose lock file the caller opened read-only (`file`, a regular
    /// file; `path` is how the ledger's processes name it), in segment `shmid` when the
    /// caller knows it (found mapped by a process), else the one the file's hint or a
    /// search names. Creates, changes and waits for nothing.
    pub fn observe_file(file: File, path: &Path, shmid: Option<i32>) -> Result<Store, LedgerError> {
        check_cpu(path)?;
        let me = identity(&file).map_err(io_err(path, "stat"))?;
        let (shmid, read_only) = match shmid {
            Some(shmid) => {
                let base = attach_ledger(shmid, true).ok_or_else(|| LedgerError::NotInUse { path: path.to_path_buf() })?;
                (shmid, base)
            }
            None => match find_for_observer(&file, me) {
                Some(found) => found,
                None => return Err(not_found_for_observer(&file, path)),
            },
        };
        let trust = match verify(&file_facts(&file), &segment_facts(shmid, header_at(read_only))) {
            Ok(()) => Trust::Verified,
            Err(why) => Trust::Unverified(why.to_string()),
        };
        // A verified ledger is attached again, writable, to drop dead processes.
        let base = match trust {
            Trust::Verified => match crate::sys::shm_attach(shmid, false) {
                Ok(writable) => {
                    detach(read_only);
                    writable
                }
                Err(_) => read_only,
            },
            _ => read_only,
        };
        let writable = base != read_only || matches!(trust, Trust::Member);
        let trust =
            if matches!(trust, Trust::Verified) && !writable { Trust::Unverified("its shared memory cannot be written by this user".into()) } else { trust };
        Ok(Store { file, base, shmid, path: path.to_path_buf(), adopted_from: None, trust })
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the segment is SEGMENT_SIZE bytes (checked before attaching), page
        // aligned, and Header (all atomics) sits at offset 0; it lives as long as `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    /// Device entry `index` of the segment.
    #[inline]
    pub fn device(&self, index: usize) -> &DeviceEntry {
        assert!(index < MAX_DEVICES);
        // SAFETY: in bounds by the assertion and the layout's compile-time checks;
        // DeviceEntry is all atomics and 8-byte aligned at this offset of the segment.
        unsafe { &*self.base.as_ptr().add(DEVICES_OFFSET).cast::<DeviceEntry>().add(index) }
    }

    /// Process slot `index` of the segment.
    #[inline]
    pub fn slot(&self, index: usize) -> &Slot {
        assert!(index < MAX_SLOTS);
        // SAFETY: in bounds by the assertion and SEGMENT_SIZE; Slot is all atomics and
        // 16-byte aligned at this offset (SLOTS_OFFSET and the slot size are multiples of 16).
        unsafe { &*self.base.as_ptr().add(SLOTS_OFFSET).cast::<Slot>().add(index) }
    }

    /// Whether this opener may write the segment (a member, or an observer of a verified
    /// ledger). An unverified ledger is attached read-only: a write would fault.
    pub fn writable(&self) -> bool {
        matches!(self.trust, Trust::Member | Trust::Verified)
    }

    /// Whether this opener is a process of the ledger (it holds the file open read-write).
    pub fn is_member(&self) -> bool {
        self.trust == Trust::Member
    }
}

type Found = (i32, NonNull<u8>, Option<(File, PathBuf)>);

/// With the init lock held: the segment named by the hint, else one found by search, else
/// a new one.
fn find_or_create(file: &File, path: &Path, sharing: Sharing) -> Result<Found, LedgerError> {
    let me = identity(file).map_err(io_err(path, "stat"))?;
    let ipcns = ns_inode("ipc");
    if let Some(hint) = read_hint(file) {
        if let Some(base) = attach_if_ours(hint.shmid, me, sharing) {
            if header_at(base).ledger_id[0].load(Relaxed) == hint.ledger_id[0] {
                return Ok((hint.shmid, base, None));
            }
            detach(base);
        } else if hint.ipcns != ipcns && hint.ipcns != 0 && any_slot_locked(file) {
            return Err(LedgerError::OtherIpcNamespace { path: path.to_path_buf() });
        }
    }
    let mut replaced = None;
    for (shmid, nattch) in candidate_segments() {
        let Some(base) = attach_checked(shmid, sharing) else { continue };
        let header = header_at(base);
        if (header.lock_dev.load(Relaxed), header.lock_ino.load(Relaxed)) == me {
            write_hint(file, shmid, header, ipcns);
            return Ok((shmid, base, None));
        }
        if nattch > 0 && header_path(header) == path.as_os_str().as_encoded_bytes() && header.mntns.load(Relaxed) == ns_inode("mnt") {
            // A live ledger made for this path, whose lock file has since been deleted or
            // replaced. Its members still lock the old file: reach it through one of them.
            if let Some((old, via)) = reach_old_lock_file(shmid, base, header, true) {
                return Ok((shmid, base, Some((old, via))));
            }
            replaced = Some(shmid);
        }
        detach(base);
    }
    if let Some(shmid) = replaced {
        return Err(LedgerError::Replaced { path: path.to_path_buf(), shmid });
    }
    if let Some(found) = older_format_in_use(file) {
        return Err(LedgerError::Version { path: path.to_path_buf(), found, expected: VERSION });
    }
    let (shmid, base) = create_segment(path, sharing, me, ipcns)?;
    write_hint(file, shmid, header_at(base), ipcns);
    Ok((shmid, base, None))
}

/// For an observer: the segment (attached read-only) that records this lock file, named by
/// the file's hint or found by search.
fn find_for_observer(file: &File, me: (u64, u64)) -> Option<(i32, NonNull<u8>)> {
    let records_me = |base: NonNull<u8>| {
        let header = header_at(base);
        (header.lock_dev.load(Relaxed), header.lock_ino.load(Relaxed)) == me
    };
    if let Some(hint) = read_hint(file) {
        if let Some(base) = attach_ledger(hint.shmid, true) {
            if records_me(base) {
                return Some((hint.shmid, base));
            }
            detach(base);
        }
    }
    for (shmid, _) in candidate_segments() {
        let Some(base) = attach_ledger(shmid, true) else { continue };
        if records_me(base) {
            return Some((shmid, base));
        }
        detach(base);
    }
    None
}

/// A live ledger of this IPC and mount namespace made for `path` (whose file may since
/// have been deleted or replaced).
fn live_segment_named(path: &Path) -> Option<i32> {
    candidate_segments().into_iter().filter(|(_, nattch)| *nattch > 0).find_map(|(shmid, _)| {
        let base = attach_ledger(shmid, true)?;
        let header = header_at(base);
        let same = header_path(header) == path.as_os_str().as_encoded_bytes() && header.mntns.load(Relaxed) == ns_inode("mnt");
        detach(base);
        same.then_some(shmid)
    })
}

/// Why an observer found no segment for a lock file: a live ledger whose file was replaced,
/// one of an older fgpu, or none.
fn not_found_for_observer(file: &File, path: &Path) -> LedgerError {
    if let Some(shmid) = live_segment_named(path) {
        return LedgerError::Replaced { path: path.to_path_buf(), shmid };
    }
    match older_format_in_use(file) {
        Some(found) => LedgerError::Version { path: path.to_path_buf(), found, expected: VERSION },
        None => LedgerError::NotInUse { path: path.to_path_buf() },
    }
}

/// Whether a live per-user ledger of this user, in this IPC and mount namespace, is bound
/// to `path` (its processes still run though its directory may be gone).
pub fn live_user_ledger_at(path: &Path) -> bool {
    candidate_segments().into_iter().filter(|(_, nattch)| *nattch > 0).any(|(shmid, _)| {
        let Some(base) = attach_checked(shmid, Sharing::User) else { return false };
        let header = header_at(base);
        let bound = header_path(header) == path.as_os_str().as_encoded_bytes() && header.mntns.load(Relaxed) == ns_inode("mnt");
        detach(base);
        bound
    })
}

/// A per-user ledger whose directory is gone while its processes live on (logind removes
/// `/run/user/UID` at logout): its lock file, reached through one of them.
fn adopt_orphan(path: &Path) -> Option<Store> {
    for (shmid, nattch) in candidate_segments() {
        if nattch == 0 {
            continue;
        }
        let Some(base) = attach_checked(shmid, Sharing::User) else { continue };
        let header = header_at(base);
        if header_path(header) == path.as_os_str().as_encoded_bytes() && header.mntns.load(Relaxed) == ns_inode("mnt") {
            if let Some((file, via)) = reach_old_lock_file(shmid, base, header, true) {
                return Some(Store { file, base, shmid, path: path.to_path_buf(), adopted_from: Some(via), trust: Trust::Member });
            }
        }
        detach(base);
    }
    None
}

/// [`attach_ledger`] for a member: for a ledger of one user's, only a segment made by and
/// belonging to this user, and not open to others.
fn attach_checked(shmid: i32, sharing: Sharing) -> Option<NonNull<u8>> {
    if sharing.own_only() {
        let ds = shm_stat(shmid)?;
        if ds.shm_perm.cuid != euid() || ds.shm_perm.uid != euid() || ds.shm_perm.mode & 0o077 != 0 {
            return None;
        }
    }
    attach_ledger(shmid, false)
}

fn attach_if_ours(shmid: i32, me: (u64, u64), sharing: Sharing) -> Option<NonNull<u8>> {
    let base = attach_checked(shmid, sharing)?;
    let header = header_at(base);
    if (header.lock_dev.load(Relaxed), header.lock_ino.load(Relaxed)) == me {
        Some(base)
    } else {
        detach(base);
        None
    }
}

fn random_id() -> [u64; 2] {
    let bytes = crate::sys::random_16().unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        (t ^ (std::process::id() as u128) << 64).to_le_bytes()
    });
    [u64::from_le_bytes(bytes[..8].try_into().unwrap()), u64::from_le_bytes(bytes[8..].try_into().unwrap())]
}

fn create_segment(path: &Path, sharing: Sharing, me: (u64, u64), ipcns: u64) -> Result<(i32, NonNull<u8>), LedgerError> {
    let shmid = crate::sys::shm_create(SEGMENT_SIZE, sharing.mode() as i32).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::ENOMEM) => {
            LedgerError::NoSpace { path: path.to_path_buf(), need: SEGMENT_SIZE, why: super::shm_usage::why_no_segment(SEGMENT_SIZE as u64) }
        }
        _ => LedgerError::Io { path: path.to_path_buf(), op: "create its shared memory", source },
    })?;
    let attached = crate::sys::shm_attach(shmid, false);
    // Marked for removal at once: the kernel frees it when the last process detaches, so a
    // ledger never outlives its processes. Linux lets others attach it by id until then.
    crate::sys::shm_remove(shmid);
    let base = attached.map_err(|source| LedgerError::Io { path: path.to_path_buf(), op: "attach its shared memory", source })?;
    let header = header_at(base);
    header.version.store(VERSION, Relaxed);
    header.max_devices.store(MAX_DEVICES as u32, Relaxed);
    header.max_slots.store(MAX_SLOTS as u32, Relaxed);
    header.slot_size.store(std::mem::size_of::<Slot>() as u32, Relaxed);
    header.segment_size.store(SEGMENT_SIZE as u64, Relaxed);
    header.created_unix.store(unix_now_ms().div_euclid(1000) as u64, Relaxed);
    let id = random_id();
    header.ledger_id[0].store(id[0], Relaxed);
    header.ledger_id[1].store(id[1], Relaxed);
    header.lock_dev.store(me.0, Relaxed);
    header.lock_ino.store(me.1, Relaxed);
    header.mntns.store(ns_inode("mnt"), Relaxed);
    header.ipcns.store(ipcns, Relaxed);
    header.creator_uid.store(euid(), Relaxed);
    header.sharing.store(if sharing.own_only() { SHARING_USER } else { SHARING_SHARED }, Relaxed);
    let bytes = path.as_os_str().as_encoded_bytes();
    let mut padded = [0u8; PATH_BYTES];
    let n = bytes.len().min(PATH_BYTES - 1);
    padded[..n].copy_from_slice(&bytes[..n]);
    for (i, word) in header.path.iter().enumerate() {
        word.store(u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().unwrap()), Relaxed);
    }
    header.magic.store(MAGIC, Release);
    Ok((shmid, base))
}

/// The wall clock, in milliseconds since the Unix epoch (0 if it is before it).
pub(crate) fn unix_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
