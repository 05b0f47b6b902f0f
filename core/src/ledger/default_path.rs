//! Where a user's default ledger lives: the one a capped process uses when neither the
//! configuration file nor `FGPU_LEDGER` names one. The shim, `fgpu status` and `fgpu doctor`
//! all ask [`choose`], so they agree.
//!
//! It must be a place no other user can take first. A directory in `/tmp` named after the
//! user can be made by anyone (and then, `/tmp` being sticky, not removed by the user), so:
//!
//! 1. `/run/user/UID/fgpu/`, when `/run/user/UID` is a directory (not a link) of that user
//!    with mode 0700: logind makes it at login, and nobody else can write in it. When it is
//!    gone (logind removes it at logout) while processes of the user's ledger there still
//!    run, that ledger is still the one: new processes reach its file through them.
//! 2. Else the first of `/tmp/fgpu-UID`, `/tmp/fgpu-UID.1` ... `/tmp/fgpu-UID.7` that is
//!    missing (it is then made, 0700) or is a directory of the user's with mode 0700. A
//!    place passed over because someone else holds it is said once per process.
//!
//! The file's name carries the IPC namespace (`ledger-ipc4026531839`): a ledger's data
//! lives in one, and a container that bind-mounts the host's `/run/user/UID` or `/tmp` but
//! has its own IPC namespace gets a ledger of its own rather than meeting the host's.

use std::path::{Path, PathBuf};

/// Base of the per-user runtime directories logind makes.
pub const RUNTIME_BASE: &str = "/run/user";
/// Prefix of the fallback directories in `/tmp`.
pub const TMP_PREFIX: &str = "/tmp/fgpu-";
/// How many fallback directories are tried.
pub const TMP_PLACES: u32 = 8;

/// The default ledger chosen for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultLedger {
    pub path: PathBuf,
    /// Said once per process when a place was passed over (someone else holds it).
    pub note: Option<String>,
}

/// What a candidate directory is, for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Missing,
    /// A directory (not a link) of the user's, mode 0700.
    Own,
    /// Anything else: why it is not the user's own.
    Taken(String),
}

/// The file system as [`choose`] sees it (a trait, so the rules are unit-tested).
pub trait Places {
    fn place(&self, dir: &Path, uid: u32) -> Place;
    /// Whether a live ledger of this user, in this IPC namespace, is bound to `path`.
    fn live_ledger_at(&self, path: &Path) -> bool;
    /// The inode of this process's IPC namespace, if it can be read.
    fn ipc_namespace(&self) -> Option<u64>;
}

/// The name of the default ledger's file in its directory.
pub fn file_name(ipc_namespace: Option<u64>) -> String {
    match ipc_namespace {
        Some(ns) => format!("ledger-ipc{ns}"),
        None => "ledger".to_string(),
    }
}

/// The fallback directories in the order they are tried.
pub fn tmp_places(uid: u32) -> impl Iterator<Item = PathBuf> {
    (0..TMP_PLACES).map(move |i| if i == 0 { PathBuf::from(format!("{TMP_PREFIX}{uid}")) } else { PathBuf::from(format!("{TMP_PREFIX}{uid}.{i}")) })
}

/// Why a user has no default ledger: every place is someone else's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no place is left for the default ledger of uid {uid}: {}; set FGPU_LEDGER to a file in a directory of your own", passed.join("; "))]
pub struct NoPlaceLeft {
    pub uid: u32,
    /// Each place passed over, with why ("/tmp/fgpu-1000 belongs to uid 1001").
    pub passed: Vec<String>,
}

/// The user's default ledger, or why none can be had (every place is someone else's).
pub fn choose(uid: u32, places: &dyn Places) -> Result<DefaultLedger, NoPlaceLeft> {
    let name = file_name(places.ipc_namespace());
    let runtime = Path::new(RUNTIME_BASE).join(uid.to_string());
    let in_runtime = runtime.join("fgpu").join(&name);
    match places.place(&runtime, uid) {
        Place::Own => return Ok(DefaultLedger { path: in_runtime, note: None }),
        Place::Missing if places.live_ledger_at(&in_runtime) => return Ok(DefaultLedger { path: in_runtime, note: None }),
        _ => {}
    }
    let mut passed = Vec::new();
    for dir in tmp_places(uid) {
        match places.place(&dir, uid) {
            Place::Missing | Place::Own => {
                let note = (!passed.is_empty()).then(|| format!("the default ledger of uid {uid} is in {} because {}", dir.display(), passed.join(", and ")));
                return Ok(DefaultLedger { path: dir.join(&name), note });
            }
            Place::Taken(why) => passed.push(format!("{} {why}", dir.display())),
        }
    }
    Err(NoPlaceLeft { uid, passed })
}

/// The real file system.
pub struct OsPlaces;

impl Places for OsPlaces {
    fn place(&self, dir: &Path, uid: u32) -> Place {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Place::Missing,
            Err(e) => Place::Taken(format!("cannot be inspected ({e})")),
            Ok(meta) if meta.file_type().is_symlink() => Place::Taken("is a symbolic link".into()),
            Ok(meta) if !meta.is_dir() => Place::Taken("is not a directory".into()),
            Ok(meta) if meta.uid() != uid => Place::Taken(format!("belongs to uid {}", meta.uid())),
            Ok(meta) if meta.mode() & 0o7777 != 0o700 => Place::Taken(format!("has mode {:o}, not 0700", meta.mode() & 0o7777)),
            Ok(_) => Place::Own,
        }
    }

    fn live_ledger_at(&self, path: &Path) -> bool {
        super::store::live_user_ledger_at(path)
    }

    fn ipc_namespace(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/ipc").ok().map(|m| m.ino())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake {
        places: HashMap<PathBuf, Place>,
        live: Option<PathBuf>,
    }

    impl Places for Fake {
        fn place(&self, dir: &Path, _uid: u32) -> Place {
            self.places.get(dir).cloned().unwrap_or(Place::Missing)
        }
        fn live_ledger_at(&self, path: &Path) -> bool {
            self.live.as_deref() == Some(path)
        }
        fn ipc_namespace(&self) -> Option<u64> {
            Some(7)
        }
    }

    fn fake(places: &[(&str, Place)]) -> Fake {
        Fake { places: places.iter().map(|(p, s)| (PathBuf::from(p), s.clone())).collect(), live: None }
    }

    #[test]
    fn the_runtime_directory_comes_first() {
        let d = choose(1001, &fake(&[("/run/user/1001", Place::Own)])).unwrap();
        assert_eq!(d, DefaultLedger { path: "/run/user/1001/fgpu/ledger-ipc7".into(), note: None });
        // Not the user's own: passed over, silently (most hosts have none for root or in containers).
        for other in [Place::Missing, Place::Taken("belongs to uid 0".into())] {
            let d = choose(1001, &fake(&[("/run/user/1001", other)])).unwrap();
            assert_eq!(d, DefaultLedger { path: "/tmp/fgpu-1001/ledger-ipc7".into(), note: None });
        }
    }

    #[test]
    fn after_logout_a_live_ledger_in_the_runtime_directory_is_kept() {
        let mut f = fake(&[]);
        f.live = Some("/run/user/1001/fgpu/ledger-ipc7".into());
        assert_eq!(choose(1001, &f).unwrap().path, PathBuf::from("/run/user/1001/fgpu/ledger-ipc7"));
    }

    #[test]
    fn a_squatted_place_is_passed_over_and_said() {
        let d = choose(1001, &fake(&[("/tmp/fgpu-1001", Place::Taken("belongs to uid 1000".into())), ("/tmp/fgpu-1001.1", Place::Own)])).unwrap();
        assert_eq!(d.path, PathBuf::from("/tmp/fgpu-1001.1/ledger-ipc7"));
        let note = d.note.unwrap();
        assert!(note.contains("/tmp/fgpu-1001 belongs to uid 1000"), "{note}");
        // Every place taken: an error naming them, never another user's directory.
        let all: Vec<(String, Place)> = tmp_places(1001).map(|p| (p.display().to_string(), Place::Taken("belongs to uid 1000".into()))).collect();
        let refs: Vec<(&str, Place)> = all.iter().map(|(p, s)| (p.as_str(), s.clone())).collect();
        let err = choose(1001, &fake(&refs)).unwrap_err().to_string();
        assert!(err.contains("/tmp/fgpu-1001.7 belongs to uid 1000") && err.contains("FGPU_LEDGER"), "{err}");
    }

    #[test]
    fn the_real_file_system_is_read_without_following_links() {
        let dir = std::env::temp_dir().join(format!("fgpu-default-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let uid = crate::sys::geteuid();
        use std::os::unix::fs::PermissionsExt;
        let own = dir.join("own");
        std::fs::create_dir(&own).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(OsPlaces.place(&own, uid), Place::Own);
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(OsPlaces.place(&own, uid), Place::Taken(why) if why.contains("755")));
        std::os::unix::fs::symlink(&own, dir.join("link")).unwrap();
        assert!(matches!(OsPlaces.place(&dir.join("link"), uid), Place::Taken(why) if why.contains("link")));
        assert_eq!(OsPlaces.place(&dir.join("none"), uid), Place::Missing);
        assert!(matches!(OsPlaces.place(&own, uid + 1), Place::Taken(why) if why.contains("belongs to uid")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
