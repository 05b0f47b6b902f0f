//! `fgpu doctor`: every failure it claims to detect, caused.

use super::*;

fn doctor(cmd: Cmd) -> (Run, Value) {
    let run = cmd.args(["doctor", "--json"]).run();
    let value = json(&run);
    let failed = value["findings"].as_array().unwrap().iter().any(|f| f["level"] == "fail");
    let unconfigured = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["check"] == "cap" && f["message"].as_str().unwrap_or("").starts_with("No cap is configured yet"));
    assert_eq!(run.output.status.code(), Some(if failed { 1 } else { 0 }), "exit status follows the findings\n{run}");
    assert_eq!(value["cap_applies"], !failed && !unconfigured, "{run}");
    (run, value)
}

/// The findings of one check at one level, as messages.
fn findings(value: &Value, check: &str, level: &str) -> Vec<String> {
    value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check && f["level"] == level)
        .map(|f| format!("{} | {}", f["message"].as_str().unwrap(), f["advice"].as_str().unwrap_or("")))
        .collect()
}

fn assert_finding(run: &Run, value: &Value, check: &str, level: &str, text: &str) {
    let found = findings(value, check, level);
    assert!(found.iter().any(|m| m.contains(text)), "expected a {level} {check} finding containing {text:?}\n{run}");
}

#[test]
fn doctor_passes_under_fgpu_run_and_says_why() {
    let env = Env::new("cli-doctor-ok");
    let (run, value) = doctor(fgpu(&env).args(["run", "--limit", "2G", "--"]).arg(fgpu_bin()));
    assert_eq!(value["cap_applies"], true, "{run}");
    assert_finding(&run, &value, "shim", "ok", "and the shim beside it load here");
    assert_finding(&run, &value, "preload", "ok", "through LD_PRELOAD");
    assert_finding(&run, &value, "cap", "ok", "from FGPU_LIMIT in the environment: 2 GiB on every GPU");
    assert_finding(&run, &value, "driver", "ok", "libcuda.so.1 loads, CUDA driver API 12.8, 1 GPU");
    assert_finding(&run, &value, "driver", "ok", "libnvidia-ml.so.1 loads, driver ");
    assert_finding(&run, &value, "cap", "info", "capped at 2 GiB");
    assert_finding(&run, &value, "ledger", "ok", "is not in use");
    assert_finding(&run, &value, "pidns", "info", "This is the host PID namespace");
    assert_finding(&run, &value, "interposer", "ok", "No other CUDA interposer");
    // A per-device limit that matches no visible GPU leaves it uncapped: a warning.
    let (run, value) = doctor(fgpu(&env).args(["run", "--device", "GPU-ffffffff=1G", "--"]).arg(fgpu_bin()));
    assert_finding(&run, &value, "cap", "warn", "is not capped: no entry of the limit matches its UUID");
    // The plain text says the same in sentences.
    let text = fgpu(&env).args(["run", "--limit", "2G", "--"]).arg(fgpu_bin()).arg("doctor").success();
    assert!(text.stdout().contains("A cap applies to GPU programs started here."), "{text}");
}

#[test]
fn doctor_reports_configuration_failures() {
    let env = Env::new("cli-doctor-config");
    let front = front_path();
    // No cap at all, as after `pip install`: nothing has failed (exit 0), nothing is capped,
    // and it says what to do next.
    let (run, value) = doctor(fgpu(&env));
    assert_eq!(run.output.status.code(), Some(0), "{run}");
    assert_eq!(value["cap_applies"], false, "{run}");
    assert_finding(&run, &value, "cap", "info", "No cap is configured yet");
    assert_finding(&run, &value, "cap", "info", "fgpu run --limit 8G -- COMMAND");
    assert_finding(&run, &value, "shim", "ok", "and the shim beside it load here");
    let text = fgpu(&env).arg("doctor").success();
    assert!(text.stdout().contains("fgpu works here, and no cap is configured yet"), "{text}");
    // An invalid cap: the configuration error, verbatim.
    let (run, value) = doctor(fgpu(&env).env("LD_PRELOAD", &front).env("FGPU_LIMIT", "lots"));
    assert_finding(&run, &value, "cap", "fail", r#"FGPU_LIMIT="lots" is not a valid limit"#);
    // A cap, but nothing preloaded to enforce it.
    let (run, value) = doctor(fgpu(&env).env("FGPU_LIMIT", "2G"));
    assert_finding(&run, &value, "cap", "fail", "not preloaded here");
    assert_finding(&run, &value, "preload", "warn", "not preloaded");
    // LD_PRELOAD naming a front that is not there.
    let (run, value) = doctor(fgpu(&env).env("FGPU_LIMIT", "2G").env("LD_PRELOAD", "/nonexistent/libfgpu.so"));
    assert_finding(&run, &value, "preload", "fail", "/nonexistent/libfgpu.so, which does not exist");
}

#[test]
fn doctor_reports_a_front_that_cannot_load() {
    let env = Env::new("cli-doctor-shim");
    let front_bytes = std::fs::read(front_path()).unwrap();
    // FGPU_SHIM names the front (libfgpu.so) the doctor checks.
    let capped = |front: &Path| fgpu(&env).env("FGPU_SHIM", front).env("LD_PRELOAD", front_path()).env("FGPU_LIMIT", "2G");

    let (run, value) = doctor(capped(&env.dir.join("missing/libfgpu.so")));
    assert_finding(&run, &value, "shim", "fail", "does not exist");

    let text = env.dir.join("text/libfgpu.so");
    std::fs::create_dir_all(text.parent().unwrap()).unwrap();
    std::fs::write(&text, "this is not a library\n").unwrap();
    let (run, value) = doctor(capped(&text));
    assert_finding(&run, &value, "shim", "fail", "not an ELF file");
    assert_finding(&run, &value, "cap", "fail", "fgpu's libraries cannot be loaded");

    // Built for another architecture: the same file with e_machine = AArch64.
    let arm = env.dir.join("arm/libfgpu.so");
    std::fs::create_dir_all(arm.parent().unwrap()).unwrap();
    let mut bytes = front_bytes.clone();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(&arm, &bytes).unwrap();
    let (run, value) = doctor(capped(&arm));
    assert_finding(&run, &value, "shim", "fail", "built for AArch64");

    // Needs a newer glibc than this system has: rename its GLIBC_2.x needs to GLIBC_9.x.
    let newer = env.dir.join("newer/libfgpu.so");
    std::fs::create_dir_all(newer.parent().unwrap()).unwrap();
    let mut bytes = front_bytes.clone();
    let needle = b"GLIBC_2.";
    let mut patched = 0;
    let mut i = 0;
    while i + needle.len() <= bytes.len() {
        if &bytes[i..i + needle.len()] == needle && i > 0 && bytes[i - 1] == 0 {
            bytes[i + 6] = b'9';
            patched += 1;
        }
        i += 1;
    }
    assert!(patched > 0);
    std::fs::write(&newer, &bytes).unwrap();
    let (run, value) = doctor(capped(&newer));
    assert_finding(&run, &value, "shim", "fail", "needs glibc 9.");

    // Fine by its headers, but a library it needs is missing: the trial load catches it.
    let src = env.dir.join("empty.c");
    std::fs::write(&src, "int fgpu_test_dep(void) { return 0; }\n").unwrap();
    let dep_dir = env.dir.join("dep");
    let broken = env.dir.join("broken/libfgpu.so");
    std::fs::create_dir_all(&dep_dir).unwrap();
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    let cc = |args: &[&str]| Cmd(Command::new("cc")).args(args).success();
    cc(&["-shared", "-fPIC", "-o", &dep_dir.join("libfgpudep.so").display().to_string(), &src.display().to_string()]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &broken.display().to_string(),
        &src.display().to_string(),
        "-Wl,--no-as-needed",
        &format!("-L{}", dep_dir.display()),
        "-lfgpudep",
    ]);
    std::fs::remove_file(dep_dir.join("libfgpudep.so")).unwrap();
    let (run, value) = doctor(capped(&broken));
    assert_finding(&run, &value, "shim", "fail", "libfgpudep.so");
}

#[test]
fn doctor_reports_a_broken_ledger_a_missing_driver_and_another_interposer() {
    let env = Env::new("cli-doctor-misc");
    let capped = || fgpu(&env).env("LD_PRELOAD", front_path()).env("FGPU_LIMIT", "2G");

    // A ledger that cannot be trusted: a link in place of the file.
    std::os::unix::fs::symlink(env.dir.join("elsewhere"), &env.ledger).unwrap();
    let (run, value) = doctor(capped());
    assert_finding(&run, &value, "ledger", "fail", "symbolic link");
    std::fs::remove_file(&env.ledger).unwrap();

    // No driver: a warning (no CUDA program runs at all), not a failure of the cap.
    let (run, value) = doctor(capped().env("LD_LIBRARY_PATH", env.dir.join("nothing-here")));
    assert_finding(&run, &value, "driver", "warn", "libcuda.so.1 cannot be loaded");
    assert_finding(&run, &value, "driver", "warn", "libnvidia-ml.so.1 cannot be loaded");

    // Another interposer (a stand-in for HAMi-core's libvgpu.so) preloaded beside fgpu.
    let src = env.dir.join("vgpu.c");
    std::fs::write(&src, "int cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 2; }\n").unwrap();
    let vgpu = env.dir.join("libvgpu.so");
    Cmd(Command::new("cc")).args(["-shared", "-fPIC", "-o"]).arg(&vgpu).arg(&src).success();
    let preload = format!("{}:{}", front_path().display(), vgpu.display());
    let (run, value) = doctor(capped().env("LD_PRELOAD", &preload));
    assert_finding(&run, &value, "interposer", "fail", "(HAMi-core)");

    // Not the host PID namespace.
    if prerequisite(is_root() && tool("unshare"), "the PID namespace part needs root and unshare(1)") {
        let inner = env
            .command("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--mount"])
            .arg(fgpu_bin())
            .args(["doctor", "--json"])
            .env("LD_PRELOAD", front_path())
            .env("FGPU_LIMIT", "2G")
            .run();
        let value = json(&inner);
        assert_finding(&inner, &value, "pidns", "info", "not the host PID namespace");
    }
}

#[test]
fn doctor_reads_the_config_file_and_ld_so_preload() {
    let env = Env::new("cli-doctor-etc");
    let fgpu_cmd = format!("TMPDIR={} {} doctor --json", env.dir.display(), fgpu_bin().display());
    let front = front_path().display().to_string();
    // The front preloaded for everything through /etc/ld.so.preload, the cap from the file.
    let file_ledger = env.dir.join("file-ledger");
    let Some(cmd) = env.with_private_etc(&format!(
        "mkdir -p /etc/fgpu; printf 'limit = 3G\\nledger = {}\\n' > /etc/fgpu/fgpu.conf; chmod 644 /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}",
        file_ledger.display()
    )) else {
        return;
    };
    let run = cmd.run();
    let value = json(&run);
    assert_eq!(value["cap_applies"], true, "{run}");
    assert_finding(&run, &value, "preload", "ok", "for every program on this system (through /etc/ld.so.preload)");
    assert_finding(&run, &value, "cap", "ok", "from /etc/fgpu/fgpu.conf: 3 GiB on every GPU");
    // The driver probe goes around the preloaded shim: it sees the GPU's own 80 GiB, not
    // the cap, and no ledger is created by the doctor's look.
    assert_finding(&run, &value, "cap", "info", "80 GiB): capped at 3 GiB");
    assert_finding(&run, &value, "ledger", "ok", "is not in use");
    assert!(!file_ledger.exists(), "the doctor created the ledger: its probe went through the shim\n{run}");

    // Both: the smaller applies, and the doctor says so.
    let cmd = env
        .with_private_etc(&format!("mkdir -p /etc/fgpu; echo 'limit = 3G' > /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; FGPU_LIMIT=1G {fgpu_cmd}"))
        .unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "cap", "ok", "on each GPU the smaller applies");
    assert_finding(&run, &value, "cap", "info", "capped at 1 GiB");

    // A bad line in the file: the configuration error verbatim.
    let cmd =
        env.with_private_etc(&format!("mkdir -p /etc/fgpu; echo 'limt = 3G' > /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}")).unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    assert_finding(&run, &value, "cap", "fail", "/etc/fgpu/fgpu.conf:1: \"limt = 3G\" is not a `key = value` line");

    // A file others may write: not trusted.
    let cmd = env
        .with_private_etc(&format!(
            "mkdir -p /etc/fgpu; echo 'limit = 3G' > /etc/fgpu/fgpu.conf; chmod 666 /etc/fgpu/fgpu.conf; echo {front} > /etc/ld.so.preload; {fgpu_cmd}"
        ))
        .unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "cap", "fail", "refusing to trust its cap");

    // Another interposer in /etc/ld.so.preload.
    let src = env.dir.join("vgpu.c");
    std::fs::write(&src, "int cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 2; }\n").unwrap();
    let vgpu = env.dir.join("libvgpu.so");
    Cmd(Command::new("cc")).args(["-shared", "-fPIC", "-o"]).arg(&vgpu).arg(&src).success();
    let cmd = env.with_private_etc(&format!("printf '{front}\\n{}\\n' > /etc/ld.so.preload; FGPU_LIMIT=1G {fgpu_cmd}", vgpu.display())).unwrap();
    let run = cmd.run();
    let value = json(&run);
    assert_finding(&run, &value, "interposer", "fail", "preloaded through /etc/ld.so.preload");
}

#[test]
fn doctor_reports_a_ledger_directory_it_cannot_write() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to run the doctor as another user") {
        return;
    }
    let env = Env::new("cli-doctor-perm");
    use std::os::unix::fs::PermissionsExt;
    let open = |dir: &Path| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // What user 65534 runs is copied where it can reach it: a root-owned clone (under /root,
    // mode 0700) would otherwise hide the binary, the shim and the simulated driver.
    open(&env.dir);
    let bin = env.dir.join("bin");
    let driver = env.dir.join("driver");
    for dir in [&bin, &driver] {
        std::fs::create_dir_all(dir).unwrap();
        open(dir);
    }
    let copy = |from: &Path, to: &Path| {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let fgpu = bin.join("fgpu");
    let front = bin.join("libfgpu.so");
    copy(&fgpu_bin(), &fgpu);
    copy(&front_path(), &front);
    copy(&shim_library_path(), &bin.join("libfgpu_shim.so"));
    copy(&release_dir().join("libfgpu_sim_cuda.so"), &driver.join("libcuda.so.1"));
    copy(&release_dir().join("libfgpu_sim_nvml.so"), &driver.join("libnvidia-ml.so.1"));
    let locked = env.dir.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    open(&locked);
    let run = env
        .command("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&fgpu)
        .args(["doctor", "--json"])
        .env("LD_LIBRARY_PATH", &driver)
        .env("FGPU_LEDGER", locked.join("sub/ledger"))
        .env("LD_PRELOAD", &front)
        .env("FGPU_LIMIT", "1G")
        .run();
    // Nothing printed is a failure (a doctor that crashed prints nothing), shown by json().
    let value = json(&run);
    assert_finding(&run, &value, "shim", "ok", &format!("The front {} and the shim beside it load here", front.display()));
    assert_finding(&run, &value, "ledger", "fail", "is not writable by this user");
}
