//! The host files a spec mounts: written atomically, root-owned (or the owner's), never in a
//! directory that group or others may write.

use crate::{preload_text, shimpath, LIB_SUBDIR, PRELOAD_FILE};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a payload, a directory or a file could not be read or written; each names its path.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot read {} (the shim that {} loads; install both in one directory): {source}", shim.display(), front.display())]
    ReadShim { shim: PathBuf, front: PathBuf, source: std::io::Error },
    /// The path cannot be made absolute, or its metadata cannot be read.
    #[error("{}: {source}", path.display())]
    Path { path: PathBuf, source: std::io::Error },
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} is writable by group or others (mode {mode:o}): anyone who can write it could lift the caps; chmod go-w it", path.display())]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error("cannot chown {}: {source}", path.display())]
    Chown { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("--owner {text:?}: no user {user:?}")]
    NoUser { text: String, user: String },
    #[error("--owner {text:?}: no group {group:?}")]
    NoGroup { text: String, group: String },
}

/// What every container of a spec runs: the front (`libfgpu.so`), the shim it loads
/// (`libfgpu_shim.so`, beside it) and the `fgpu` command, read into memory before anything
/// is written, so that a missing file leaves nothing half-written behind.
#[derive(Debug, Clone)]
pub struct Payload {
    pub front: PathBuf,
    front_bytes: Vec<u8>,
    shim_bytes: Vec<u8>,
    fgpu_bytes: Option<Vec<u8>>,
}

impl Payload {
    /// Reads the front at `front`, the shim beside it, and the `fgpu` command at `fgpu`
    /// (which a container runs as `/usr/lib/fgpu/fgpu status`; left out when `None`).
    pub fn read(front: &Path, fgpu: Option<&Path>) -> Result<Payload, FileError> {
        let front_bytes = std::fs::read(front).map_err(|source| FileError::Read { path: front.to_path_buf(), source })?;
        let shim = shimpath::companion(front);
        let shim_bytes = std::fs::read(&shim).map_err(|source| FileError::ReadShim { shim: shim.clone(), front: front.to_path_buf(), source })?;
        let fgpu_bytes = match fgpu {
            Some(path) => Some(std::fs::read(path).map_err(|source| FileError::Read { path: path.to_path_buf(), source })?),
            None => None,
        };
        Ok(Payload { front: front.to_path_buf(), front_bytes, shim_bytes, fgpu_bytes })
    }

    /// The bytes of the front, `libfgpu.so`.
    pub fn front_bytes(&self) -> &[u8] {
        &self.front_bytes
    }

    /// Writes `lib/` (the libraries and the command, 0755) and `ld.so.preload` (0644) under
    /// `config_dir`, which must exist; each file is replaced atomically, so a container that
    /// runs reads either the old file or the new one.
    pub fn install(&self, config_dir: &Path, owner: Option<(u32, u32)>) -> Result<(), FileError> {
        let lib_dir = config_dir.join(LIB_SUBDIR);
        prepare_dir(&lib_dir, owner)?;
        write_file(&lib_dir.join(shimpath::FRONT_NAME), &self.front_bytes, 0o755, owner)?;
        write_file(&lib_dir.join(shimpath::SHIM_IMPL_NAME), &self.shim_bytes, 0o755, owner)?;
        if let Some(fgpu) = &self.fgpu_bytes {
            write_file(&lib_dir.join("fgpu"), fgpu, 0o755, owner)?;
        }
        write_file(&config_dir.join(PRELOAD_FILE), preload_text().as_bytes(), 0o644, owner)
    }
}

pub fn absolute(path: &Path) -> Result<PathBuf, FileError> {
    std::path::absolute(path).map_err(|source| FileError::Path { path: path.to_path_buf(), source })
}

pub fn create_dir(dir: &Path) -> Result<(), FileError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(|source| FileError::Create { path: dir.to_path_buf(), source })
}

/// Creates the directory (0755) or checks that an existing one is not writable by group
/// or others (whoever can write it can swap a container's cap), and gives it to `owner`.
pub fn prepare_dir(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), FileError> {
    create_dir(dir)?;
    let meta = std::fs::metadata(dir).map_err(|source| FileError::Path { path: dir.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(FileError::NotADirectory { path: dir.to_path_buf() });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(FileError::OpenToOthers { path: dir.to_path_buf(), mode: meta.mode() & 0o7777 });
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|source| FileError::Chown { path: dir.to_path_buf(), source })?;
    }
    Ok(())
}

/// Writes a file atomically (a new inode renamed into place) with this mode and owner,
/// synced to disk before the rename.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> Result<(), FileError> {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Unique per process and call: two threads writing the same file never share one.
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{name}.{}.{serial}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|source| FileError::Write { path: path.to_path_buf(), source })
}

/// `USER`, `USER:GROUP`, `UID` or `UID:GID` to numbers; a user's group defaults to its
/// primary group.
pub fn resolve_owner(text: &str) -> Result<(u32, u32), FileError> {
    let (user, group) = match text.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (text, None),
    };
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, None),
        Err(_) => {
            let (uid, gid) = lookup_user(user).ok_or_else(|| FileError::NoUser { text: text.into(), user: user.into() })?;
            (uid, Some(gid))
        }
    };
    let gid = match group {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => lookup_group(g).ok_or_else(|| FileError::NoGroup { text: text.into(), group: g.into() })?,
        },
        None => primary.unwrap_or(uid),
    };
    Ok((uid, gid))
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: zeroed `passwd` is a valid value of a plain C struct of integers and pointers.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: models getpwnam_r(3): a NUL-terminated name, a struct and a buffer we own with
    // its true length; `result` is set to `&mut pwd` or null.
    let rc = unsafe { libc::getpwnam_r(name.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    (rc == 0 && !result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
}

fn lookup_group(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: zeroed `group` is a valid value of a plain C struct of integers and pointers.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: models getgrnam_r(3), as getpwnam_r above.
    let rc = unsafe { libc::getgrnam_r(name.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut result) };
    (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_resolve_by_number_and_name() {
        assert_eq!(resolve_owner("1000").unwrap(), (1000, 1000));
        assert_eq!(resolve_owner("1000:5").unwrap(), (1000, 5));
        assert_eq!(resolve_owner("root").unwrap(), (0, 0));
        assert_eq!(resolve_owner("root:0").unwrap(), (0, 0));
        assert_eq!(resolve_owner("no-such-user-fgpu").unwrap_err().to_string(), r#"--owner "no-such-user-fgpu": no user "no-such-user-fgpu""#);
        assert!(matches!(resolve_owner("0:no-such-group-fgpu"), Err(FileError::NoGroup { .. })));
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fgpu-cdi-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_front_without_its_shim_is_refused_before_anything_is_written() {
        let dir = temp_dir("payload");
        std::fs::write(dir.join("libfgpu.so"), b"front").unwrap();
        let err = Payload::read(&dir.join("libfgpu.so"), None).unwrap_err().to_string();
        assert!(err.contains("libfgpu_shim.so") && err.contains("install both"), "{err}");
        std::fs::write(dir.join("libfgpu_shim.so"), b"shim").unwrap();
        let payload = Payload::read(&dir.join("libfgpu.so"), None).unwrap();
        let out = dir.join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
        payload.install(&out, None).unwrap();
        assert_eq!(std::fs::read(out.join("lib/libfgpu.so")).unwrap(), b"front");
        assert_eq!(std::fs::read(out.join("lib/libfgpu_shim.so")).unwrap(), b"shim");
        assert!(!out.join("lib/fgpu").exists());
        assert_eq!(std::fs::read_to_string(out.join("ld.so.preload")).unwrap(), "/usr/lib/fgpu/libfgpu.so\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_file_replaces_atomically_with_the_mode_asked() {
        let dir = temp_dir("write");
        let path = dir.join("f");
        write_file(&path, b"one", 0o644, None).unwrap();
        write_file(&path, b"two", 0o600, None).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
