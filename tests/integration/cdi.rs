//! `fgpu cdi generate` against the simulated driver: the devices it names from NVML, the
//! files it writes and their modes, the spec's mounts, bad input, and the generated files
//! capping a process when mounted as a container runtime mounts them (in a private mount
//! namespace). The same spec under a real engine (podman) is tests/cdi/test.sh.

use fgpu_tests::*;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `fgpu cdi generate` with the simulated GPUs of `env`, the spec and files under its dir.
fn generate(env: &Env, extra: &[&str]) -> Cmd {
    generate_to(env, &env.dir.join("fgpu.json"), &config_dir(env), extra)
}

fn generate_to(env: &Env, output: &Path, config_dir: &Path, extra: &[&str]) -> Cmd {
    env.command(fgpu_bin()).env("FGPU_SHIM", front_path()).args(["cdi", "generate", "--output"]).arg(output).arg("--config-dir").arg(config_dir).args(extra)
}

fn config_dir(env: &Env) -> PathBuf {
    env.dir.join("cdi")
}

fn spec(env: &Env) -> Value {
    let text = std::fs::read_to_string(env.dir.join("fgpu.json")).expect("the spec was written");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("the spec is not JSON ({e}):\n{text}"))
}

fn names(spec: &Value) -> Vec<String> {
    spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_string()).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).mode() & 0o7777
}

/// The `limit = ` line of a device's generated fgpu.conf.
fn limit_of(env: &Env, device: &str) -> String {
    let path = config_dir(env).join("devices").join(device).join("fgpu.conf");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().find_map(|l| l.strip_prefix("limit = ")).unwrap_or_else(|| panic!("no limit in\n{text}")).to_string()
}

#[test]
fn generate_names_every_size_that_fits_each_simulated_gpu() {
    let env = Env::new("cdi-names").devices(2).sim_memory("24G");
    env.client(&["init"]).success();
    let run = generate(&env, &["--combine", "1-4g,0-8g"]).success();
    let spec = spec(&env);
    assert_eq!(spec["cdiVersion"], "0.5.0", "{spec}");
    assert_eq!(spec["kind"], "fgpu.io/gpu", "{spec}");
    let mut expected = Vec::new();
    for target in ["0", "1", "all"] {
        // 32g and 40g do not fit a 24 GiB GPU.
        for size in ["2g", "4g", "8g", "12g", "16g", "24g", "10pct", "25pct", "50pct", "75pct"] {
            expected.push(format!("{target}-{size}"));
        }
    }
    expected.push("0-8g_1-4g".into());
    assert_eq!(names(&spec), expected, "{run}");
    // The summary on stderr names what was written; nothing on stdout.
    assert!(run.stderr().contains("31 devices for 2 GPUs"), "{run}");
    assert!(run.stdout().is_empty(), "{run}");

    // Caps by UUID, nothing elsewhere; all-SIZE on every GPU; the combination on both.
    let sim = env.sim();
    let (u0, u1) = (sim.device_uuid_string(0), sim.device_uuid_string(1));
    assert_eq!(limit_of(&env, "0-8g"), format!("{u0}=8G,*=1"));
    assert_eq!(limit_of(&env, "1-25pct"), format!("{u1}=25%,*=1"));
    assert_eq!(limit_of(&env, "all-12g"), "12G");
    assert_eq!(limit_of(&env, "0-8g_1-4g"), format!("{u0}=8G,{u1}=4G,*=1"));
}

#[test]
fn generate_writes_read_only_files_that_the_spec_mounts() {
    let env = Env::new("cdi-files");
    env.client(&["init"]).success();
    generate(&env, &["--sizes", "8g", "--percents="]).success();
    let spec = spec(&env);
    assert_eq!(names(&spec), ["0-8g", "all-8g"]);
    let dir = config_dir(&env);

    // Every mount's host path exists, and nothing in the container may write it.
    let mut mounts: Vec<&Value> = spec["containerEdits"]["mounts"].as_array().unwrap().iter().collect();
    for device in spec["devices"].as_array().unwrap() {
        mounts.extend(device["containerEdits"]["mounts"].as_array().unwrap());
    }
    for m in &mounts {
        let options: Vec<&str> = m["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
        if m["type"] == "tmpfs" {
            assert_eq!(m["containerPath"], "/run/fgpu", "{m}");
            assert!(options.contains(&"mode=1777"), "{m}");
            continue;
        }
        assert!(options.contains(&"ro") && options.contains(&"bind"), "{m}");
        let host = Path::new(m["hostPath"].as_str().unwrap());
        assert!(host.starts_with(&dir), "{m}");
        assert_eq!(mode(host) & 0o022, 0, "{} is writable by group or others", host.display());
    }
    let containers: Vec<&str> = mounts.iter().map(|m| m["containerPath"].as_str().unwrap()).collect();
    assert_eq!(containers, ["/usr/lib/fgpu", "/etc/ld.so.preload", "/run/fgpu", "/etc/fgpu", "/etc/fgpu"]);

    assert_eq!(std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(), "/usr/lib/fgpu/libfgpu.so\n");
    assert_eq!(mode(&dir.join("ld.so.preload")), 0o644);
    assert_eq!(mode(&dir.join("devices/0-8g/fgpu.conf")), 0o644);
    assert_eq!(mode(&dir.join("lib/libfgpu.so")), 0o755);
    assert_eq!(std::fs::read(dir.join("lib/libfgpu.so")).unwrap(), std::fs::read(front_path()).unwrap(), "the library is a copy of the front");
    assert_eq!(std::fs::read(dir.join("lib/fgpu")).unwrap(), std::fs::read(fgpu_bin()).unwrap(), "the command is a copy of fgpu");
    if prerequisite(is_root(), "files owned by root need root to write them") {
        for path in ["ld.so.preload", "devices/0-8g/fgpu.conf", "lib/libfgpu.so"] {
            assert_eq!(std::fs::metadata(dir.join(path)).unwrap().uid(), 0, "{path}");
        }
    }
    // The configuration parses as the shim reads it, with the tmpfs ledger.
    let conf = std::fs::read_to_string(dir.join("devices/0-8g/fgpu.conf")).unwrap();
    assert!(conf.lines().any(|l| l == "ledger = /run/fgpu/ledger"), "{conf}");

    // YAML (any other extension) holds the same spec, read by a real YAML parser.
    generate_to(&env, &env.dir.join("fgpu.yaml"), &dir, &["--sizes", "8g", "--percents="]).success();
    if let Some(python) = python_with("yaml") {
        let script = "import json, sys, yaml; assert yaml.safe_load(open(sys.argv[1])) == json.load(open(sys.argv[2])); print('same')";
        let run = Cmd(std::process::Command::new(python)).args(["-c", script]).arg(env.dir.join("fgpu.yaml")).arg(env.dir.join("fgpu.json")).success();
        assert_eq!(run.stdout().trim(), "same", "{run}");
    }
}

#[test]
fn generate_keeps_the_files_of_devices_no_longer_generated() {
    // A running container mounts its device's directory and reads fgpu.conf from it at
    // every process start: removing it would leave the container's new processes uncapped.
    let env = Env::new("cdi-stale");
    env.client(&["init"]).success();
    generate(&env, &["--sizes", "4g,8g", "--percents="]).success();
    let devices = config_dir(&env).join("devices");
    let before = std::fs::read_to_string(devices.join("0-4g/fgpu.conf")).unwrap();
    let run = generate(&env, &["--sizes", "8g", "--percents="]).success();
    assert_eq!(names(&spec(&env)), ["0-8g", "all-8g"], "{run}");
    assert_eq!(std::fs::read_to_string(devices.join("0-4g/fgpu.conf")).unwrap(), before, "{run}");
    assert!(run.stderr().contains("kept the files of 2 devices no longer generated (0-4g all-4g)"), "{run}");
}

#[test]
fn generate_refuses_bad_input_with_one_line() {
    let env = Env::new("cdi-bad").devices(2);
    env.client(&["init"]).success();
    // Usage errors: exit 2, naming the argument.
    for (args, needle) in [(["--sizes", "8x"], "--sizes"), (["--sizes", "100k"], "whole number of MiB"), (["--percents", "120"], "between 1 and 100")] {
        let run = generate(&env, &args).run();
        assert_eq!(run.output.status.code(), Some(2), "{run}");
        assert!(run.stderr().contains(needle), "{needle}\n{run}");
    }
    // Failures: exit 1, one line.
    let group_writable = env.dir.join("open");
    std::fs::create_dir_all(&group_writable).unwrap();
    std::fs::set_permissions(&group_writable, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (cmd, needle) in [
        (generate(&env, &["--combine", "0-8g,0-4g"]), "GPU 0 is named twice"),
        (generate(&env, &["--combine", "0-8g,2-4g"]), "there is no GPU 2"),
        (generate(&env, &["--sizes", "100g", "--percents="]), "no device to generate"),
        (generate(&env, &["--owner", "no-such-user-of-fgpu"]), "no user"),
        (generate_to(&env, &env.dir.join("fgpu.json"), &group_writable, &[]), "writable by group or others"),
        (generate(&env, &[]).env("FGPU_SHIM", env.dir.join("missing.so")), "FGPU_SHIM="),
    ] {
        let run = cmd.run();
        assert_eq!(run.output.status.code(), Some(1), "{run}");
        assert_eq!(run.stderr().lines().count(), 1, "{run}");
        assert!(run.stderr().contains(needle), "{needle}\n{run}");
    }
    // No GPU: the simulator with none.
    let none = Env::new("cdi-none").devices(0);
    let run = generate(&none, &[]).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert!(run.stderr().contains("no GPU found through NVML"), "{run}");
    assert!(!none.dir.join("fgpu.json").exists(), "{run}");
}

#[test]
fn generate_without_the_shim_beside_the_library_writes_nothing() {
    // libfgpu.so loads libfgpu_shim.so from its own directory: a copy of the front alone
    // would leave every container uncapped, so the command refuses, before writing a file.
    let env = Env::new("cdi-no-shim");
    env.client(&["init"]).success();
    let lone = env.dir.join("lone");
    std::fs::create_dir_all(&lone).unwrap();
    std::fs::copy(front_path(), lone.join("libfgpu.so")).unwrap();
    let output = env.dir.join("out/fgpu.json");
    let config = env.dir.join("config");
    let run = generate_to(&env, &output, &config, &[]).env("FGPU_SHIM", lone.join("libfgpu.so")).run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert_eq!(run.stderr().lines().count(), 1, "{run}");
    assert!(run.stderr().contains("libfgpu_shim.so"), "{run}");
    assert!(!config.exists(), "a refused run left {} behind\n{run}", config.display());
    assert!(!output.parent().unwrap().exists(), "{run}");
}

#[test]
fn generated_files_cap_a_process_as_a_runtime_mounts_them() {
    let env = Env::new("cdi-mounted").devices(2);
    env.client(&["init"]).success();
    generate(&env, &["--sizes", "8g", "--percents=", "--combine", "0-8g,1-4g"]).success();
    let dir = config_dir(&env);
    let c = client("cuclient");
    // What the spec asks of a runtime, for the device 0-8g, in a private mount namespace:
    // the device's directory at /etc/fgpu and a tmpfs at /run/fgpu, read-only binds. The
    // preload names the generated copy of the library where it is on this host. (/etc/fgpu
    // may exist already: any host with fgpu installed has it; the bind hides what it holds.)
    let mount = |device: &str| {
        format!(
            "mkdir -p /etc/fgpu; mount --bind {dir}/devices/{device} /etc/fgpu; mount -o remount,bind,ro /etc/fgpu; \
             echo {dir}/lib/libfgpu.so > /etc/ld.so.preload; mount -t tmpfs -o mode=1777 fgpu-test /run; mkdir -m 1777 /run/fgpu",
            dir = dir.display()
        )
    };
    let script = format!(
        "{}; C={c}; $C init primary info alloc 9G; FGPU_LIMIT=64G LD_PRELOAD= $C init primary info alloc 7G; \
         echo 'limit = 64G' >> /etc/fgpu/fgpu.conf || echo write-refused; CUDA_VISIBLE_DEVICES=1 $C init primary; ls /run/fgpu",
        mount("0-8g"),
        c = c.display()
    );
    let Some(cmd) = env.with_private_etc(&script) else { return };
    let run = cmd.run();
    let totals: Vec<String> = run.lines("info").iter().map(|l| field(l, "total").unwrap()).collect();
    assert_eq!(totals, [(8 * GIB).to_string(), (8 * GIB).to_string()], "the cap, and FGPU_LIMIT=64G with LD_PRELOAD= cannot raise it\n{run}");
    assert_eq!(run.lines("alloc"), [format!("alloc {} rc=2", 9 * GIB), format!("alloc {} rc=0", 7 * GIB)], "{run}");
    assert!(run.stdout().contains("write-refused"), "the configuration must be read-only\n{run}");
    assert_eq!(run.lines("primary").last().map(|l| l.ends_with("rc=2")), Some(true), "GPU 1 must give nothing to 0-8g\n{run}");
    assert!(run.stdout().lines().any(|l| l == "ledger"), "the ledger lives in the tmpfs\n{run}");

    // The combination: 8 GiB on GPU 0, 4 GiB on GPU 1.
    let script = format!("{}; C={c}; $C init primary info; CUDA_VISIBLE_DEVICES=1 $C init primary info", mount("0-8g_1-4g"), c = c.display());
    let run = env.with_private_etc(&script).unwrap().run();
    let totals: Vec<String> = run.lines("info").iter().map(|l| field(l, "total").unwrap()).collect();
    assert_eq!(totals, [(8 * GIB).to_string(), (4 * GIB).to_string()], "{run}");
}
