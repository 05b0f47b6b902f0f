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

use super::layout::*;
use super::lock;
use super::LedgerError;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// Who may share a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// The per-user default: the file's directory must be the user's own (mode 0700), the
    /// file and the segment are 0600, and a file or segment of another owner is refused.
    User,
    /// A ledger named on purpose (`FGPU_LEDGER`, the configuration file, `fgpu run`): every
    /// user who can open the file shares it (file and segment 0666).
    Shared,
}

/// What to do when no segment exists yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    Yes,
    /// For readers such as `fgpu status`: report that no process uses the ledger.
    No,
}

/// The lock file and the attached segment.
pub struct Store {
    pub file: File,
    pub base: NonNull<u8>,
    pub shmid: i32,
    pub path: PathBuf,
    /// How the lock file was reached: the path itself, or a live member's `/proc/PID/fd`.
    pub adopted_from: Option<PathBuf>,
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

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl Fn(io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io { path: path.to_path_buf(), op, source }
}

/// Identity of an open file: (`st_dev`, `st_ino`).
pub fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

pub fn euid() -> u32 {
    crate::sys::geteuid()
}

fn ns_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}")).map(|m| m.ino()).unwrap_or(0)
}

impl Store {
    /// Opens the lock file at `path` and attaches its segment, creating either if needed
    /// (`create`).
    pub fn open(path: &Path, sharing: Sharing, create: Create) -> Result<Store, LedgerError> {
        // The ledger's words are 16-byte atomics, built to use cmpxchg16b (.cargo/config.toml).
        #[cfg(target_arch = "x86_64")]
        if !std::arch::is_x86_feature_detected!("cmpxchg16b") {
            return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: "this CPU has no cmpxchg16b instruction, which the ledger's 16-byte atomics need".into() });
        }
        let file = open_lock_file(path, sharing, create)?;
        lock::ofd_lock_timed(file.as_fd(), INIT_LOCK).map_err(io_err(path, "lock"))?;
        let found = find_or_create(&file, path, sharing, create);
        lock::ofd_unlock(file.as_fd(), INIT_LOCK);
        let (shmid, base, adopted) = found?;
        match adopted {
            Some((old_file, via)) => Ok(Store { file: old_file, base, shmid, path: path.to_path_buf(), adopted_from: Some(via) }),
            None => Ok(Store { file, base, shmid, path: path.to_path_buf(), adopted_from: None }),
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the segment is SEGMENT_SIZE bytes (checked before attaching), page
        // aligned, and Header (all atomics) sits at offset 0; it lives as long as `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }
}

/// The per-user default directory must be the user's own: not a link, owned by them, and
/// not open to group or others (a directory someone else made there could be theirs).
fn check_user_dir(dir: &Path) -> Result<(), LedgerError> {
    let untrusted = |why: String| LedgerError::Untrusted { path: dir.to_path_buf(), why };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => {
            if !meta.file_type().is_dir() {
                return Err(untrusted("is not a directory".into()));
            }
            if meta.uid() != euid() {
                return Err(untrusted(format!("belongs to uid {}, not to this user (uid {}); another user may have made it to share your ledger", meta.uid(), euid())));
            }
            if meta.mode() & 0o077 != 0 {
                return Err(untrusted(format!("has mode {:o}; a per-user ledger directory must be 0700", meta.mode() & 0o7777)));
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().mode(0o700).create(dir).or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) }).map_err(io_err(dir, "create its directory"))?;
            check_user_dir(dir)
        }
        Err(e) => Err(io_err(dir, "inspect its directory")(e)),
    }
}

fn open_lock_file(path: &Path, sharing: Sharing, create: Create) -> Result<File, LedgerError> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if create == Create::Yes {
        match (sharing, parent) {
            (Sharing::User, Some(dir)) => check_user_dir(dir)?,
            (Sharing::Shared, Some(dir)) if !dir.exists() => std::fs::create_dir_all(dir).map_err(io_err(dir, "create its directory"))?,
            _ => {}
        }
    }
    let mode = if sharing == Sharing::User { 0o600 } else { 0o666 };
    let mut options = OpenOptions::new();
    options.read(true).write(true).mode(mode).custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW);
    if create == Create::Yes {
        options.create(true);
    }
    let file = options.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => LedgerError::Untrusted { path: path.to_path_buf(), why: "is a symbolic link; a ledger is never opened through one".into() },
        Some(libc::EACCES) => {
            let owner = std::fs::symlink_metadata(path).map(|m| format!(" (owner uid {}, mode {:o})", m.uid(), m.mode() & 0o7777)).unwrap_or_default();
            LedgerError::Untrusted { path: path.to_path_buf(), why: format!("cannot be opened for writing by uid {}{owner}; every process of a ledger must be able to lock it", euid()) }
        }
        _ => io_err(path, "open")(e),
    })?;
    let meta = file.metadata().map_err(io_err(path, "stat"))?;
    if !meta.file_type().is_file() {
        return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: "is not a regular file".into() });
    }
    match sharing {
        Sharing::User if meta.uid() != euid() => {
            return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: format!("belongs to uid {}, not to this user (uid {})", meta.uid(), euid()) });
        }
        Sharing::User if meta.mode() & 0o077 != 0 => {
            // Ours, but loosened: tighten it again.
            let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600));
        }
        // A shared ledger made by this user: open it to every user whatever the umask.
        Sharing::Shared if meta.uid() == euid() && meta.mode() & 0o666 != 0o666 => {
            let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        }
        _ => {}
    }
    Ok(file)
}

type Found = (i32, NonNull<u8>, Option<(File, PathBuf)>);

/// With the init lock held: the segment named by the hint, else one found by search, else
/// a new one.
fn find_or_create(file: &File, path: &Path, sharing: Sharing, create: Create) -> Result<Found, LedgerError> {
    let me = identity(file).map_err(io_err(path, "stat"))?;
    let mut head = [0u8; HINT_SIZE];
    let hint = file.read_at(&mut head, 0).ok().filter(|n| *n == HINT_SIZE).and_then(|_| Hint::from_bytes(&head));
    let ipcns = ns_inode("ipc");
    if let Some(hint) = hint {
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
            if let Some((old, via)) = reach_old_lock_file(base, header) {
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
    if create == Create::No {
        return Err(LedgerError::NotInUse { path: path.to_path_buf() });
    }
    let (shmid, base) = create_segment(path, sharing, me, ipcns)?;
    write_hint(file, shmid, header_at(base), ipcns);
    Ok((shmid, base, None))
}

fn header_at(base: NonNull<u8>) -> &'static Header {
    // SAFETY: `base` is an attached segment of SEGMENT_SIZE bytes (attach_checked checks
    // the size first); Header is all atomics at offset 0. The 'static lifetime is only used
    // inside find_or_create, before the segment is detached or handed to a Store.
    unsafe { &*base.as_ptr().cast::<Header>() }
}

fn header_path(header: &Header) -> Vec<u8> {
    let mut bytes: Vec<u8> = header.path.iter().flat_map(|w| w.load(Relaxed).to_le_bytes()).collect();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    bytes.truncate(end);
    bytes
}

/// The format version of an older fgpu whose processes still use this file as their ledger
/// (format 2 kept the data in the file and locked its slots at `LOCK_BASE + 16 + 2 * slot`).
fn older_format_in_use(file: &File) -> Option<u32> {
    let mut head = [0u8; 12];
    file.read_at(&mut head, 0).ok().filter(|n| *n == 12)?;
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let older = u64::from_le_bytes(head[..8].try_into().unwrap()) == MAGIC && version < VERSION;
    (older && lock::ofd_any_held(file.as_fd(), LOCK_BASE + 16, 2 * MAX_SLOTS as i64).unwrap_or(false)).then_some(version)
}

/// Whether any slot's liveness lock on this lock file is held: someone uses it.
fn any_slot_locked(file: &File) -> bool {
    lock::ofd_any_held(file.as_fd(), alive_lock(0), 2 * MAX_SLOTS as i64).unwrap_or(true)
}

/// Segments of exactly our size in this IPC namespace, with their attach counts.
fn candidate_segments() -> Vec<(i32, u64)> {
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

use crate::sys::shm_stat;

/// Attaches `shmid` if it is a segment of our size holding a ledger of this version, and,
/// for a per-user ledger, made by this user.
fn attach_checked(shmid: i32, sharing: Sharing) -> Option<NonNull<u8>> {
    let ds = shm_stat(shmid)?;
    if ds.shm_segsz != SEGMENT_SIZE {
        return None;
    }
    if sharing == Sharing::User && (ds.shm_perm.cuid != euid() || ds.shm_perm.uid != euid()) {
        return None;
    }
    let base = crate::sys::shm_attach(shmid, false).ok()?;
    let header = header_at(base);
    let ok = header.magic.load(Acquire) == MAGIC
        && header.version.load(Relaxed) == VERSION
        && header.segment_size.load(Relaxed) == SEGMENT_SIZE as u64
        && header.max_slots.load(Relaxed) == MAX_SLOTS as u32;
    if !ok {
        detach(base);
        return None;
    }
    Some(base)
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

fn detach(base: NonNull<u8>) {
    // SAFETY: callers pass an attachment of their own that nothing refers to any more.
    unsafe { crate::sys::shm_detach(base) };
}

fn write_hint(file: &File, shmid: i32, header: &Header, ipcns: u64) {
    let hint = Hint {
        magic: HINT_MAGIC,
        version: VERSION,
        shmid,
        ledger_id: [header.ledger_id[0].load(Relaxed), header.ledger_id[1].load(Relaxed)],
        ipcns,
    };
    // Best effort: a full disk or a read-only file only costs the next process a search.
    let _ = file.write_all_at(&hint.to_bytes(), 0);
}

fn random_id() -> [u64; 2] {
    let bytes = crate::sys::random_16().unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        (t ^ (std::process::id() as u128) << 64).to_le_bytes()
    });
    [u64::from_le_bytes(bytes[..8].try_into().unwrap()), u64::from_le_bytes(bytes[8..].try_into().unwrap())]
}

fn create_segment(path: &Path, sharing: Sharing, me: (u64, u64), ipcns: u64) -> Result<(i32, NonNull<u8>), LedgerError> {
    let mode = if sharing == Sharing::User { 0o600 } else { 0o666 };
    let shmid = crate::sys::shm_create(SEGMENT_SIZE, mode).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::ENOMEM) => LedgerError::NoSpace { path: path.to_path_buf(), need: SEGMENT_SIZE },
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
    header.created_unix.store(super::unix_now_ms().div_euclid(1000) as u64, Relaxed);
    let id = random_id();
    header.ledger_id[0].store(id[0], Relaxed);
    header.ledger_id[1].store(id[1], Relaxed);
    header.lock_dev.store(me.0, Relaxed);
    header.lock_ino.store(me.1, Relaxed);
    header.mntns.store(ns_inode("mnt"), Relaxed);
    header.ipcns.store(ipcns, Relaxed);
    header.creator_uid.store(euid(), Relaxed);
    header.sharing.store(if sharing == Sharing::User { SHARING_USER } else { SHARING_SHARED }, Relaxed);
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

/// The lock file a live ledger's members still hold, reached through `/proc/PID/fd` of a
/// member in this PID namespace (needs the same user, or CAP_SYS_PTRACE).
fn reach_old_lock_file(base: NonNull<u8>, header: &Header) -> Option<(File, PathBuf)> {
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
        let fds = PathBuf::from(format!("/proc/{}/fd", slot.pid.load(Relaxed)));
        let Ok(entries) = std::fs::read_dir(&fds) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
            if (meta.dev(), meta.ino()) != want || !meta.file_type().is_file() {
                continue;
            }
            let opened = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(entry.path());
            if let Ok(file) = opened {
                if identity(&file).ok() == Some(want) {
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
    let ds = shm_stat(shmid)?;
    if ds.shm_segsz != SEGMENT_SIZE {
        return None;
    }
    let base = crate::sys::shm_attach(shmid, true).ok()?;
    let header = header_at(base);
    let path = (header.magic.load(Acquire) == MAGIC && header.version.load(Relaxed) == VERSION)
        .then(|| PathBuf::from(std::ffi::OsStr::from_bytes(&header_path(header))));
    detach(base);
    path
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

/// Runs `f` on a thread that joined the IPC namespace at `ns` (a `/proc/PID/ns/ipc` path),
/// so that segment ids are looked up there. Needs CAP_SYS_ADMIN over that namespace.
pub fn in_ipc_namespace<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = File::open(ns)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // The thread ends after `f`: the namespace goes with it.
                crate::sys::enter_ipc_namespace(file.as_fd())?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("panicked in another IPC namespace")))
    })
}
