//! Where the build's files are: the workspace, the release build (the front, the shim,
//! `fgpu`) and the simulated driver under the real sonames.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target"));
    if target.is_absolute() {
        target
    } else {
        workspace().join(target)
    }
}

/// Where the release build lives.
pub fn release_dir() -> PathBuf {
    target_dir().join("release")
}

/// The front, `libfgpu.so`: the small C library that is preloaded (`LD_PRELOAD`,
/// `/etc/ld.so.preload`) and loads the shim on a process's first CUDA or NVML call.
pub fn front_path() -> PathBuf {
    let path = release_dir().join("libfgpu.so");
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// The shim proper, `libfgpu_shim.so` (the Rust library the front loads from its own
/// directory): what keeps the ledger and holds the caps. Never preloaded by itself.
pub fn shim_library_path() -> PathBuf {
    let path = release_dir().join("libfgpu_shim.so");
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// The front of the build with crash points (`--features crash-points`, into target/crash;
/// tests/run.sh builds it), beside its shim: `FGPU_CRASH_AT=NAME` kills the process at
/// that point.
pub fn crash_front_path() -> PathBuf {
    let target = release_dir().parent().unwrap().join("crash/release/libfgpu.so");
    assert!(
        target.exists(),
        "{} is missing: run `cargo build --release -p fgpu-shim --features crash-points --target-dir target/crash` (tests/run.sh does)",
        target.display()
    );
    target
}

pub fn fgpu_bin() -> PathBuf {
    release_dir().join("fgpu")
}

/// A directory holding the simulated driver under the real sonames.
pub fn sim_lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = release_dir().join("sim-driver");
        std::fs::create_dir_all(&dir).unwrap();
        for (built, soname) in [("libfgpu_sim_cuda.so", "libcuda.so.1"), ("libfgpu_sim_nvml.so", "libnvidia-ml.so.1")] {
            let source = release_dir().join(built);
            assert!(source.exists(), "{} is missing: run `cargo build --release` first", source.display());
            let link = dir.join(soname);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&source, &link).unwrap();
            if soname == "libcuda.so.1" {
                let dev_link = dir.join("libcuda.so");
                let _ = std::fs::remove_file(&dev_link);
                std::os::unix::fs::symlink(&source, &dev_link).unwrap();
            }
        }
        dir
    })
    .clone()
}
