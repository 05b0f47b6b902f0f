//! Test-only: state files in a directory of their own under the temporary directory
//! (`$TMPDIR`, else `/tmp`), removed when the test ends, pass or fail.

use crate::{SimConfig, SimState};
use std::path::{Path, PathBuf};

/// The path of a state file, `TMPDIR/fgpu-sim-test-PID-NAME/state`. Dropping it removes the
/// directory with everything in it (the file's `.mig-config` too). The mappings made of the
/// file outlive the removal, but a child process that opens the file by its path must have
/// done so by then: keep this alive until the children are gone.
pub(crate) struct TempState {
    dir: PathBuf,
    path: PathBuf,
}

impl TempState {
    /// A new, empty directory for test `name` (unique within the test binary).
    pub(crate) fn new(name: &str) -> TempState {
        let dir = std::env::temp_dir().join(format!("fgpu-sim-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempState { path: dir.join("state"), dir }
    }

    /// Creates the state file with `cfg`; the state keeps this guard.
    pub(crate) fn open_with(self, cfg: &SimConfig) -> TempSim {
        let state = SimState::open_with(&self.path, cfg).unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        TempSim { state, file: self }
    }
}

impl Drop for TempState {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl AsRef<Path> for TempState {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TempState {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// A state made in a [`TempState`]: it is the [`SimState`], and its files go when it drops.
pub(crate) struct TempSim {
    state: SimState,
    file: TempState,
}

impl TempSim {
    /// The state file's path (for a child process to open).
    pub(crate) fn path(&self) -> &Path {
        &self.file.path
    }
}

impl std::ops::Deref for TempSim {
    type Target = SimState;

    fn deref(&self) -> &SimState {
        &self.state
    }
}
