//! `fgpu sim-env DIR`: sets up fgpu's simulated NVIDIA driver (sim/, built with the
//! workspace) for use by hand, by a script, or by a test outside the workspace.
//!
//! The simulated libraries are built as `libfgpu_sim_cuda.so` and `libfgpu_sim_nvml.so`
//! with the sonames `libcuda.so.1` and `libnvidia-ml.so.1`; programs find them under those
//! names. This lays out, in `DIR/lib`:
//!
//! ```text
//! libcuda.so.1      -> .../libfgpu_sim_cuda.so
//! libcuda.so        -> .../libfgpu_sim_cuda.so     (for linking with -lcuda)
//! libnvidia-ml.so.1 -> .../libfgpu_sim_nvml.so
//! ```
//!
//! and prints the environment to use them, as shell `export` lines for `eval`:
//! `LD_LIBRARY_PATH` with `DIR/lib` first, `FGPU_SIM_STATE=DIR/sim-state`, and the
//! `FGPU_SIM_*` settings given as options (the product simulated, `--product`, and which of
//! its GPUs start in MIG mode, `--mig`, among them). With `--dry-run` it prints the commands
//! that make the layout instead of making it.

pub mod args;

use args::SimEnvArgs;
use std::path::{Path, PathBuf};

/// The built libraries and the names they are loaded under.
pub const LINKS: [(&str, &str); 3] =
    [("libcuda.so.1", "libfgpu_sim_cuda.so"), ("libcuda.so", "libfgpu_sim_cuda.so"), ("libnvidia-ml.so.1", "libfgpu_sim_nvml.so")];

/// Quotes a string for a POSIX shell: single quotes, a single quote as `'\''`.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Why `fgpu sim-env` made nothing.
#[derive(Debug, thiserror::Error)]
pub enum SimEnvError {
    #[error("{} is not valid UTF-8; choose a plain path", .0.display())]
    NotUtf8(PathBuf),
    #[error("cannot find the fgpu binary: {0}")]
    NoBinary(std::io::Error),
    #[error("the fgpu binary has no directory")]
    NoBinaryDirectory,
    #[error("{} is missing; build the simulated driver (cargo build --release -p fgpu-sim-cuda -p fgpu-sim-nvml) or pass --libs DIR", .0.display())]
    LibraryMissing(PathBuf),
    /// `what` is "cannot create PATH", "cannot replace PATH" or the path alone.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> SimEnvError {
    move |source| SimEnvError::Io { what, source }
}

fn text(path: &Path) -> Result<&str, SimEnvError> {
    path.to_str().ok_or_else(|| SimEnvError::NotUtf8(path.to_path_buf()))
}

/// Where the built simulated libraries are: `--libs`, else beside the fgpu binary (the
/// workspace's `target/release`).
fn libs_dir(args: &SimEnvArgs) -> Result<PathBuf, SimEnvError> {
    let dir = match &args.libs {
        Some(dir) => dir.clone(),
        None => std::env::current_exe().map_err(SimEnvError::NoBinary)?.parent().map(Path::to_path_buf).ok_or(SimEnvError::NoBinaryDirectory)?,
    };
    for (_, built) in LINKS {
        if !dir.join(built).is_file() {
            return Err(SimEnvError::LibraryMissing(dir.join(built)));
        }
    }
    std::fs::canonicalize(&dir).map_err(io(dir.display().to_string()))
}

/// The shell text `fgpu sim-env` prints.
pub fn script(dir: &Path, libs: &Path, args: &SimEnvArgs) -> Result<String, SimEnvError> {
    let lib = dir.join("lib");
    let mut out = String::new();
    if args.dry_run {
        out.push_str(&format!("mkdir -p {}\n", shell_quote(text(&lib)?)));
        for (name, built) in LINKS {
            out.push_str(&format!("ln -sfn {} {}\n", shell_quote(text(&libs.join(built))?), shell_quote(text(&lib.join(name))?)));
        }
    }
    out.push_str(&format!("export LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n", shell_quote(text(&lib)?)));
    out.push_str(&format!("export FGPU_SIM_STATE={}\n", shell_quote(text(&dir.join("sim-state"))?)));
    let settings = [
        ("FGPU_SIM_DEVICES", args.devices.map(|n| n.to_string())),
        ("FGPU_SIM_MEMORY", args.memory.clone()),
        ("FGPU_SIM_CONTEXT_OVERHEAD", args.context_overhead.clone()),
        ("FGPU_SIM_DRIVER_VERSION", args.driver_version.map(|v| v.to_string())),
        ("FGPU_SIM_PRODUCT", args.product.clone()),
        ("FGPU_SIM_MIG", args.mig.clone()),
    ];
    for (name, value) in settings {
        if let Some(value) = value {
            out.push_str(&format!("export {name}={}\n", shell_quote(&value)));
        }
    }
    Ok(out)
}

/// Makes `DIR/lib` and its links (replacing links of the same names).
fn lay_out(dir: &Path, libs: &Path) -> Result<(), SimEnvError> {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).map_err(io(format!("cannot create {}", lib.display())))?;
    for (name, built) in LINKS {
        let link = lib.join(name);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link).map_err(io(format!("cannot replace {}", link.display())))?;
        }
        std::os::unix::fs::symlink(libs.join(built), &link).map_err(io(format!("cannot create {}", link.display())))?;
    }
    Ok(())
}

fn sim_env_inner(args: &SimEnvArgs) -> Result<String, SimEnvError> {
    let dir = std::path::absolute(&args.dir).map_err(io(args.dir.display().to_string()))?;
    let libs = libs_dir(args)?;
    let out = script(&dir, &libs, args)?;
    if !args.dry_run {
        lay_out(&dir, &libs)?;
        let state = dir.join("sim-state");
        if state.exists() {
            eprintln!(
                "fgpu sim-env: {} exists: the simulated GPUs keep the settings it was made with (remove it, with no process using it, for new ones)",
                state.display()
            );
        }
    }
    Ok(out)
}

pub fn sim_env(args: &SimEnvArgs) -> i32 {
    match sim_env_inner(args) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("fgpu sim-env: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &str) -> SimEnvArgs {
        SimEnvArgs {
            dir: dir.into(),
            libs: None,
            devices: None,
            memory: None,
            context_overhead: None,
            driver_version: None,
            product: None,
            mig: None,
            dry_run: false,
        }
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_script_exports_the_layout_and_the_settings_given() {
        let mut a = args("/x");
        a.devices = Some(2);
        a.memory = Some("16G".into());
        let out = script(Path::new("/w/sim"), Path::new("/b/release"), &a).unwrap();
        assert_eq!(
            out,
            "export LD_LIBRARY_PATH='/w/sim/lib'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\n\
             export FGPU_SIM_STATE='/w/sim/sim-state'\n\
             export FGPU_SIM_DEVICES='2'\n\
             export FGPU_SIM_MEMORY='16G'\n"
        );
        a.dry_run = true;
        let out = script(Path::new("/w/sim"), Path::new("/b/release"), &a).unwrap();
        assert!(out.starts_with("mkdir -p '/w/sim/lib'\nln -sfn '/b/release/libfgpu_sim_cuda.so' '/w/sim/lib/libcuda.so.1'\n"), "{out}");
        assert!(out.contains("ln -sfn '/b/release/libfgpu_sim_nvml.so' '/w/sim/lib/libnvidia-ml.so.1'\n"), "{out}");
    }

    #[test]
    fn the_product_and_mig_mode_are_exported() {
        let mut a = args("/x");
        a.product = Some("a100-80gb".into());
        a.mig = Some(args::parse_mig("0,1").unwrap());
        let out = script(Path::new("/w/sim"), Path::new("/b/release"), &a).unwrap();
        assert!(out.ends_with("export FGPU_SIM_PRODUCT='a100-80gb'\nexport FGPU_SIM_MIG='0,1'\n"), "{out}");
        assert_eq!(args::parse_mig("all").as_deref(), Ok("all"));
        assert!(args::parse_mig("0,9").unwrap_err().to_string().contains("\"0,9\" is not all, none or a list of GPU indices"));
        assert!(args::parse_mig("on").is_err());
    }

    #[test]
    fn the_links_carry_the_sonames() {
        let names: Vec<&str> = LINKS.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"]);
    }
}
