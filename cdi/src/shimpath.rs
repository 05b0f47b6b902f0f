//! Finding the front, `libfgpu.so`, without configuration.
//!
//! Order: `$FGPU_SHIM` (the path of `libfgpu.so`: the variable's name is older than the
//! front; if set it must exist; no fallback, so a typo is reported), then
//! beside the `fgpu` binary, `../lib/fgpu/` and `../lib/` relative to it, then
//! `/usr/local/lib/fgpu/` and `/usr/lib/fgpu/`.
//!
//! `../lib/fgpu/` is where the Python wheel puts the libraries: pip installs the `fgpu`
//! binary into the environment's `bin/` (`scripts`) and the wheel's data files into the
//! environment itself, so `<venv>/bin/fgpu` finds `<venv>/lib/fgpu/libfgpu.so`, and the same
//! holds for `pip install --user` (`~/.local/bin`, `~/.local/lib/fgpu`) and system installs.
//!
//! `libfgpu.so` is the front (crate `fgpu-front`); it loads the shim proper,
//! [`SHIM_IMPL_NAME`], from its own directory on a process's first CUDA or NVML call
//! ([`companion`]).

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The front, the file that is preloaded and that the search looks for.
pub const FRONT_NAME: &str = fgpu_front::FRONT_FILE;
/// The shim the front loads, beside it.
pub const SHIM_IMPL_NAME: &str = fgpu_front::SHIM_FILE;
pub const ENV_SHIM: &str = "FGPU_SHIM";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimError {
    /// `$FGPU_SHIM` names a file that does not exist.
    EnvMissing(PathBuf),
    /// Nothing in the searched places.
    NotFound(Vec<PathBuf>),
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimError::EnvMissing(path) => write!(f, "{ENV_SHIM}={} does not exist; point it at libfgpu.so or unset it", path.display()),
            ShimError::NotFound(searched) => {
                write!(f, "cannot find {FRONT_NAME}; looked in ")?;
                for (i, path) in searched.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, path.display())?;
                }
                write!(f, ". Install it beside the fgpu binary or set {ENV_SHIM}=/path/to/{FRONT_NAME}")
            }
        }
    }
}

impl std::error::Error for ShimError {}

/// Where the front was found, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub from_env: bool,
}

/// The places searched, in order, for an `fgpu` binary at `exe`.
pub fn candidates(exe: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        out.push(dir.join(FRONT_NAME));
        if let Some(prefix) = dir.parent() {
            out.push(prefix.join("lib/fgpu").join(FRONT_NAME));
            out.push(prefix.join("lib").join(FRONT_NAME));
        }
    }
    for dir in ["/usr/local/lib/fgpu", "/usr/lib/fgpu"] {
        let path = Path::new(dir).join(FRONT_NAME);
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// The shim that the front at `front` loads: [`SHIM_IMPL_NAME`] in the same directory.
pub fn companion(front: &Path) -> PathBuf {
    front.with_file_name(SHIM_IMPL_NAME)
}

/// The search, with the environment, the binary's path and the file system passed in.
pub fn locate_with(env_shim: Option<OsString>, exe: Option<&Path>, is_file: &dyn Fn(&Path) -> bool) -> Result<Found, ShimError> {
    if let Some(value) = env_shim.filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        return if is_file(&path) { Ok(Found { path, from_env: true }) } else { Err(ShimError::EnvMissing(path)) };
    }
    let searched = candidates(exe);
    match searched.iter().find(|p| is_file(p)) {
        Some(path) => Ok(Found { path: path.clone(), from_env: false }),
        None => Err(ShimError::NotFound(searched)),
    }
}

/// Finds the front for this process and returns an absolute path (what `LD_PRELOAD` needs).
pub fn locate() -> Result<Found, ShimError> {
    let exe = std::env::current_exe().ok();
    let mut found = locate_with(std::env::var_os(ENV_SHIM), exe.as_deref(), &|p| p.is_file())?;
    if let Ok(abs) = std::fs::canonicalize(&found.path) {
        found.path = abs;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searched_in_order_beside_the_binary_first() {
        let list = candidates(Some(Path::new("/opt/fgpu/bin/fgpu")));
        let list: Vec<_> = list.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            list,
            [
                "/opt/fgpu/bin/libfgpu.so",
                "/opt/fgpu/lib/fgpu/libfgpu.so",
                "/opt/fgpu/lib/libfgpu.so",
                "/usr/local/lib/fgpu/libfgpu.so",
                "/usr/lib/fgpu/libfgpu.so"
            ]
        );
        // Installed in /usr/local/bin: ../lib/fgpu is /usr/local/lib/fgpu, listed once.
        let list = candidates(Some(Path::new("/usr/local/bin/fgpu")));
        assert_eq!(list.iter().filter(|p| p.starts_with("/usr/local/lib/fgpu")).count(), 1);
    }

    #[test]
    fn first_existing_wins() {
        let exists = |p: &Path| p == Path::new("/opt/fgpu/lib/libfgpu.so") || p == Path::new("/usr/lib/fgpu/libfgpu.so");
        let found = locate_with(None, Some(Path::new("/opt/fgpu/bin/fgpu")), &exists).unwrap();
        assert_eq!(found, Found { path: "/opt/fgpu/lib/libfgpu.so".into(), from_env: false });
    }

    #[test]
    fn environment_overrides_and_is_not_second_guessed() {
        let exists = |p: &Path| p == Path::new("/x/libfgpu.so") || p == Path::new("/usr/lib/fgpu/libfgpu.so");
        let found = locate_with(Some("/x/libfgpu.so".into()), None, &exists).unwrap();
        assert!(found.from_env);
        let err = locate_with(Some("/typo/libfgpu.so".into()), None, &exists).unwrap_err();
        assert_eq!(err, ShimError::EnvMissing("/typo/libfgpu.so".into()));
        assert!(err.to_string().contains("FGPU_SHIM=/typo/libfgpu.so"));
    }

    #[test]
    fn the_wheel_layout_is_found() {
        // pip: <venv>/bin/fgpu (the wheel's scripts) and <venv>/lib/fgpu/ (its data).
        let exists = |p: &Path| p == Path::new("/venv/lib/fgpu/libfgpu.so");
        let found = locate_with(None, Some(Path::new("/venv/bin/fgpu")), &exists).unwrap();
        assert_eq!(found.path, Path::new("/venv/lib/fgpu/libfgpu.so"));
        assert_eq!(companion(&found.path), Path::new("/venv/lib/fgpu/libfgpu_shim.so"));
    }

    #[test]
    fn not_found_lists_every_place() {
        let err = locate_with(None, Some(Path::new("/a/bin/fgpu")), &|_| false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/a/bin/libfgpu.so") && text.contains("/usr/lib/fgpu/libfgpu.so") && text.contains("FGPU_SHIM"), "{text}");
    }
}
