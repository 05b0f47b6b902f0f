//! The Python wheel: `pip install` into a fresh virtual environment, then its `fgpu` finds
//! the libraries inside the environment and caps a Python job and its child.
//!
//! The wheel is built by `scripts/build-wheel.sh` (several minutes: zig builds and maturin),
//! which `tests/run.sh` runs before the tests and names in `FGPU_TEST_WHEEL`. Without it
//! the test fails under CI and is skipped, saying why, elsewhere.

use fgpu_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn wheel() -> Option<PathBuf> {
    let path = provided_path("FGPU_TEST_WHEEL", "the wheel, built by scripts/build-wheel.sh")?;
    assert!(path.is_file(), "FGPU_TEST_WHEEL={} is not a file", path.display());
    Some(path)
}

fn json_line(run: &Run) -> Value {
    let stdout = run.stdout();
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("no JSON line on stdout ({e})\n{run}"))
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_caps_a_job() {
    let Some(wheel) = wheel() else { return };
    let env = Env::new("wheel");
    let venv = env.dir.join("venv");
    Cmd(Command::new("python3")).args(["-m", "venv"]).arg(&venv).success();
    let python = venv.join("bin/python");
    // Offline, the wheel alone: it depends on nothing.
    Cmd(Command::new(&python)).args(["-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--quiet"]).arg(&wheel).success();
    let fgpu = venv.join("bin/fgpu");
    let libs = venv.join("lib/fgpu");
    for file in [fgpu.clone(), libs.join("libfgpu.so"), libs.join("libfgpu_shim.so")] {
        assert!(file.is_file(), "pip did not install {}", file.display());
    }
    // Metadata ready for an index: name, the workspace's version, license, README, classifiers.
    let read = "import importlib.metadata as m, json; d = m.metadata('fgpu'); \
                print(json.dumps({k: d.get_all(k) for k in ['Name', 'Version', 'License-Expression', 'Description-Content-Type', 'Classifier']}))";
    let meta = Cmd(Command::new(&python)).args(["-c", read]).success();
    let meta: Value = serde_json::from_str(meta.stdout().trim()).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(meta["Name"][0], "fgpu", "{meta}");
    assert_eq!(meta["Version"][0], version, "the workspace's version\n{meta}");
    assert_eq!(meta["License-Expression"][0], "Apache-2.0", "{meta}");
    assert!(meta["Description-Content-Type"][0].as_str().unwrap_or("").starts_with("text/markdown"), "the README\n{meta}");
    assert!(meta["Classifier"].as_array().is_some_and(|c| c.iter().any(|c| c == "Operating System :: POSIX :: Linux")), "{meta}");

    // `fgpu doctor` from the venv finds the front (and the shim beside it) inside it.
    let mut doctor = env.command(&fgpu).args(["doctor", "--json"]).limit("8G").env("LD_PRELOAD", libs.join("libfgpu.so"));
    doctor.0.env_remove("FGPU_SHIM");
    let doctor = doctor.run();
    let report: Value = serde_json::from_str(&doctor.stdout()).unwrap_or_else(|e| panic!("doctor printed no JSON ({e})\n{doctor}"));
    let shim = report["findings"].as_array().unwrap().iter().find(|f| f["check"] == "shim").cloned().unwrap_or_default();
    assert_eq!(shim["level"], "ok", "{doctor}");
    let expected = std::fs::canonicalize(libs.join("libfgpu.so")).unwrap();
    assert!(shim["message"].as_str().unwrap_or("").contains(&expected.display().to_string()), "doctor names the venv's libfgpu.so\n{doctor}");

    // `fgpu run --limit 8G -- python train.py`: the job sees 8 GiB, takes 5, and its child
    // is refused 4 more; without fgpu the same job sees the whole simulated 80 GiB.
    let train = workspace().join("tests/python/train.py");
    let job = |cmd: Cmd| cmd.arg(&python).arg(&train).args(["5", "4"]);
    let mut run = env.command(&fgpu).args(["run", "--limit", "8G", "--"]).env("TMPDIR", &env.dir);
    run.0.env_remove("FGPU_SHIM");
    let capped = job(run).success();
    let out = json_line(&capped);
    assert_eq!(out["total"], 8u64 << 30, "the job sees the cap\n{capped}");
    assert_eq!(out["alloc"], 0, "5 GiB fit\n{capped}");
    assert_eq!(out["child"]["total"], 8u64 << 30, "{capped}");
    assert_eq!(out["child"]["alloc"], 2, "the child's 4 GiB do not fit beside the parent's 5 (CUDA_ERROR_OUT_OF_MEMORY)\n{capped}");
    let said = out["child"]["stderr"].as_str().unwrap_or("");
    assert!(said.starts_with("fgpu") && said.lines().count() == 1, "the refusal says why, in one line on stderr\n{capped}");

    let bare_env = Env::new("wheel-bare");
    let bare = bare_env.command(&python).arg(&train).args(["5", "4"]).success();
    let out = json_line(&bare);
    assert_eq!(out["total"], 80u64 << 30, "{bare}");
    assert_eq!(out["child"]["alloc"], 0, "{bare}");
}

#[test]
fn the_wheel_is_manylinux2014_and_carries_the_release_libraries() {
    let Some(wheel) = wheel() else { return };
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("fgpu-") && name.contains("-py3-none-manylinux2014_"), "{name}");
    // The libraries in it are the glibc-2.17 release build, checked by its own script.
    let env = Env::new("wheel-files");
    let dir = env.dir.join("unpacked");
    Cmd(Command::new("python3")).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&dir).success();
    let data = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".data"))
        .expect("a .data directory in the wheel");
    let files: Vec<PathBuf> = ["data/lib/fgpu/libfgpu.so", "data/lib/fgpu/libfgpu_shim.so", "scripts/fgpu"].iter().map(|f| data.join(f)).collect();
    let check = Cmd(Command::new("bash")).arg(workspace().join("scripts/build-release.sh")).arg("--check").args(&files).success();
    assert!(check.stderr().matches("baseline GLIBC_2.17").count() == 3, "{check}");
    assert_front_needs_libc_only(&files[0]);
}

fn assert_front_needs_libc_only(front: &Path) {
    let dynamic = Cmd(Command::new("readelf")).arg("-d").arg(front).success();
    let needed: Vec<String> = dynamic.stdout().lines().filter(|l| l.contains("(NEEDED)")).map(|l| l.to_string()).collect();
    assert!(needed.len() == 1 && needed[0].contains("[libc.so.6]"), "{dynamic}");
}
