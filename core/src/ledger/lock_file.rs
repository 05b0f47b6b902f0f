//! A ledger's lock file: who may share it ([`Sharing`], the mode of the file and of the
//! segment), opening it as a member (the per-user directory checked, a link or another
//! user's file refused), the hint it holds to the segment, and what its locks say (in use;
//! by an older fgpu).

use super::error::LedgerError;
use super::layout::*;
use super::lock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

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
    pub(super) fn mode(self) -> u32 {
        match self {
            Sharing::User | Sharing::Private => 0o600,
            Sharing::Shared => 0o666,
        }
    }

    /// Whether the file and the segment must be this user's own.
    pub(super) fn own_only(self) -> bool {
        self != Sharing::Shared
    }
}

pub(super) fn io_err<'a>(path: &'a Path, op: &'static str) -> impl Fn(io::Error) -> LedgerError + 'a {
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

/// The per-user default directory must be the user's own: not a link, owned by them, and
/// not open to group or others (a directory someone else made there could be theirs).
pub(super) fn check_user_dir(dir: &Path) -> Result<(), LedgerError> {
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

pub(super) fn open_lock_file(path: &Path, sharing: Sharing) -> Result<File, LedgerError> {
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

pub(super) fn read_hint(file: &File) -> Option<Hint> {
    let mut head = [0u8; HINT_SIZE];
    file.read_at(&mut head, 0).ok().filter(|n| *n == HINT_SIZE).and_then(|_| Hint::from_bytes(&head))
}

/// The format version of an older fgpu whose processes still use this file as their ledger
/// (format 2 kept the data in the file and locked its slots at `LOCK_BASE + 16 + 2 * slot`).
pub(super) fn older_format_in_use(file: &File) -> Option<u32> {
    let mut head = [0u8; 12];
    file.read_at(&mut head, 0).ok().filter(|n| *n == 12)?;
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let older = u64::from_le_bytes(head[..8].try_into().unwrap()) == MAGIC && version < VERSION;
    (older && lock::ofd_any_held(file.as_fd(), LOCK_BASE + 16, 2 * MAX_SLOTS as i64).unwrap_or(false)).then_some(version)
}

/// Whether any slot's liveness lock on this lock file is held: someone uses it.
pub(super) fn any_slot_locked(file: &File) -> bool {
    lock::ofd_any_held(file.as_fd(), alive_lock(0), 2 * MAX_SLOTS as i64).unwrap_or(true)
}

pub(super) fn write_hint(file: &File, shmid: i32, header: &Header, ipcns: u64) {
    let hint = Hint { magic: HINT_MAGIC, version: VERSION, shmid, ledger_id: [header.ledger_id[0].load(Relaxed), header.ledger_id[1].load(Relaxed)], ipcns };
    // Best effort: a full disk or a read-only file only costs the next process a search.
    let _ = file.write_all_at(&hint.to_bytes(), 0);
}
