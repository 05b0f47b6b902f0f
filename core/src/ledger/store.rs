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
    /// A ledger named for one user's processes (`FGPU_LEDGER`, `fgpu run`): the file and the
    /// segment are 0600 and must be this user's; its directory may be anywhere.
    Private,
    /// A ledger shared on purpose (`ledger =` in the configuration file, or
    /// `FGPU_LEDGER_SHARED=1`): every user who can open the file shares it (file and segment
    /// 0666).
    Shared,
}

impl Sharing {
    /// Mode of the file and the segment when this process creates them.
    fn mode(self) -> u32 {
        match self {
            Sharing::User | Sharing::Private => 0o600,
            Sharing::Shared => 0o666,
        }
    }

    /// Whether the file and the segment must be this user's own.
    fn own_only(self) -> bool {
        self != Sharing::Shared
    }
}

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
            Err(why) => Trust::Unverified(why),
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

/// What [`verify`] needs to know of a lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFacts {
    pub regular: bool,
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub mode: u32,
}

/// What [`verify`] needs to know of a segment: what the kernel says of it (`cuid`, `uid`,
/// `mode`) and what its header says (written by its processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentFacts {
    pub cuid: u32,
    pub uid: u32,
    pub mode: u32,
    pub lock_dev: u64,
    pub lock_ino: u64,
    pub sharing: u32,
}

fn file_facts(file: &File) -> FileFacts {
    match file.metadata() {
        Ok(meta) => FileFacts { regular: meta.file_type().is_file(), dev: meta.dev(), ino: meta.ino(), uid: meta.uid(), mode: meta.mode() & 0o7777 },
        Err(_) => FileFacts { regular: false, dev: 0, ino: 0, uid: u32::MAX, mode: 0 },
    }
}

fn segment_facts(shmid: i32, header: &Header) -> SegmentFacts {
    let (cuid, uid, mode) =
        shm_stat(shmid).map(|ds| (ds.shm_perm.cuid, ds.shm_perm.uid, u32::from(ds.shm_perm.mode) & 0o777)).unwrap_or((u32::MAX, u32::MAX, 0));
    SegmentFacts { cuid, uid, mode, lock_dev: header.lock_dev.load(Relaxed), lock_ino: header.lock_ino.load(Relaxed), sharing: header.sharing.load(Relaxed) }
}

/// Whether a tool running as another user (root) may act on a ledger: drop its dead
/// processes and fill in host PIDs. Its processes can write everything in the segment's
/// header and the path it names, so the rule leans only on what the kernel says of the
/// file and the segment, and holds only for what fgpu itself makes:
///
/// * the segment records this very file (device and inode), which is a regular file;
/// * a per-user or private ledger (header says so): the file's owner, the segment's creator
///   and the segment's owner are one user, and the file and segment are mode 0600;
/// * a shared ledger: the file is mode 0666 (anyone may lock it anyway).
///
/// A file of the system (`/etc/shadow`: 0640, not its user's segment) passes neither.
pub fn verify(file: &FileFacts, segment: &SegmentFacts) -> Result<(), String> {
    if !file.regular {
        return Err("its file is not a regular file".into());
    }
    if (segment.lock_dev, segment.lock_ino) != (file.dev, file.ino) {
        return Err(format!(
            "its shared memory records another file (device {}, inode {}) than the one its path names (device {}, inode {})",
            segment.lock_dev, segment.lock_ino, file.dev, file.ino
        ));
    }
    match segment.sharing {
        SHARING_USER => {
            if !(file.uid == segment.cuid && segment.cuid == segment.uid) {
                return Err(format!(
                    "a per-user ledger whose file belongs to uid {} but whose shared memory was made by uid {} and belongs to uid {}",
                    file.uid, segment.cuid, segment.uid
                ));
            }
            if file.mode != 0o600 || segment.mode != 0o600 {
                return Err(format!("a per-user ledger whose file has mode {:o} and shared memory mode {:o} (fgpu makes both 0600)", file.mode, segment.mode));
            }
            Ok(())
        }
        SHARING_SHARED if file.mode == 0o666 => Ok(()),
        SHARING_SHARED => Err(format!("a shared ledger whose file has mode {:o} (fgpu makes it 0666)", file.mode)),
        other => Err(format!("its shared memory names an unknown kind of sharing ({other})")),
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
                return Err(untrusted(format!(
                    "belongs to uid {}, not to this user (uid {}); another user may have made it to share your ledger",
                    meta.uid(),
                    euid()
                )));
            }
            if meta.mode() & 0o077 != 0 {
                return Err(untrusted(format!("has mode {:o}; a per-user ledger directory must be 0700", meta.mode() & 0o7777)));
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
                .map_err(io_err(dir, "create its directory"))?;
            check_user_dir(dir)
        }
        Err(e) => Err(io_err(dir, "inspect its directory")(e)),
    }
}

fn open_lock_file(path: &Path, sharing: Sharing) -> Result<File, LedgerError> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    match (sharing, parent) {
        (Sharing::User, Some(dir)) => check_user_dir(dir)?,
        (Sharing::Private, Some(dir)) if !dir.exists() => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir, "create its directory"))?
        }
        (Sharing::Shared, Some(dir)) if !dir.exists() => std::fs::create_dir_all(dir).map_err(io_err(dir, "create its directory"))?,
        _ => {}
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(sharing.mode())
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => LedgerError::Untrusted { path: path.to_path_buf(), why: "is a symbolic link; a ledger is never opened through one".into() },
            Some(libc::EACCES) => {
                let owner = std::fs::symlink_metadata(path).map(|m| format!(" (owner uid {}, mode {:o})", m.uid(), m.mode() & 0o7777)).unwrap_or_default();
                LedgerError::Untrusted {
                    path: path.to_path_buf(),
                    why: format!("cannot be opened for writing by uid {}{owner}; every process of a ledger must be able to lock it", euid()),
                }
            }
            _ => io_err(path, "open")(e),
        })?;
    let meta = file.metadata().map_err(io_err(path, "stat"))?;
    if !meta.file_type().is_file() {
        return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: "is not a regular file".into() });
    }
    match sharing {
        _ if sharing.own_only() && meta.uid() != euid() => {
            let hint = if sharing == Sharing::Private {
                "; a ledger named in FGPU_LEDGER is private to its user unless FGPU_LEDGER_SHARED=1 is set for every process of it"
            } else {
                ""
            };
            return Err(LedgerError::Untrusted {
                path: path.to_path_buf(),
                why: format!("belongs to uid {}, not to this user (uid {}){hint}", meta.uid(), euid()),
            });
        }
        _ if sharing.own_only() && meta.mode() & 0o7777 != 0o600 => {
            // Ours, but loosened (or made under an odd umask): make it 0600 again.
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

fn read_hint(file: &File) -> Option<Hint> {
    let mut head = [0u8; HINT_SIZE];
    file.read_at(&mut head, 0).ok().filter(|n| *n == HINT_SIZE).and_then(|_| Hint::from_bytes(&head))
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

/// Attaches `shmid` if it is a segment of our size holding a ledger of this version.
fn attach_ledger(shmid: i32, read_only: bool) -> Option<NonNull<u8>> {
    let ds = shm_stat(shmid)?;
    if ds.shm_segsz != SEGMENT_SIZE {
        return None;
    }
    let base = crate::sys::shm_attach(shmid, read_only).ok()?;
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

fn detach(base: NonNull<u8>) {
    // SAFETY: callers pass an attachment of their own that nothing refers to any more.
    unsafe { crate::sys::shm_detach(base) };
}

fn write_hint(file: &File, shmid: i32, header: &Header, ipcns: u64) {
    let hint = Hint { magic: HINT_MAGIC, version: VERSION, shmid, ledger_id: [header.ledger_id[0].load(Relaxed), header.ledger_id[1].load(Relaxed)], ipcns };
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

/// Whether the process `pid` (in this PID namespace) maps segment `shmid`: the kernel's
/// word, where a slot's PID is only what the ledger's processes wrote. Decided from the
/// maps line alone (`maps.rs`): a file of the process's own named like a segment is not one.
fn maps_segment(pid: u32, shmid: i32) -> bool {
    let Some(device) = super::maps::shm_device() else { return false };
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return false };
    maps.lines().filter_map(|line| super::maps::attachment(line, device)).any(|a| a.shared && a.shmid == shmid)
}

/// The lock file a live ledger's members still hold, reached through `/proc/PID/fd` of a
/// member in this PID namespace (needs the same user, or CAP_SYS_PTRACE). A slot's PID is
/// used only if the kernel shows that process mapping this segment, and the file only if
/// it is the recorded one (device and inode), a regular file, and holds live slot locks.
fn reach_old_lock_file(shmid: i32, base: NonNull<u8>, header: &Header, write: bool) -> Option<(File, PathBuf)> {
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

/// The wall clock, in milliseconds since the Unix epoch (0 if it is before it).
pub(crate) fn unix_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod verify_tests {
    use super::*;

    fn file(uid: u32, mode: u32) -> FileFacts {
        FileFacts { regular: true, dev: 8, ino: 42, uid, mode }
    }

    fn segment(cuid: u32, uid: u32, mode: u32, sharing: u32) -> SegmentFacts {
        SegmentFacts { cuid, uid, mode, lock_dev: 8, lock_ino: 42, sharing }
    }

    #[test]
    fn fgpus_own_ledgers_pass() {
        assert_eq!(verify(&file(1000, 0o600), &segment(1000, 1000, 0o600, SHARING_USER)), Ok(()));
        assert_eq!(verify(&file(0, 0o600), &segment(0, 0, 0o600, SHARING_USER)), Ok(()));
        assert_eq!(verify(&file(0, 0o666), &segment(0, 0, 0o666, SHARING_SHARED)), Ok(()));
        assert_eq!(verify(&file(1000, 0o666), &segment(65534, 65534, 0o666, SHARING_SHARED)), Ok(()));
    }

    #[test]
    fn system_files_and_forgeries_fail() {
        // /etc/shadow, named by a tenant's segment: 0640 root:shadow, and not its segment.
        let shadow = FileFacts { regular: true, dev: 8, ino: 42, uid: 0, mode: 0o640 };
        assert!(verify(&shadow, &segment(1000, 1000, 0o600, SHARING_USER)).is_err());
        assert!(verify(&shadow, &segment(1000, 1000, 0o666, SHARING_SHARED)).is_err());
        // A root-owned 0600 file claimed by another user's per-user ledger.
        assert!(verify(&file(0, 0o600), &segment(1000, 1000, 0o600, SHARING_USER)).unwrap_err().contains("uid 0"));
        // A segment made by one user and handed to another (IPC_SET).
        assert!(verify(&file(1000, 0o600), &segment(1001, 1000, 0o600, SHARING_USER)).is_err());
        // Loosened modes.
        assert!(verify(&file(1000, 0o644), &segment(1000, 1000, 0o600, SHARING_USER)).is_err());
        assert!(verify(&file(1000, 0o600), &segment(1000, 1000, 0o666, SHARING_USER)).is_err());
        assert!(verify(&file(0, 0o644), &segment(0, 0, 0o666, SHARING_SHARED)).is_err());
        // The segment records another file.
        let mut elsewhere = segment(1000, 1000, 0o600, SHARING_USER);
        elsewhere.lock_ino = 43;
        assert!(verify(&file(1000, 0o600), &elsewhere).unwrap_err().contains("another file"));
        // Not a regular file; an unknown sharing value.
        assert!(verify(&FileFacts { regular: false, ..file(1000, 0o600) }, &segment(1000, 1000, 0o600, SHARING_USER)).is_err());
        assert!(verify(&file(1000, 0o600), &segment(1000, 1000, 0o600, 7)).is_err());
    }
}
