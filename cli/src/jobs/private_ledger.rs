//! The private ledger of one `fgpu run`: a fresh directory of its own (`fgpu-run-XXXXXX`,
//! mode 0700, under `$XDG_RUNTIME_DIR` or the temporary directory) whose ledger the job's
//! processes share, removed when the command ends, or kept while processes it started
//! still use it; and the sweep that removes those of runs that are over.

use fgpu_core::ledger::Ledger;
use std::path::{Path, PathBuf};

/// Prefix of the private directories; `mkdtemp` adds six characters.
const PRIVATE_PREFIX: &str = "fgpu-run-";
/// The file in a private directory whose `flock` the `fgpu run` that made it holds for its
/// whole life. The kernel drops the lock when that process ends, however it ends (SIGKILL
/// included), so a lock that can be taken means the owner is gone, whatever has become of
/// its PID since.
const OWNER_LOCK: &str = "owner.lock";

/// A private directory holding a fresh ledger, removed when dropped unless kept.
pub struct PrivateLedger {
    dir: PathBuf,
    pub path: PathBuf,
    keep: bool,
    /// Holds the owner lock (opened close-on-exec: the command does not inherit it).
    _owner: std::fs::File,
}

impl PrivateLedger {
    /// Creates `fgpu-run-XXXXXX` (mode 0700) under `$XDG_RUNTIME_DIR` if usable, else the
    /// temporary directory (`$TMPDIR` or /tmp), after sweeping that place of the stale
    /// directories of earlier runs ([`sweep_stale`]).
    pub fn create() -> std::io::Result<PrivateLedger> {
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute() && writable_dir(p)).unwrap_or_else(std::env::temp_dir);
        sweep_stale(&base);
        let dir = fgpu_core::sys::files::mkdtemp(&base.join(format!("{PRIVATE_PREFIX}XXXXXX")))?;
        let owner = match take_owner_lock(&dir) {
            Ok(owner) => owner,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(PrivateLedger { path: dir.join("ledger"), dir, keep: false, _owner: owner })
    }

    /// After the command ended: keep the directory if processes the command left behind
    /// still use the ledger (they would lose nothing, but `fgpu status` could not find it).
    pub fn finish(&mut self) {
        let Ok(ledger) = Ledger::open_existing(&self.path) else { return };
        ledger.set_still_held(Box::new(crate::driver::lists::may_still_hold));
        ledger.reclaim_dead(None);
        let snapshot = ledger.snapshot(None);
        let alive: Vec<String> = snapshot.processes.iter().filter(|p| p.alive).map(|p| format!("{} ({})", p.pid_here.unwrap_or(p.pid), p.name)).collect();
        if !alive.is_empty() {
            self.keep = true;
            eprintln!(
                "fgpu: the command ended but {} of its processes still use the cap: {}; keeping {} while they run (the next fgpu run removes it once they are gone)",
                alive.len(),
                alive.join(", "),
                self.path.display()
            );
        }
    }
}

impl Drop for PrivateLedger {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Creates the owner lock in a new private directory and takes it. The lock is taken
/// under another name and only then renamed into place, so a sweep by another `fgpu run`
/// never finds the owner lock free while its maker is still taking it.
fn take_owner_lock(dir: &Path) -> std::io::Result<std::fs::File> {
    let unnamed = dir.join(format!(".{OWNER_LOCK}.new"));
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&unnamed)?;
    if !try_flock(&file) {
        return Err(std::io::Error::last_os_error());
    }
    std::fs::rename(&unnamed, dir.join(OWNER_LOCK))?;
    Ok(file)
}

/// Takes an exclusive `flock` on `file` without waiting; false if another holds it.
fn try_flock(file: &std::fs::File) -> bool {
    fgpu_core::sys::files::flock(std::os::fd::AsFd::as_fd(file), fgpu_core::sys::files::FlockWait::NoWait).is_ok()
}

/// Removes the private directories under `base` left by runs that are over: this user's
/// `fgpu-run-XXXXXX` directories whose owner lock can be taken (the `fgpu run` that made it
/// is gone: killed with SIGKILL, or it ended and kept the directory for processes that
/// outlived the command) and whose ledger, if any, no live process uses. A directory
/// without an owner lock is left alone (one being made this instant, or one of an older
/// fgpu). Returns how many were removed.
pub fn sweep_stale(base: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else { return 0 };
    let me = fgpu_core::sys::geteuid();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(PRIVATE_PREFIX) && name.len() == PRIVATE_PREFIX.len() + 6) {
            continue;
        }
        let dir = entry.path();
        // Not followed: a link named like ours is not ours.
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() && meta.uid() == me => {}
            _ => continue,
        }
        let Ok(lock) = std::fs::File::open(dir.join(OWNER_LOCK)) else { continue };
        // Held while we look and remove, so two sweeps never race over one directory.
        if !try_flock(&lock) || still_used(&dir.join("ledger")) {
            continue;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a live process uses the ledger at `path`. A ledger that cannot be read is taken
/// to be in use (it may be being created this instant); no ledger at all, or one no process
/// is attached to (it went away with its last process), is not.
fn still_used(path: &Path) -> bool {
    match Ledger::open_existing(path) {
        Ok(ledger) => {
            ledger.set_still_held(Box::new(crate::driver::lists::may_still_hold));
            ledger.reclaim_dead(None);
            ledger.snapshot(None).processes.iter().any(|p| p.alive)
        }
        Err(fgpu_core::ledger::LedgerError::NotInUse { .. }) => false,
        Err(_) => path.exists(),
    }
}

fn writable_dir(path: &Path) -> bool {
    path.is_dir() && fgpu_core::sys::files::access(path, libc::W_OK | libc::X_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_private_directories_are_swept_live_ones_kept() {
        let base = std::env::temp_dir().join(format!("fgpu-run-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let make = |name: &str, lock: bool| {
            let dir = base.join(name);
            std::fs::create_dir(&dir).unwrap();
            if lock {
                std::fs::write(dir.join(OWNER_LOCK), b"").unwrap();
            }
            dir
        };
        // Owner gone (nobody holds its lock), no ledger: swept.
        let stale = make("fgpu-run-aaaaaa", true);
        // Owner alive: this test holds the lock, as a running fgpu run does.
        let live = make("fgpu-run-bbbbbb", true);
        let held = std::fs::File::open(live.join(OWNER_LOCK)).unwrap();
        assert!(try_flock(&held));
        // Owner gone, but a live process still uses the ledger: kept.
        let used = make("fgpu-run-cccccc", true);
        let ledger = Ledger::open_or_create(&used.join("ledger")).unwrap();
        let _slot = ledger.join().unwrap();
        // No owner lock at all (being made, or an older fgpu's), or not ours by name: kept.
        let unlocked = make("fgpu-run-dddddd", false);
        let other_name = make("fgpu-run-toolong", true);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!stale.exists());
        for kept in [&live, &used, &unlocked, &other_name] {
            assert!(kept.exists(), "{} must be kept", kept.display());
        }
        // Once the holder of the ledger leaves, the directory goes at the next sweep.
        drop(ledger);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!used.exists());
        drop(held);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!live.exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn private_ledger_is_private_and_removed() {
        let p = PrivateLedger::create().unwrap();
        let dir = p.path.parent().unwrap().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("fgpu-run-"));
        drop(p);
        assert!(!dir.exists());
    }
}
