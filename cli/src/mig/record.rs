//! The record of the MIG instances fgpu created: one JSON file per instance in a directory
//! only its owner can write, so that `fgpu mig gc`, `fgpu mig destroy` and the next
//! `fgpu run --mig` destroy those and no other.
//!
//! Root's record is `/run/fgpu/mig` (a tmpfs: instances do not outlive a reboot either),
//! root-owned, 0755, its files 0644. A user who holds the MIG config capability without
//! being root records in `$XDG_RUNTIME_DIR/fgpu/mig`, and acts only on that: what a tenant
//! can write never leads root to destroy anything. `FGPU_MIG_RECORD` names another directory
//! (tests). A directory or file that is a link, is not the caller's own, or is writable by
//! anyone else is not read (said on stderr): it is hostile input.

use super::error::MigError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Names the record's directory instead of the default (tests).
pub const ENV_RECORD: &str = "FGPU_MIG_RECORD";
/// Root's record.
pub const ROOT_RECORD: &str = "/run/fgpu/mig";

/// The process whose job holds an instance: its PID and its start time (field 22 of
/// `/proc/PID/stat`), so that a reused PID is not taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    pub start: u64,
}

/// One instance fgpu created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub profile: String,
    /// (first memory slice, slice count).
    pub placement: (u32, u32),
    /// The MIG device's UUID, new at each creation: the instance is this entry's only while
    /// the driver still gives it this UUID.
    pub mig_uuid: String,
    /// The `fgpu run --mig` whose job it is; `None` for an instance kept (`fgpu mig
    /// create`, `--keep`), which only `fgpu mig destroy` removes.
    pub owner: Option<Owner>,
    pub uid: u32,
    pub created_unix: u64,
}

impl Entry {
    fn file_name(&self) -> String {
        format!("{}.gi{}.json", self.gpu_uuid, self.gpu_instance)
    }

    /// Whether its job is gone (its owner dead, or its PID now another process's).
    pub fn orphaned(&self) -> bool {
        match self.owner {
            None => false,
            Some(owner) => start_time(owner.pid) != Some(owner.start),
        }
    }
}

/// Field 22 (starttime) of `/proc/PID/stat`; `None` when there is no such process, or it
/// has died and waits to be reaped (state `Z` or `X`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 2..].split(' ');
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The caller's record directory.
pub struct Record {
    pub dir: PathBuf,
    /// Whose it is: only files of this user are read.
    pub uid: u32,
}

fn safe(meta: &std::fs::Metadata, uid: u32) -> bool {
    meta.uid() == uid && meta.mode() & 0o022 == 0
}

impl Record {
    /// The record of the calling (effective) user: root's, `FGPU_MIG_RECORD`, or the user's
    /// own under `$XDG_RUNTIME_DIR`; `Err` naming why there is none.
    pub fn open() -> Result<Record, MigError> {
        let uid = fgpu_core::sys::geteuid();
        let dir = match std::env::var_os(ENV_RECORD).filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None if uid == 0 => PathBuf::from(ROOT_RECORD),
            None => match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
                Some(run) => run.join("fgpu/mig"),
                None => return Err(MigError::Record("no place to record the instances fgpu creates: not root, and XDG_RUNTIME_DIR is not set".into())),
            },
        };
        Ok(Record { dir, uid })
    }

    /// Makes the directory where missing (0755, parents 0755), and checks it is the
    /// caller's own and nobody else's to write.
    fn ready(&self) -> Result<(), MigError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.dir)
            .map_err(|e| MigError::Record(format!("cannot make {}: {e}", self.dir.display())))?;
        self.check()
    }

    fn check(&self) -> Result<(), MigError> {
        let meta = std::fs::symlink_metadata(&self.dir).map_err(|e| MigError::Record(format!("{}: {e}", self.dir.display())))?;
        if !meta.is_dir() || !safe(&meta, self.uid) {
            return Err(MigError::Record(format!("{} is not a directory of uid {} that only it can write: not used", self.dir.display(), self.uid)));
        }
        Ok(())
    }

    /// Writes `entry` (a new file, then renamed into place: readers see all or nothing).
    pub fn put(&self, entry: &Entry) -> Result<(), MigError> {
        self.ready()?;
        let path = self.dir.join(entry.file_name());
        let temp = self.dir.join(format!(".{}.{}", entry.file_name(), std::process::id()));
        let text = serde_json::to_string_pretty(entry).expect("an entry serialises");
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(&temp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            MigError::Record(format!("cannot record {} in {}: {e}", entry.mig_uuid, self.dir.display()))
        })
    }

    /// Removes `entry`'s file.
    pub fn remove(&self, entry: &Entry) {
        let _ = std::fs::remove_file(self.dir.join(entry.file_name()));
    }

    /// Every entry; files that are not the caller's own, are writable by others or do not
    /// parse are left out, each said on stderr. No directory: no entries.
    pub fn entries(&self) -> Vec<Entry> {
        if !self.dir.exists() {
            return Vec::new();
        }
        if let Err(e) = self.check() {
            eprintln!("fgpu mig: {e}");
            return Vec::new();
        }
        let Ok(list) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for item in list.flatten() {
            let path = item.path();
            if path.extension().is_none_or(|e| e != "json") || item.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            match read_entry(&path, self.uid) {
                Ok(entry) => out.push(entry),
                Err(e) => eprintln!("fgpu mig: {}: {e}: ignored", path.display()),
            }
        }
        out.sort_by_key(|e| (e.gpu_index, e.gpu_instance));
        out
    }
}

fn read_entry(path: &Path, uid: u32) -> Result<Entry, EntryError> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || !safe(&meta, uid) {
        return Err(EntryError::NotOwn { uid });
    }
    Ok(serde_json::from_reader(std::io::BufReader::new(file))?)
}

/// Why a file of the record is passed over.
#[derive(Debug, thiserror::Error)]
enum EntryError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a file of uid {uid} that only it can write")]
    NotOwn { uid: u32 },
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(gi: u32) -> Entry {
        Entry {
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            gpu_instance: gi,
            compute_instance: 0,
            profile: "1g.10gb".into(),
            placement: (6, 1),
            mig_uuid: format!("MIG-{gi}"),
            owner: Some(Owner { pid: std::process::id(), start: start_time(std::process::id()).unwrap() }),
            uid: 0,
            created_unix: 1,
        }
    }

    #[test]
    fn entries_round_trip_and_hostile_files_are_not_read() {
        let dir = std::env::temp_dir().join(format!("fgpu-mig-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let record = Record { dir: dir.join("mig"), uid: fgpu_core::sys::geteuid() };
        record.put(&entry(13)).unwrap();
        record.put(&entry(3)).unwrap();
        assert_eq!(record.entries(), vec![entry(3), entry(13)]);
        assert!(!entry(3).orphaned(), "this process owns it");
        let dead = Entry { owner: Some(Owner { pid: std::process::id(), start: 1 }), ..entry(3) };
        assert!(dead.orphaned(), "another start time is another process");
        // A file others may write is hostile.
        let path = record.dir.join(entry(13).file_name());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(record.entries(), vec![entry(3)]);
        // So is a directory others may write.
        std::fs::set_permissions(&record.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(record.entries().is_empty());
        assert!(record.put(&entry(5)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
