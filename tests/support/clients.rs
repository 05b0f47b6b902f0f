//! The C test clients and helper libraries, compiled on demand, and copies every user can
//! reach; the sweep of what earlier runs left in the temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::paths::*;
use crate::process::Cmd;

/// Compiles `tests/clients/<name>.c` once per test run; `linked` links it against the
/// simulated libcuda instead of resolving at run time.
pub fn client(name: &str) -> PathBuf {
    client_with(name, &[])
}

pub fn client_with(name: &str, defines: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap();
    let suffix: String = defines.iter().map(|d| format!("-{}", d.to_lowercase())).collect();
    let out = release_dir().join("test-clients").join(format!("{name}{suffix}"));
    let source = workspace().join("tests/clients").join(format!("{name}.c"));
    if !built_after(&out, &source) {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-Wall", "-o"]).arg(&out).arg(&source);
        for d in defines {
            cc.arg(format!("-D{d}"));
        }
        if defines.contains(&"LINKED") {
            cc.arg(format!("-L{}", sim_lib_dir().display())).arg("-l:libcuda.so.1");
        }
        cc.args(["-ldl", "-lpthread"]);
        Cmd(cc).success();
    }
    out
}

/// Whether `out` exists and is newer than `source` and every header beside it (the
/// clients share `tests/clients/*.h`).
fn built_after(out: &Path, source: &Path) -> bool {
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let Some(built) = modified(out) else { return false };
    let headers =
        std::fs::read_dir(source.parent().unwrap()).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "h"));
    std::iter::once(source.to_path_buf()).chain(headers).all(|p| modified(&p).is_some_and(|m| m <= built))
}

/// Builds a helper shared library from `tests/clients/<name>.c`.
pub fn helper_library(name: &str) -> PathBuf {
    let out = release_dir().join("test-clients").join(format!("lib{name}.so"));
    let source = workspace().join("tests/clients").join(format!("{name}.c"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut cc = Command::new("cc");
    cc.args(["-O1", "-Wall", "-shared", "-fPIC", "-o"]).arg(&out).arg(&source).arg("-ldl");
    Cmd(cc).success();
    out
}

/// Copies of the front and the shim, the simulated driver and the test clients where every user can
/// reach them (a clone under a private home directory is not reachable by user 65534).
pub struct Reachable {
    pub dir: PathBuf,
    /// The front (`libfgpu.so`), with the shim beside it.
    pub front: PathBuf,
    pub sim_lib_dir: PathBuf,
}

pub fn reachable() -> &'static Reachable {
    static REACHABLE: OnceLock<Reachable> = OnceLock::new();
    REACHABLE.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        sweep_earlier_runs();
        let dir = std::env::temp_dir().join(format!("fgpu-it-reachable-{}", std::process::id()));
        let sim = dir.join("sim-driver");
        std::fs::create_dir_all(&sim).unwrap();
        let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        open(&dir, 0o755);
        open(&sim, 0o755);
        let front = dir.join("libfgpu.so");
        std::fs::copy(front_path(), &front).unwrap();
        open(&front, 0o755);
        // The shim proper, which the front loads from its own directory.
        let shim = dir.join("libfgpu_shim.so");
        std::fs::copy(shim_library_path(), &shim).unwrap();
        open(&shim, 0o755);
        for entry in std::fs::read_dir(sim_lib_dir()).unwrap() {
            let entry = entry.unwrap();
            let to = sim.join(entry.file_name());
            std::fs::copy(entry.path(), &to).unwrap();
            open(&to, 0o755);
        }
        Reachable { dir, front, sim_lib_dir: sim }
    })
}

/// A copy of a test client (see [`client`]) that every user can run.
pub fn reachable_client(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let to = reachable().dir.join(name);
    if !to.exists() {
        std::fs::copy(client(name), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    to
}

/// A copy of the `fgpu` binary that every user can run (beside the reachable front, which
/// it finds next to itself).
pub fn reachable_fgpu() -> PathBuf {
    let to = reachable().dir.join("fgpu");
    if !to.exists() {
        std::fs::copy(fgpu_bin(), &to).unwrap();
    }
    to
}

/// Removes what earlier test runs left in the temporary directory, once per run: this
/// run's shared directory (a static is never dropped) and the directories of tests that
/// failed (kept for a look, see [`Env`]'s drop), once the process that made them is gone.
/// `FGPU_TEST_KEEP=1` keeps them all.
pub(crate) fn sweep_earlier_runs() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if std::env::var_os("FGPU_TEST_KEEP").is_some() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("fgpu-it-") else { continue };
            let rest = rest.strip_prefix("reachable-").unwrap_or(rest);
            let digits = rest.split('-').next().unwrap_or_default();
            let Ok(pid) = digits.parse::<u32>() else { continue };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
}
