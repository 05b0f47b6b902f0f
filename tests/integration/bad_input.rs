//! Bad input fails closed with one clear line; processes that never touch the GPU never
//! notice the shim.

use fgpu_tests::*;

#[test]
fn every_bad_limit_is_named_and_nothing_runs_uncapped() {
    let env = Env::new("bad-limit");
    for bad in ["banana", "-1", "8XB", "", "99999999999999999999999", "0", "150%", "GPU-zz=8G"] {
        let run = env.client(&["init", "primary", "alloc", "1M"]).shim().limit(bad).run();
        assert!(run.output.status.success(), "the process is not killed ({bad:?})\n{run}");
        assert_eq!(run.rc("alloc"), 2, "no allocation succeeds uncapped ({bad:?})\n{run}");
        let stderr = run.stderr();
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "exactly one line ({bad:?})\n{run}");
        assert!(lines[0].contains("FGPU_LIMIT=") && lines[0].contains(&format!("{bad:?}")), "{run}");
    }
}

/// `FGPU_LIMIT=8` is 8 bytes, not 8 GiB: a cap too small for any context is refused at once
/// with what was probably meant, and fails closed like every bad limit.
#[test]
fn a_limit_too_small_for_any_context_is_refused_with_a_hint() {
    let env = Env::new("bad-limit-small");
    for (bad, meant) in [("8", "8G"), ("512K", "512M"), ("GPU-7f2f=4096,*=4G", "4096M")] {
        let run = env.client(&["init", "primary", "alloc", "1M"]).shim().limit(bad).run();
        assert_eq!(run.rc("alloc"), 2, "no allocation succeeds ({bad:?})\n{run}");
        let stderr = run.stderr();
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "exactly one line ({bad:?})\n{run}");
        assert!(lines[0].contains(&format!("FGPU_LIMIT={bad:?}")) && lines[0].contains("too small for any CUDA context"), "{run}");
        assert!(lines[0].contains(&format!("did you mean {meant}?")), "{run}");
    }
    // One byte is the way to give a GPU no memory on purpose (fgpu cdi generate writes `*=1`).
    let run = env.client(&["init", "primary"]).shim().limit("1").run();
    assert_eq!(run.rc("primary"), 2, "a context does not fit in one byte\n{run}");
    assert!(!run.stderr().contains("not a valid limit"), "{run}");
}

#[test]
fn valid_limit_spellings_agree() {
    let env = Env::new("good-limit");
    for good in ["8G", "8GiB", "8GB", "8gb", "8589934592", "8192M", "10%"] {
        let run = env.client(&["init", "primary", "info"]).shim().limit(good).success();
        // 10% of the simulated 80 GiB is 8 GiB too.
        assert_eq!(run.field("info", "total"), (8 * GIB).to_string(), "{good}\n{run}");
    }
}

#[test]
fn per_device_limits_by_uuid() {
    let env = Env::new("per-device").devices(2);
    env.client(&["init"]).success();
    let sim = env.sim();
    let (first, second) = (sim.device_uuid_string(0), sim.device_uuid_string(1));
    assert_ne!(first, second);
    let limit = format!("{}=2G,{}=4G", &first[..13], &second[..13]);
    let run = env.client(&["init", "primary", "info", "device", "1", "total"]).shim().limit(&limit).success();
    assert_eq!(run.field("info", "total"), (2 * GIB).to_string(), "{run}");
    assert_eq!(run.field("total", "total"), (4 * GIB).to_string(), "{run}");
}

#[test]
fn a_ledger_file_that_cannot_be_trusted_or_locked_fails_closed() {
    let env = Env::new("bad-ledger");
    // A link in place of the file: never followed (it could point anywhere).
    let link = env.dir.join("ledger-link");
    std::os::unix::fs::symlink(env.dir.join("elsewhere"), &link).unwrap();
    let run = env.client(&["init", "primary", "alloc", "1M"]).shim().limit("8G").env("FGPU_LEDGER", &link).success();
    assert_eq!(run.rc("primary"), 2, "context refused\n{run}");
    assert_eq!(run.rc("alloc"), 2, "allocation refused\n{run}");
    assert!(run.stderr().contains("symbolic link") && run.stderr().contains(&link.display().to_string()), "{run}");
    assert!(!env.dir.join("elsewhere").exists(), "nothing was created through the link");
    if prerequisite(is_root(), "the part run as another user needs root") {
        // A file this user cannot open for writing (root's, 0644): one line says so.
        use std::os::unix::fs::PermissionsExt;
        let locked = env.dir.join("ledger-root-only");
        std::fs::write(&locked, b"").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o644)).unwrap();
        let run = env
            .command_as(65534, reachable_client("cuclient"))
            .args(["init", "primary", "alloc", "1M"])
            .env("LD_PRELOAD", &reachable().front)
            .env("FGPU_LIMIT", "8G")
            .env("FGPU_LEDGER", &locked)
            .success();
        assert_eq!(run.rc("alloc"), 2, "{run}");
        assert!(run.stderr().contains("cannot be opened for writing by uid 65534"), "{run}");
    }
}

#[test]
fn unwritable_ledger_location_fails_closed() {
    let env = Env::new("ledger-dir");
    let blocker = env.dir.join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let run = env.client(&["init", "primary", "alloc", "1M"]).shim().limit("8G").env("FGPU_LEDGER", blocker.join("ledger")).success();
    assert_eq!(run.rc("alloc"), 2, "{run}");
    assert!(run.stderr().contains("ledger"), "{run}");
}

#[test]
fn programs_that_never_touch_cuda_see_nothing() {
    let env = Env::new("invisible");
    let ledger = env.dir.join("never").join("ledger");
    let run = env.command("sh").args(["-c", "echo hello; ls / >/dev/null"]).shim().limit("8G").env("FGPU_LEDGER", &ledger).success();
    assert_eq!(run.stdout(), "hello\n");
    assert_eq!(run.stderr(), "");
    assert!(!ledger.exists() && !ledger.parent().unwrap().exists(), "no file is created");
    // Even a bad limit stays silent until CUDA is used.
    let run = env.command("sh").args(["-c", "echo quiet"]).shim().limit("banana").success();
    assert_eq!((run.stdout().as_str(), run.stderr().as_str()), ("quiet\n", ""));
}

#[test]
fn no_driver_installed_means_the_shim_stays_out_of_the_way() {
    let env = Env::new("no-driver");
    let mut cmd = env.client(&["init"]).shim().limit("8G");
    cmd.0.env("LD_LIBRARY_PATH", env.dir.join("nothing-here"));
    let run = cmd.run();
    assert!(run.stdout().contains("dlopen failed"), "the program's own error, nothing else\n{run}");
    assert_eq!(run.stderr(), "", "{run}");
}

#[test]
fn no_cap_configured_passes_through() {
    let env = Env::new("uncapped");
    let run = env.client(&["init", "primary", "info", "alloc", "50G"]).shim().success();
    assert_eq!(run.field("info", "total"), (80 * GIB).to_string(), "{run}");
    assert_eq!(run.rc("alloc"), 0);
    assert!(!env.ledger.exists(), "no ledger without a cap");
}

#[test]
fn a_process_joining_with_another_cap_is_held_to_the_lower_and_warned() {
    let env = Env::new("cap-mismatch");
    let mut first = env.client(&["init", "primary", "hold"]).shim().limit("2G").spawn();
    first.wait_for("holding");
    let higher = env.client(&["init", "primary", "info", "alloc", "2G"]).shim().limit("4G").success();
    assert_eq!(higher.field("info", "total"), (2 * GIB).to_string(), "held to the ledger's 2 GiB\n{higher}");
    assert_eq!(higher.rc("alloc"), 2);
    assert!(higher.stderr().contains("already holds 2 GiB"), "{higher}");
    let lower = env.client(&["init", "primary", "info"]).shim().limit("1G").success();
    assert_eq!(lower.field("info", "total"), GIB.to_string(), "held to its own 1 GiB\n{lower}");
    assert!(lower.stderr().contains("held to 1 GiB"), "{lower}");
    drop(first);
}

#[test]
fn quiet_log_level_silences_refusals() {
    let env = Env::new("quiet");
    let run = env.client(&["init", "primary", "alloc", "2G"]).shim().limit("1G").env("FGPU_LOG", "quiet").success();
    assert_eq!(run.rc("alloc"), 2);
    assert_eq!(run.stderr(), "");
    let debug = env.client(&["init", "primary"]).shim().limit("1G").env("FGPU_LOG", "debug").success();
    assert!(debug.stderr().contains("context on device 0"), "{debug}");
}

#[test]
fn refusal_lines_are_rate_limited() {
    let env = Env::new("rate");
    let mut args = vec!["init", "primary"];
    for _ in 0..50 {
        args.extend(["alloc", "2G"]);
    }
    let run = env.client(&args).shim().limit("1G").success();
    assert_eq!(run.lines("alloc").len(), 50);
    let refusals = run.stderr().lines().filter(|l| l.contains("refused")).count();
    assert_eq!(refusals, 1, "one line per second, not fifty\n{run}");
    assert!(run.stderr().contains("of 2 GiB refused") && run.stderr().contains("1 GiB cap"), "{run}");
}

#[test]
fn a_bad_log_level_never_changes_what_is_granted() {
    let env = Env::new("bad-log");
    // No cap asked for: the process is untouched, and told once about the typo.
    let run = env.client(&["init", "primary", "info", "alloc", "50G", "info"]).shim().env("FGPU_LOG", "bogus").success();
    assert_eq!(run.field("info", "total"), (80 * GIB).to_string(), "{run}");
    assert_eq!(run.rc("alloc"), 0, "{run}");
    assert_eq!(
        run.stderr(),
        "fgpu: FGPU_LOG=\"bogus\" is not a log level (quiet, error, warn, info, debug); ignored, logging at warn\n",
        "one warning, once\n{run}"
    );
    assert!(!env.ledger.exists(), "no cap, no ledger\n{run}");
    // A cap: the same cap as without the typo.
    let run = env.client(&["init", "primary", "info", "alloc", "2G", "alloc", "512M"]).shim().limit("1G").env("FGPU_LOG", "bogus").success();
    assert_eq!(run.field("info", "total"), GIB.to_string(), "{run}");
    assert_eq!(run.lines("alloc"), vec!["alloc 2147483648 rc=2", "alloc 536870912 rc=0"], "{run}");
    assert_eq!(run.stderr().matches("FGPU_LOG=").count(), 1, "{run}");
    assert!(run.stderr().contains("refused"), "the default level (warn) applies\n{run}");
    // Empty: silently the default.
    let run = env.client(&["init", "primary", "alloc", "50G"]).shim().env("FGPU_LOG", "").success();
    assert_eq!((run.rc("alloc"), run.stderr().as_str()), (0, ""), "{run}");
}

/// A device key that matches two of the GPUs NVML lists is an error, whatever GPUs the
/// process sees: one line naming the key and both GPUs, and no allocation succeeds.
#[test]
fn an_ambiguous_device_key_fails_closed_naming_the_key_and_its_gpus() {
    // Of the simulator's first five GPUs under UUID seed 0, 1 (GPU-f350…) and 4 (GPU-fb30…)
    // start alike.
    let env = Env::new("ambiguous-key").devices(5);
    env.client(&["init"]).env("FGPU_SIM_UUID_SEED", "0").success();
    let sim = env.sim();
    let (one, four) = (sim.device_uuid_string(1), sim.device_uuid_string(4));
    assert!(one.starts_with("GPU-f") && four.starts_with("GPU-f") && !one.starts_with(&four[..6]));
    for visible in [None, Some("1"), Some("0,2")] {
        let mut cmd = env.client(&["init", "primary", "alloc", "1M"]).shim().limit("GPU-f=2G,*=8G");
        if let Some(v) = visible {
            cmd = cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        let run = cmd.success();
        assert_eq!(run.rc("alloc"), 2, "fails closed (CUDA_VISIBLE_DEVICES={visible:?})\n{run}");
        let stderr = run.stderr();
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{run}");
        assert!(lines[0].contains(r#"FGPU_LIMIT: device key "GPU-f" is ambiguous"#) && lines[0].contains(&one) && lines[0].contains(&four), "{run}");
    }
    // One more digit names one GPU: it is capped, the others get '*'.
    let run = env.client(&["init", "device", "1", "primary", "info"]).shim().limit("GPU-f3=2G,*=8G").success();
    assert_eq!(run.field("info", "total"), (2 * GIB).to_string(), "{run}");
    assert_eq!(run.stderr(), "", "{run}");
}
