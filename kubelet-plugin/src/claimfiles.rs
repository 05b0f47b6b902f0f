//! The files of a prepared claim on the host, and who may reach them.
//!
//! Under `--state-dir`:
//! - `lib/` and `ld.so.preload`, shared by every claim (written at start), 0755 and 0644:
//!   every container of every claim mounts them read-only;
//! - `claims/` (0700, root's): nobody but root can list, open, lock or create anything
//!   under it. The container runtime, root, bind-mounts the two directories below into the
//!   claim's containers; inside them only the mounted directory itself is seen;
//! - `claims/<uid>/` (0700): the claim's;
//! - `claims/<uid>/config/fgpu.conf`: the caps (root-owned 0644, mounted read-only at
//!   `/etc/fgpu`), and beside it the claim's ledger keeper's socket `ledger.sock` (0666)
//!   and its record `ledger.id` (0644): the keeper (`fgpu_core::ledger::keeper`, one per
//!   claim, on a thread of this plugin) hands the ledger's memory file to every process of
//!   every pod of the claim;
//! - `claims/<uid>/ledger/`: the claim's ledger directory, a 16 MiB tmpfs where mounts are
//!   allowed (a plain directory otherwise, with one line in the log), mounted read-write at
//!   `/run/fgpu` in every container of the claim. It holds the ledger's lock file `ledger`
//!   (root's, 0666: every process of the claim locks it; the keeper makes it), and is
//!   writable by all and sticky at its root (a claim prepared by an earlier release has its
//!   first process make the lock file); on the host it is reachable through `claims/` only,
//!   so by root.
//!
//! and `fgpu-claim-<uid>.json` under `--cdi-root` (0644: container runtimes read it). A
//! claim on MIG partitions has its instances' `nvidia-caps` access nodes (host paths under
//! `--device-root`) and `CUDA_VISIBLE_DEVICES`/`NVIDIA_VISIBLE_DEVICES` naming their MIG
//! devices in its device; its caps are by MIG UUID, within each instance's memory.
//! Directories an earlier release made 0755 are set to 0700 when the plugin starts.

use crate::checkpoint::PreparedClaim;
use fgpu_cdi::claim::ClaimCap;
use fgpu_cdi::files::{create_dir, write_file};
use fgpu_cdi::Gpu;
use fgpu_core::ledger::keeper::{self, Keeper, KeeperPaths, Serving, Settled};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Size and mode of a claim's ledger tmpfs: the ledger's lock file is a few hundred bytes.
const LEDGER_TMPFS: &str = "size=16m,mode=1777";
/// `claims/` and each claim's directory.
pub const PRIVATE: u32 = 0o700;

/// Why a claim's files could not be written or removed; each names its path.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFilesError {
    #[error("claim UID {0:?} is not a Kubernetes UID")]
    BadUid(String),
    #[error("{0}")]
    Files(#[from] fgpu_cdi::files::FileError),
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} belongs to uid {uid}, not to this plugin's user", path.display())]
    NotOurs { path: PathBuf, uid: u32 },
    #[error("cannot chmod {}: {source}", path.display())]
    Chmod { path: PathBuf, source: std::io::Error },
    #[error("cannot keep the claim's ledger in {}: {reason}", dir.display())]
    Keep { dir: PathBuf, reason: String },
    #[error("cannot serve the claim's ledger in {}: {reason}", dir.display())]
    Serve { dir: PathBuf, reason: String },
    #[error("cannot remove {}: {source}", path.display())]
    Remove { path: PathBuf, source: std::io::Error },
    #[error("{} has a NUL byte", path.display())]
    NulByte { path: PathBuf },
    #[error("{0}")]
    Mount(#[source] std::io::Error),
    #[error("cannot unmount {}: {source}", path.display())]
    Unmount { path: PathBuf, source: std::io::Error },
}

/// The CDI device name of a claim's device.
pub fn fgpu_device_name(uid: &str) -> String {
    format!("claim-{uid}")
}

/// A claim UID as kubelet passes it: lowercase letters, digits and `-` (it names files).
pub fn check_uid(uid: &str) -> Result<(), ClaimFilesError> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| alnum(b) || b == b'-')
        && uid.bytes().next().is_some_and(alnum)
        && uid.bytes().last().is_some_and(alnum);
    if ok {
        Ok(())
    } else {
        Err(ClaimFilesError::BadUid(uid.into()))
    }
}

pub struct ClaimFiles {
    pub cdi_root: PathBuf,
    pub state_dir: PathBuf,
    /// `fgpu service`'s directory, mounted when it exists.
    pub service_dir: PathBuf,
    /// The host's root for device nodes (`/`; tests give another).
    pub device_root: PathBuf,
    warned_no_tmpfs: AtomicBool,
    /// The keepers of the served claims' ledgers, by claim UID.
    keepers: Mutex<BTreeMap<String, Serving>>,
}

/// A directory with exactly `mode`, root's (or this process's user's): created so, or an
/// existing one set so. A symlink in its place is refused.
fn private_dir(dir: &Path, mode: u32) -> Result<(), ClaimFilesError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(ClaimFilesError::Create { path: dir.to_path_buf(), source }),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|source| ClaimFilesError::Stat { path: dir.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(ClaimFilesError::NotADirectory { path: dir.to_path_buf() });
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(ClaimFilesError::NotOurs { path: dir.to_path_buf(), uid: meta.uid() });
    }
    if meta.mode() & 0o7777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|source| ClaimFilesError::Chmod { path: dir.to_path_buf(), source })?;
    }
    Ok(())
}

impl ClaimFiles {
    pub fn new(cdi_root: PathBuf, state_dir: PathBuf, service_dir: PathBuf) -> ClaimFiles {
        ClaimFiles {
            cdi_root,
            state_dir,
            service_dir,
            device_root: PathBuf::from("/"),
            warned_no_tmpfs: AtomicBool::new(false),
            keepers: Mutex::new(BTreeMap::new()),
        }
    }

    fn claims_dir(&self) -> PathBuf {
        self.state_dir.join("claims")
    }

    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.claims_dir().join(uid)
    }

    /// The claim's spec file.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_root.join(format!("fgpu-claim-{uid}.json"))
    }

    /// Sets `claims/` and every claim's directory to 0700 (an earlier release made them 0755).
    pub fn make_private(&self) -> Result<(), ClaimFilesError> {
        private_dir(&self.claims_dir(), PRIVATE)?;
        for uid in self.claims_on_disk() {
            let dir = self.claim_dir(&uid);
            if dir.is_dir() {
                private_dir(&dir, PRIVATE)?;
            }
        }
        Ok(())
    }

    /// The UIDs of the claims whose spec or directory is on disk.
    pub fn claims_on_disk(&self) -> Vec<String> {
        let names = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()).unwrap_or_default()
        };
        let mut uids: Vec<String> = names(&self.cdi_root)
            .iter()
            .filter_map(|n| n.strip_prefix("fgpu-claim-")?.strip_suffix(".json").map(str::to_string))
            .chain(names(&self.claims_dir()))
            .filter(|uid| check_uid(uid).is_ok())
            .collect();
        uids.sort();
        uids.dedup();
        uids
    }

    /// Writes the claim's configuration, ledger directory and spec. A claim with admin access
    /// only has none: it gets NVIDIA's device alone.
    pub fn write(&self, uid: &str, claim: &PreparedClaim) -> Result<(), ClaimFilesError> {
        if claim.caps.iter().all(|c| c.admin) {
            return Ok(());
        }
        let dir = self.claim_dir(uid);
        private_dir(&self.claims_dir(), PRIVATE)?;
        private_dir(&dir, PRIVATE)?;
        let config_dir = dir.join("config");
        private_dir(&config_dir, 0o755)?;
        let caps: Vec<ClaimCap> = claim
            .caps
            .iter()
            .map(|c| ClaimCap {
                gpu: Gpu { index: c.index, uuid: c.uuid.clone(), total: c.total },
                memory: c.memory,
                compute_millipercent: if c.admin { None } else { c.compute_millipercent },
            })
            .collect();
        let what = format!("the ResourceClaim {}/{} (uid {uid})", claim.namespace, claim.name);
        write_file(&config_dir.join(fgpu_cdi::CONFIG_FILE), fgpu_cdi::claim::config_text(&what, &caps, claim.served_ledger).as_bytes(), 0o644, None)?;
        let ledger_dir = dir.join("ledger");
        self.ledger_dir(&ledger_dir)?;
        if claim.served_ledger {
            self.keep_ledger(uid, &what, &config_dir, &ledger_dir)?;
        }
        let service = self.service_dir.is_dir().then_some(self.service_dir.as_path());
        let mut spec = fgpu_cdi::claim::spec(&fgpu_device_name(uid), &self.state_dir, &config_dir, &ledger_dir, service);
        if !claim.mig.is_empty() {
            let node = |minor: u32| {
                let path = format!("/{}/nvidia-cap{minor}", crate::mig::CAPS_DIR);
                (path, crate::mig::cap_node(&self.device_root, minor).display().to_string())
            };
            let nodes: Vec<(String, String)> = claim.mig.iter().flat_map(|m| [node(m.caps_minors.0), node(m.caps_minors.1)]).collect();
            // Every device of the claim: its whole GPUs' UUIDs and its instances' MIG UUIDs.
            let mut uuids: Vec<&str> = claim.caps.iter().map(|c| c.uuid.as_str()).collect();
            uuids.dedup();
            let env = [format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")), format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))];
            fgpu_cdi::claim::add_device_edits(&mut spec, &nodes, &env);
        }
        create_dir(&self.cdi_root)?;
        let text = serde_json::to_string_pretty(&spec).expect("a spec serialises") + "\n";
        Ok(write_file(&self.spec_path(uid), text.as_bytes(), 0o644, None)?)
    }

    /// The claim's ledger directory: a tmpfs of its own where this process may mount one,
    /// else a plain directory; either way writable by every user, sticky (it is reached
    /// through the claim's 0700 directory only).
    fn ledger_dir(&self, dir: &Path) -> Result<(), ClaimFilesError> {
        create_dir(dir)?;
        if is_mount_point(dir) {
            return Ok(());
        }
        match mount_tmpfs(dir) {
            Ok(()) => return Ok(()),
            Err(e) => {
                if !self.warned_no_tmpfs.swap(true, Ordering::Relaxed) {
                    crate::log(&format!(
                        "cannot mount a tmpfs for a claim's ledger ({e}): the ledger directories are plain directories of {}, not limited in size",
                        self.state_dir.display()
                    ));
                }
            }
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(|source| ClaimFilesError::Chmod { path: dir.to_path_buf(), source })
    }

    /// Starts the keeper of the claim's ledger, unless it runs: it makes the ledger, or
    /// takes over the one the claim's processes use (after the plugin restarted), and
    /// serves it on the socket in the claim's configuration directory.
    fn keep_ledger(&self, uid: &str, what: &str, config_dir: &Path, ledger_dir: &Path) -> Result<(), ClaimFilesError> {
        let mut keepers = self.keepers.lock().unwrap_or_else(|e| e.into_inner());
        if keepers.contains_key(uid) {
            return Ok(());
        }
        let paths = KeeperPaths {
            lock: ledger_dir.join("ledger"),
            recorded: PathBuf::from(fgpu_cdi::LEDGER),
            socket: config_dir.join(fgpu_core::ledger::served::SOCKET_NAME),
            label: fgpu_device_name(uid),
        };
        let (kept, settled) = Keeper::open(paths).map_err(|e| ClaimFilesError::Keep { dir: ledger_dir.to_path_buf(), reason: e.to_string() })?;
        match settled {
            Settled::Created => {}
            Settled::Recovered { from } => crate::log(&format!("{what}: the ledger its processes use is kept on, taken over from PID {from}")),
            Settled::Waiting(why) => crate::log(&format!("{what}: its processes use a ledger this plugin cannot take over yet: {why}")),
        }
        let serving = keeper::serve(kept).map_err(|e| ClaimFilesError::Serve { dir: config_dir.to_path_buf(), reason: e.to_string() })?;
        keepers.insert(uid.to_string(), serving);
        Ok(())
    }

    /// Why the keeper of a claim's ledger refuses the claim's processes, if it does.
    pub fn ledger_problem(&self, uid: &str) -> Option<String> {
        self.keepers.lock().unwrap_or_else(|e| e.into_inner()).get(uid).and_then(|s| s.keeper().waiting())
    }

    /// Removes the claim's spec and directory (unmounting its ledger).
    pub fn remove(&self, uid: &str) -> Result<(), ClaimFilesError> {
        // The keeper stops first: its thread ends, its descriptor of the memory file goes.
        drop(self.keepers.lock().unwrap_or_else(|e| e.into_inner()).remove(uid));
        let spec = self.spec_path(uid);
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ClaimFilesError::Remove { path: spec, source }),
        }
        let dir = self.claim_dir(uid);
        let ledger = dir.join("ledger");
        if is_mount_point(&ledger) {
            unmount(&ledger)?;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ClaimFilesError::Remove { path: dir, source }),
        }
    }
}

/// Whether `dir` is a mount point: another file system than its parent's.
fn is_mount_point(dir: &Path) -> bool {
    let (Ok(this), Some(Ok(parent))) = (std::fs::symlink_metadata(dir), dir.parent().map(std::fs::symlink_metadata)) else { return false };
    this.is_dir() && this.dev() != parent.dev()
}

fn c_path(path: &Path) -> Result<std::ffi::CString, ClaimFilesError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| ClaimFilesError::NulByte { path: path.to_path_buf() })
}

fn mount_tmpfs(dir: &Path) -> Result<(), ClaimFilesError> {
    let target = c_path(dir)?;
    let options = std::ffi::CString::new(LEDGER_TMPFS).expect("no NUL");
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(c"fgpu-ledger".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, options.as_ptr().cast())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(ClaimFilesError::Mount(std::io::Error::last_os_error()))
    }
}

fn unmount(dir: &Path) -> Result<(), ClaimFilesError> {
    let target = c_path(dir)?;
    // SAFETY: umount2(2) with a NUL-terminated path that outlives the call. MNT_DETACH:
    // a process still inside (none should be, once kubelet unprepares) keeps it alive.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(ClaimFilesError::Unmount { path: dir.to_path_buf(), source: std::io::Error::last_os_error() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_name_files_safely() {
        assert!(check_uid("8e2b7f0a-54c1-4c1b-9d68-2f1d0f7c3a11").is_ok());
        for bad in ["", "../x", "a/b", "A", "-a", "a b", &"a".repeat(129)] {
            assert!(check_uid(bad).is_err(), "{bad}");
        }
        assert_eq!(check_uid("a/b").unwrap_err().to_string(), r#"claim UID "a/b" is not a Kubernetes UID"#);
    }

    #[test]
    fn private_dirs_are_made_and_set_right() {
        let dir = std::env::temp_dir().join(format!("fgpu-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let claims = dir.join("claims");
        private_dir(&claims, PRIVATE).unwrap();
        assert_eq!(std::fs::metadata(&claims).unwrap().mode() & 0o7777, 0o700);
        std::fs::set_permissions(&claims, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&claims, PRIVATE).unwrap();
        assert_eq!(std::fs::metadata(&claims).unwrap().mode() & 0o7777, 0o700, "an earlier release's 0755 is set right");
        std::os::unix::fs::symlink(&claims, dir.join("link")).unwrap();
        assert!(matches!(private_dir(&dir.join("link"), PRIVATE), Err(ClaimFilesError::NotADirectory { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
