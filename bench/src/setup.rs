//! Set-up: the libraries, the C clients (embedded, compiled when they change), a private
//! temp directory, and the command that runs a client on the simulated driver with or
//! without a build of fgpu preloaded (its front, `libfgpu.so`, which loads the shim beside it).

use crate::plan::{Options, LIMIT, SIM_MEMORY};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub type Error = String;

pub const ALLOC_PAIRS_C: &str = include_str!("../clients/alloc_pairs.c");
pub const ASYNC_THREADS_C: &str = include_str!("../clients/async_threads.c");
pub const FIRST_CALL_C: &str = include_str!("../clients/first_call.c");
pub const EMPTY_PRELOAD_C: &str = include_str!("../clients/empty_preload.c");
pub const LAUNCHES_C: &str = include_str!("../clients/launches.c");
/// What the clients that call the driver share (`#include "client.h"`).
pub const CLIENT_H: &str = include_str!("../clients/client.h");

/// A library preloaded into `/bin/true` in the start-up rows.
pub struct Preload {
    /// Short name, used in the JSON keys and the labels.
    pub name: String,
    pub label: String,
    pub path: PathBuf,
    /// Held to the start-up target (the shipped builds), or shown for information.
    pub checked: bool,
}

pub struct Setup {
    /// The local build's front, `libfgpu.so` (its shim, `libfgpu_shim.so`, is beside it).
    pub front: PathBuf,
    pub sim_lib: PathBuf,
    pub alloc_pairs: PathBuf,
    pub async_threads: PathBuf,
    pub first_call: PathBuf,
    pub empty_preload: PathBuf,
    pub launches: PathBuf,
    /// The shipped build(s) and any `--preload` libraries, beside the local `front`.
    pub preloads: Vec<Preload>,
    pub tmp: TempDir,
    pub runs: std::cell::Cell<u64>,
}

pub struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Setup {
    pub fn new(release_dir: &Path, options: &Options) -> Result<Setup, Error> {
        let need = |name: &str| -> Result<PathBuf, Error> {
            let path = release_dir.join(name);
            if path.exists() {
                Ok(std::fs::canonicalize(&path).unwrap_or(path))
            } else {
                Err(format!("{} is missing; build first: cargo build --release -p fgpu-bench -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml", path.display()))
            }
        };
        let front = need("libfgpu.so")?;
        let sim_cuda = need("libfgpu_sim_cuda.so")?;
        let sim_nvml = need("libfgpu_sim_nvml.so")?;

        let clients = release_dir.join("bench-clients");
        std::fs::create_dir_all(&clients).map_err(|e| format!("{}: {e}", clients.display()))?;
        let header_changed = write_header(&clients)?;
        let alloc_pairs = compile(&clients, "alloc_pairs", ALLOC_PAIRS_C, &["-ldl"], header_changed)?;
        let async_threads = compile(&clients, "async_threads", ASYNC_THREADS_C, &["-ldl", "-lpthread"], header_changed)?;
        let first_call = compile(&clients, "first_call", FIRST_CALL_C, &["-ldl"], header_changed)?;
        let launches = compile(&clients, "launches", LAUNCHES_C, &["-ldl"], header_changed)?;
        let empty_preload = compile(&clients, "libfgpu_bench_empty.so", EMPTY_PRELOAD_C, &["-shared", "-fPIC"], false)?;

        let preloads = preloads(release_dir, options)?;

        let tmp = std::env::temp_dir().join(format!("fgpu-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let tmp = TempDir(tmp);
        let sim_lib = tmp.0.join("lib");
        std::fs::create_dir_all(&sim_lib).map_err(|e| e.to_string())?;
        for (target, soname) in [(&sim_cuda, "libcuda.so.1"), (&sim_nvml, "libnvidia-ml.so.1")] {
            std::os::unix::fs::symlink(target, sim_lib.join(soname)).map_err(|e| format!("symlink {soname}: {e}"))?;
        }
        Ok(Setup { front, sim_lib, alloc_pairs, async_threads, first_call, empty_preload, launches, preloads, tmp, runs: std::cell::Cell::new(0) })
    }

    /// A fresh directory for one run: its own simulated-driver state and ledger.
    pub fn run_dir(&self) -> Result<PathBuf, Error> {
        let n = self.runs.get();
        self.runs.set(n + 1);
        let dir = self.tmp.0.join(format!("run-{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// A command with a clean environment: no preload or fgpu setting inherited from
    /// whoever runs the benchmark, the same variables on both sides but `LD_PRELOAD`.
    pub fn command(&self, program: &Path, run_dir: &Path, shim: bool) -> Command {
        self.command_preloading(program, run_dir, shim.then_some(self.front.as_path()))
    }

    /// [`Setup::command`] with `preload` (any build's front) preloaded, or none.
    pub fn command_preloading(&self, program: &Path, run_dir: &Path, preload: Option<&Path>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear();
        for (key, value) in std::env::vars_os() {
            if keep_var(&key) {
                cmd.env(key, value);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &self.sim_lib)
            .env("FGPU_SIM_STATE", run_dir.join("sim-state"))
            .env("FGPU_SIM_MEMORY", SIM_MEMORY)
            .env("FGPU_SIM_CONTEXT_OVERHEAD", "300M")
            .env("FGPU_LIMIT", LIMIT)
            .env("FGPU_LEDGER", run_dir.join("ledger"));
        if let Some(library) = preload {
            cmd.env("LD_PRELOAD", library);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }
}

/// The libraries compared with the local build in the start-up rows: the shipped build
/// (`--shipped`, or every `libfgpu.so` that scripts/build-release.sh left in `dist/` beside
/// the release directory: the glibc-2.17 build and the per-baseline ones), then `--preload`s.
pub fn preloads(release_dir: &Path, options: &Options) -> Result<Vec<Preload>, Error> {
    let mut out = Vec::new();
    let mut add = |name: String, label: String, path: &Path, checked: bool| -> Result<(), Error> {
        let path = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(Preload { name, label, path, checked });
        Ok(())
    };
    match &options.shipped {
        Some(file) => add("shipped".into(), "shipped build".into(), file, true)?,
        None => {
            let dist = release_dir.join("../dist");
            if dist.join("libfgpu.so").is_file() {
                add("shipped".into(), "shipped, glibc 2.17".into(), &dist.join("libfgpu.so"), true)?;
            }
            let mut baselines: Vec<PathBuf> = std::fs::read_dir(&dist).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
            baselines.sort();
            for dir in baselines {
                let Some(version) = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("glibc-")) else {
                    continue;
                };
                if dir.join("libfgpu.so").is_file() {
                    add(format!("shipped_glibc_{}", version.replace('.', "_")), format!("shipped, glibc {version}"), &dir.join("libfgpu.so"), true)?;
                }
            }
        }
    }
    // What the front saves: the shim itself preloaded, as before the front existed.
    let shim = release_dir.join("libfgpu_shim.so");
    if shim.is_file() {
        add("shim_direct".into(), "libfgpu_shim.so preloaded itself".into(), &shim, false)?;
    }
    for (name, file) in &options.extra {
        let key: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        add(key, name.clone(), file, false)?;
    }
    Ok(out)
}

pub fn keep_var(key: &OsString) -> bool {
    let key = key.to_string_lossy();
    !(key.starts_with("LD_") || key.starts_with("FGPU_") || key == "CUDA_VISIBLE_DEVICES")
}

/// Writes [`CLIENT_H`] into `dir`, where the clients' sources go; true when it changed there
/// (the clients that include it are compiled again).
pub fn write_header(dir: &Path) -> Result<bool, Error> {
    let path = dir.join("client.h");
    if std::fs::read_to_string(&path).map(|s| s == CLIENT_H).unwrap_or(false) {
        return Ok(false);
    }
    std::fs::write(&path, CLIENT_H).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(true)
}

/// Writes the embedded C source next to the build outputs and compiles it when it changed
/// (or `header_changed`, the header it includes).
pub fn compile(dir: &Path, name: &str, source: &str, flags: &[&str], header_changed: bool) -> Result<PathBuf, Error> {
    let src = dir.join(format!("{}.c", name.trim_end_matches(".so")));
    let bin = dir.join(name);
    let same = std::fs::read_to_string(&src).map(|s| s == source).unwrap_or(false);
    if same && !header_changed && bin.exists() {
        return Ok(bin);
    }
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    let partial = dir.join(format!(".{name}.{}", std::process::id()));
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&partial)
        .arg(&src)
        .args(flags)
        .output()
        .map_err(|e| format!("cannot run cc to build the benchmark clients: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr)));
    }
    std::fs::rename(&partial, &bin).map_err(|e| e.to_string())?;
    Ok(bin)
}
