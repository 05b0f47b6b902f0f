//! Whether a tool running as another user may act on a ledger it observes ([`verify`]),
//! from what the kernel says of the lock file and of the segment.

use super::layout::*;
use crate::sys::shm_stat;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering::Relaxed;

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

pub(super) fn file_facts(file: &File) -> FileFacts {
    match file.metadata() {
        Ok(meta) => FileFacts { regular: meta.file_type().is_file(), dev: meta.dev(), ino: meta.ino(), uid: meta.uid(), mode: meta.mode() & 0o7777 },
        Err(_) => FileFacts { regular: false, dev: 0, ino: 0, uid: u32::MAX, mode: 0 },
    }
}

pub(super) fn segment_facts(shmid: i32, header: &Header) -> SegmentFacts {
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
/// Why a tool may not act on a ledger ([`verify`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("its file is not a regular file")]
    NotRegular,
    #[error("its shared memory records another file (device {recorded_dev}, inode {recorded_ino}) than the one its path names (device {dev}, inode {ino})")]
    OtherFile { recorded_dev: u64, recorded_ino: u64, dev: u64, ino: u64 },
    #[error("a per-user ledger whose file belongs to uid {file_uid} but whose shared memory was made by uid {cuid} and belongs to uid {uid}")]
    Owners { file_uid: u32, cuid: u32, uid: u32 },
    #[error("a per-user ledger whose file has mode {file_mode:o} and shared memory mode {segment_mode:o} (fgpu makes both 0600)")]
    UserModes { file_mode: u32, segment_mode: u32 },
    #[error("a shared ledger whose file has mode {0:o} (fgpu makes it 0666)")]
    SharedMode(u32),
    #[error("its shared memory names an unknown kind of sharing ({0})")]
    UnknownSharing(u32),
}

pub fn verify(file: &FileFacts, segment: &SegmentFacts) -> Result<(), VerifyError> {
    if !file.regular {
        return Err(VerifyError::NotRegular);
    }
    if (segment.lock_dev, segment.lock_ino) != (file.dev, file.ino) {
        return Err(VerifyError::OtherFile { recorded_dev: segment.lock_dev, recorded_ino: segment.lock_ino, dev: file.dev, ino: file.ino });
    }
    match segment.sharing {
        SHARING_USER => {
            if !(file.uid == segment.cuid && segment.cuid == segment.uid) {
                return Err(VerifyError::Owners { file_uid: file.uid, cuid: segment.cuid, uid: segment.uid });
            }
            if file.mode != 0o600 || segment.mode != 0o600 {
                return Err(VerifyError::UserModes { file_mode: file.mode, segment_mode: segment.mode });
            }
            Ok(())
        }
        SHARING_SHARED if file.mode == 0o666 => Ok(()),
        SHARING_SHARED => Err(VerifyError::SharedMode(file.mode)),
        other => Err(VerifyError::UnknownSharing(other)),
    }
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
        assert!(verify(&file(0, 0o600), &segment(1000, 1000, 0o600, SHARING_USER)).unwrap_err().to_string().contains("uid 0"));
        // A segment made by one user and handed to another (IPC_SET).
        assert!(verify(&file(1000, 0o600), &segment(1001, 1000, 0o600, SHARING_USER)).is_err());
        // Loosened modes.
        assert!(verify(&file(1000, 0o644), &segment(1000, 1000, 0o600, SHARING_USER)).is_err());
        assert!(verify(&file(1000, 0o600), &segment(1000, 1000, 0o666, SHARING_USER)).is_err());
        assert!(verify(&file(0, 0o644), &segment(0, 0, 0o666, SHARING_SHARED)).is_err());
        // The segment records another file.
        let mut elsewhere = segment(1000, 1000, 0o600, SHARING_USER);
        elsewhere.lock_ino = 43;
        assert!(verify(&file(1000, 0o600), &elsewhere).unwrap_err().to_string().contains("another file"));
        // Not a regular file; an unknown sharing value.
        assert!(verify(&FileFacts { regular: false, ..file(1000, 0o600) }, &segment(1000, 1000, 0o600, SHARING_USER)).is_err());
        assert!(verify(&file(1000, 0o600), &segment(1000, 1000, 0o600, 7)).is_err());
    }
}
