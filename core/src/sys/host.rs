//! What fgpu's tools ask of the system they run on: the running glibc, the local time, the
//! limit on open files, a user's home directory, and `dlopen(3)` of a driver library.

use std::ffi::{c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr::NonNull;

/// `gnu_get_libc_version(3)`: the glibc this process runs with, such as `2.36`.
pub fn glibc_version() -> Option<String> {
    extern "C" {
        fn gnu_get_libc_version() -> *const libc::c_char;
    }
    // SAFETY: models gnu_get_libc_version(3), which returns a static NUL-terminated string.
    let ptr = unsafe { gnu_get_libc_version() };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    Some(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}

/// `time(2)` and `localtime_r(3)`: the local time of day (hours, minutes, seconds).
pub fn local_time_of_day() -> (u32, u32, u32) {
    // SAFETY: models time(2) without an out pointer.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: all-zero bytes are a valid tm.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: models localtime_r(3) with a valid time_t and an exclusively borrowed tm.
    unsafe { libc::localtime_r(&now, &mut tm) };
    (tm.tm_hour.max(0) as u32, tm.tm_min.max(0) as u32, tm.tm_sec.max(0) as u32)
}

/// `getrlimit(RLIMIT_NOFILE)`: the soft limit on open descriptors.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: models getrlimit(2) into a valid, exclusively borrowed rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// The home directory of `uid` in the password database (`getpwuid_r(3)`), not `HOME`;
/// `None` when it has no entry or its directory is not absolute.
pub fn home_of(uid: u32) -> Option<PathBuf> {
    // SAFETY: all-zero bytes are a valid passwd (null pointers, zero ids).
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: models getpwuid_r(3) with a passwd, a buffer of the length passed and an out
    // pointer, all owned here and alive for the call.
    let rc = unsafe { libc::getpwuid_r(uid, &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || entry.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir points into `buf`, NUL-terminated by getpwuid_r, and `buf` is alive.
    let dir = unsafe { std::ffi::CStr::from_ptr(entry.pw_dir) };
    let dir = PathBuf::from(OsStr::from_bytes(dir.to_bytes()));
    dir.is_absolute().then_some(dir)
}

/// A library `dlopen`ed by [`dlopen`], never closed (a driver's library stays for the life
/// of the process, as a CUDA program keeps it).
#[derive(Debug)]
pub struct Library {
    handle: NonNull<c_void>,
}

// SAFETY: a handle is an opaque token of the loader, which serialises its own use of it;
// glibc's dlsym may be called with it from any thread, and it is never closed.
unsafe impl Send for Library {}
// SAFETY: as for Send: nothing is mutated through a shared reference.
unsafe impl Sync for Library {}

/// Why [`dlopen`] failed: the loader's own message (`dlerror(3)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// `dlopen(3)` of `name` with `RTLD_NOW | RTLD_LOCAL`. Loading a driver runs its
/// initialisers, which is what any CUDA program does.
pub fn dlopen(name: &CStr) -> Result<Library, LoadError> {
    // SAFETY: models dlopen(3) with a NUL-terminated name.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    match NonNull::new(handle) {
        Some(handle) => Ok(Library { handle }),
        None => {
            // SAFETY: models dlerror(3): null, or this thread's last loader message.
            let message = unsafe { libc::dlerror() };
            if message.is_null() {
                return Err(LoadError("unknown error".into()));
            }
            // SAFETY: a NUL-terminated string owned by libc, read before any other dl call.
            Err(LoadError(unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()))
        }
    }
}

impl Library {
    /// The address of `name` in this library, looked up with glibc's own `dlsym`
    /// ([`super::glibc_dlsym`]), never through a `dlsym` a preloaded library defines (fgpu's
    /// front hands out its own wrappers). `None` when the library lacks it, or glibc's
    /// `dlsym` cannot be found.
    pub fn symbol(&self, name: &CStr) -> Option<NonNull<c_void>> {
        let dlsym = super::glibc_dlsym()?;
        // SAFETY: models dlsym(3): a live handle from dlopen and a NUL-terminated name.
        NonNull::new(unsafe { dlsym(self.handle.as_ptr(), name.as_ptr()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_and_the_clock() {
        let version = glibc_version().unwrap();
        assert!(version.starts_with("2."), "{version}");
        let (h, m, s) = local_time_of_day();
        assert!(h < 24 && m < 60 && s < 61);
        assert!(open_files_limit().is_some_and(|n| n > 0));
        assert!(home_of(0).is_some_and(|h| h.is_absolute()), "root has a home directory");
    }

    #[test]
    fn a_library_and_its_symbols() {
        let libc = dlopen(c"libc.so.6").unwrap();
        assert!(libc.symbol(c"getpid").is_some());
        assert!(libc.symbol(c"fgpu_no_such_symbol").is_none());
        let err = dlopen(c"libfgpu-no-such-library.so.1").unwrap_err();
        assert!(err.0.contains("libfgpu-no-such-library.so.1"), "{err}");
    }
}
