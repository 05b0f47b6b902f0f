//! Opening a file that another process named, as that process reaches it, and nowhere else.
//!
//! `fgpu status --all` and `fgpu exporter --all` run as root and find each ledger's path in
//! its segment's header, which every process of that ledger can write. Such a path is
//! resolved inside the root directory of a process that maps the segment (its
//! `/proc/PID/root`), never in the caller's:
//!
//! * with `openat2(2)` and `RESOLVE_IN_ROOT` (Linux 5.6+): `..` and absolute symbolic links
//!   stop at that root, and magic links (`/proc/self/fd/N`) are refused;
//! * elsewhere (`ENOSYS` on older kernels, `EPERM` under a seccomp filter that refuses the
//!   call), one component at a time with `O_PATH | O_NOFOLLOW`, refusing `..` and every
//!   symbolic link.
//!
//! Either way the result is only opened for reading once it is known to be a regular file
//! (opening a FIFO or a device can block or act), by reopening the `O_PATH` descriptor.
//! The caller keeps a descriptor of `/proc/PID` from before it looked at the process, so a
//! PID reused meanwhile is caught ([`ProcessDir`]).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Set (to anything) in the environment of `fgpu`: resolve by walking, as on a kernel
/// without `openat2` (for the tests of that path).
pub const ENV_FORCE_WALK: &str = "FGPU_RESOLVE_BY_WALK";

/// How a path was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Openat2,
    Walk,
}

fn cstr(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

/// A process's `/proc/PID` directory, held open: everything read through it is that
/// process's, even if the PID is reused meanwhile (reads then fail).
#[derive(Debug)]
pub struct ProcessDir {
    pub pid: u32,
    dir: OwnedFd,
}

impl ProcessDir {
    pub fn open(proc_root: &Path, pid: u32) -> io::Result<ProcessDir> {
        let path = cstr(proc_root.join(pid.to_string()).as_os_str().as_bytes())?;
        Ok(ProcessDir { pid, dir: crate::sys::openat(None, &path, libc::O_DIRECTORY | libc::O_RDONLY)? })
    }

    /// Opens `name` (`maps`, `ns/ipc`, `map_files/...`) of this process for reading.
    pub fn open_entry(&self, name: &str) -> io::Result<File> {
        Ok(File::from(crate::sys::openat(Some(self.dir.as_fd()), &cstr(name.as_bytes())?, libc::O_RDONLY | libc::O_NOCTTY)?))
    }

    /// The inode of one of its namespaces (`ipc`, `pid`, `mnt`).
    pub fn ns_inode(&self, kind: &str) -> io::Result<u64> {
        let fd = crate::sys::openat(Some(self.dir.as_fd()), &cstr(format!("ns/{kind}").as_bytes())?, libc::O_PATH)?;
        Ok(crate::sys::fstat(fd.as_fd())?.st_ino)
    }

    /// The process's root directory, as a descriptor to resolve paths under.
    pub fn root(&self) -> io::Result<OwnedFd> {
        crate::sys::openat(Some(self.dir.as_fd()), c"root", libc::O_PATH | libc::O_DIRECTORY)
    }

    /// The user the process runs as (the owner of its `/proc/PID`).
    pub fn owner_uid(&self) -> io::Result<u32> {
        Ok(crate::sys::fstat(self.dir.as_fd())?.st_uid)
    }

    /// Whether the process this directory was opened for still runs (not a reused PID).
    pub fn alive(&self) -> bool {
        crate::sys::openat(Some(self.dir.as_fd()), c"stat", libc::O_RDONLY).is_ok()
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }
}

/// Opens `path` for reading as the process whose root directory is `root` reaches it; only
/// a regular file is opened.
pub fn open_in_root(root: BorrowedFd<'_>, path: &Path) -> io::Result<(File, Method)> {
    let forced_walk = std::env::var_os(ENV_FORCE_WALK).is_some();
    let located = if forced_walk {
        None
    } else {
        let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        match crate::sys::openat2_path(root, &cstr(path.as_os_str().as_bytes())?, resolve) {
            Ok(fd) => Some(fd),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => None,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refused("leads through a magic link or too many symbolic links")),
            Err(e) => return Err(e),
        }
    };
    let (fd, method) = match located {
        Some(fd) => (fd, Method::Openat2),
        None => (walk(root, path)?, Method::Walk),
    };
    Ok((reopen_regular(fd.as_fd())?, method))
}

/// Opens `path` for reading where the caller's own file system has it, not following a
/// symbolic link in its last component; only a regular file is opened.
pub fn open_plain(path: &Path) -> io::Result<File> {
    let fd = crate::sys::openat(None, &cstr(path.as_os_str().as_bytes())?, libc::O_PATH | libc::O_NOFOLLOW)?;
    reopen_regular(fd.as_fd())
}

/// Resolves `path` under `root` one component at a time, following no symbolic link.
fn walk(root: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    let mut current: Option<OwnedFd> = None;
    for component in path.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => return Err(refused("names `..`, which is refused when a path is resolved by walking")),
            Component::Prefix(_) => return Err(refused("is not a Unix path")),
            Component::Normal(name) => name,
        };
        let dir = current.as_ref().map(|fd| fd.as_fd()).unwrap_or(root);
        let next = crate::sys::openat(Some(dir), &cstr(name.as_bytes())?, libc::O_PATH | libc::O_NOFOLLOW)?;
        if crate::sys::fstat(next.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(refused("leads through a symbolic link, which is refused when a path is resolved by walking"));
        }
        current = Some(next);
    }
    current.ok_or_else(|| refused("is empty"))
}

/// Reopens an `O_PATH` descriptor for reading if it names a regular file.
fn reopen_regular(fd: BorrowedFd<'_>) -> io::Result<File> {
    let st = crate::sys::fstat(fd)?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFLNK => return Err(refused("is a symbolic link; a ledger is never opened through one")),
        _ => return Err(refused("is not a regular file")),
    }
    let proc_path = cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes())?;
    let file = File::from(crate::sys::openat(None, &proc_path, libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK)?);
    // The reopened file must be the one that was checked.
    let again = crate::sys::fstat(file.as_fd())?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(refused("changed while it was opened"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("fgpu-resolve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/tmp/d")).unwrap();
        std::fs::write(dir.join("root/tmp/d/ledger"), b"inside").unwrap();
        std::fs::write(dir.join("outside"), b"outside").unwrap();
        Dir(dir)
    }

    fn root_fd(dir: &Dir) -> OwnedFd {
        crate::sys::openat(None, &cstr(dir.0.join("root").as_os_str().as_bytes()).unwrap(), libc::O_PATH | libc::O_DIRECTORY).unwrap()
    }

    fn read(file: File) -> String {
        std::io::read_to_string(file).unwrap()
    }

    #[test]
    fn a_path_stays_inside_its_root() {
        let dir = tree("inside");
        let root = root_fd(&dir);
        let (file, method) = open_in_root(root.as_fd(), Path::new("/tmp/d/ledger")).unwrap();
        assert_eq!(read(file), "inside");
        // An absolute link in the middle of the path: resolved inside the root (openat2) or
        // refused (walk), never reaching the caller's file system.
        std::os::unix::fs::symlink(dir.0.join("outside").parent().unwrap(), dir.0.join("root/tmp/up")).unwrap();
        match open_in_root(root.as_fd(), Path::new("/tmp/up/outside")) {
            Ok((file, _)) => panic!("escaped the root: read {:?}", read(file)),
            Err(e) => assert!(matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied), "{e}"),
        }
        match open_in_root(root.as_fd(), Path::new("/tmp/../../outside")) {
            Ok((file, m)) => assert_ne!(read(file), "outside", "`..` left the root ({m:?})"),
            Err(e) => assert!(matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied), "{e}"),
        }
        // A link as the last component is never followed, even to a file inside.
        std::os::unix::fs::symlink("/tmp/d/ledger", dir.0.join("root/tmp/link")).unwrap();
        let err = open_in_root(root.as_fd(), Path::new("/tmp/link")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err} ({method:?})");
        // Only regular files are opened.
        let err = open_in_root(root.as_fd(), Path::new("/tmp/d")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn the_walk_refuses_every_link_and_dotdot() {
        let dir = tree("walk");
        let root = root_fd(&dir);
        let fd = walk(root.as_fd(), Path::new("/tmp/d/ledger")).unwrap();
        assert_eq!(read(reopen_regular(fd.as_fd()).unwrap()), "inside");
        std::os::unix::fs::symlink("d", dir.0.join("root/tmp/rel")).unwrap();
        let err = walk(root.as_fd(), Path::new("/tmp/rel/ledger")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let err = walk(root.as_fd(), Path::new("/tmp/d/../d/ledger")).unwrap_err();
        assert!(err.to_string().contains(".."), "{err}");
    }

    #[test]
    fn a_process_dir_names_its_process() {
        let me = ProcessDir::open(Path::new("/proc"), std::process::id()).unwrap();
        assert!(me.alive());
        let ipc = std::fs::metadata("/proc/self/ns/ipc").unwrap().ino();
        assert_eq!(me.ns_inode("ipc").unwrap(), ipc);
        let root = me.root().unwrap();
        let fd0 = open_in_root(root.as_fd(), Path::new("/proc/self/fd/0"));
        assert!(fd0.is_err(), "a magic link is not followed");
        // A process that has exited: reads through its directory fail.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dir = ProcessDir::open(Path::new("/proc"), child.id()).unwrap();
        child.wait().unwrap();
        assert!(!dir.alive());
    }
}
