//! The ledger's file, and who can reach a ledger: what other processes do to the file
//! crashes nobody and never raises the cap, and users of one host do not share a default
//! ledger. The files here are of ledgers shared on purpose (`FGPU_LEDGER_SHARED=1`), which
//! any user can write; a ledger is private otherwise (tests/integration/security.rs).

use fgpu_tests::*;

/// What the simulated driver holds on GPU 0 (the ground truth).
fn device_used(env: &Env) -> u64 {
    let sim = env.sim();
    sim.reclaim_dead();
    sim.device_used(0)
}

/// A holder with 6 GiB (and its 300 MiB context) under an 8 GiB cap, that allocates 1 GiB
/// more once its stdin closes.
fn holder(env: &Env) -> Background {
    let mut holder = env.client(&["init", "primary", "alloc", "6G", "hold", "alloc", "1G", "info"]).shim().limit("8G").env("FGPU_LEDGER_SHARED", "1").spawn();
    holder.wait_for("holding");
    holder
}

/// A newcomer under the same cap: 2 GiB must be refused (8 GiB - 6.3 GiB held - its own
/// 300 MiB context leaves 1.4 GiB) and 1 GiB granted.
fn assert_newcomer_shares_the_cap(env: &Env, what: &str) {
    let run = env.client(&["init", "primary", "alloc", "2G", "alloc", "1G"]).shim().limit("8G").env("FGPU_LEDGER_SHARED", "1").success();
    let rcs: Vec<i64> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap().parse().unwrap()).collect();
    assert_eq!(rcs, vec![2, 0], "{what}: the newcomer must share the holder's cap\n{run}");
    assert!(device_used(env) <= 8 * GIB, "{what}: the device holds more than the cap");
}

/// The holder lives through it all and exits normally (a SIGBUS would be status 135).
fn assert_holder_unharmed(mut holder: Background, what: &str) {
    let run = holder.finish();
    assert!(run.output.status.success(), "{what}: the holder did not survive\n{run}");
    assert_eq!(run.lines("alloc")[1], "alloc 1073741824 rc=0", "{what}\n{run}");
}

#[test]
fn truncating_or_overwriting_the_file_crashes_nobody_and_keeps_the_cap() {
    let env = Env::new("tamper-garble");
    let holder = holder(&env);
    let ledger = env.ledger.display().to_string();
    // Done by an unprivileged process where we can (the file is 0666 for a shared ledger).
    let tamper = |script: &str| {
        if is_root() {
            env.command_as(65534, "sh").args(["-c", script]).success();
        } else {
            env.command("sh").args(["-c", script]).success();
        }
    };
    tamper(&format!("truncate -s 0 '{ledger}'"));
    assert_newcomer_shares_the_cap(&env, "truncated");
    tamper(&format!("head -c 100000 /dev/urandom > '{ledger}'"));
    assert_newcomer_shares_the_cap(&env, "overwritten with garbage");
    tamper(&format!("echo garbage > '{ledger}'"));
    assert_newcomer_shares_the_cap(&env, "echo garbage >");
    assert_holder_unharmed(holder, "tampered");
}

#[test]
fn deleting_or_recreating_the_file_never_doubles_the_cap() {
    let env = Env::new("tamper-delete");
    let holder = holder(&env);
    std::fs::remove_file(&env.ledger).unwrap();
    assert_newcomer_shares_the_cap(&env, "deleted");
    std::fs::remove_file(&env.ledger).unwrap();
    std::fs::write(&env.ledger, b"a new file in its place\n").unwrap();
    assert_newcomer_shares_the_cap(&env, "recreated");
    // doctor names what happened.
    let doctor = env.command(fgpu_bin()).args(["doctor", "--json"]).run();
    let value: serde_json::Value = serde_json::from_str(&doctor.stdout()).unwrap_or_else(|e| panic!("{e}\n{doctor}"));
    let named = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["check"] == "ledger" && f["level"] == "warn" && f["message"].as_str().unwrap().contains("replaced"));
    assert!(named, "doctor must name the replaced file\n{doctor}");
    if prerequisite(is_root(), "the part run as another user needs root") {
        // A user who cannot reach the holder's /proc/PID/fd cannot reach the old file: it
        // refuses rather than starting a ledger of its own beside the holder's.
        let run = env
            .command_as(65534, reachable_client("cuclient"))
            .args(["init", "primary", "alloc", "1G"])
            .env("LD_PRELOAD", &reachable().front)
            .env("FGPU_LIMIT", "8G")
            .env("FGPU_LEDGER_SHARED", "1")
            .success();
        assert_eq!(run.rc("alloc"), 2, "{run}");
        assert!(run.stderr().contains("deleted or replaced"), "one line says why\n{run}");
    }
    assert_holder_unharmed(holder, "deleted and recreated");
    // Once the holder is gone the ledger is whole again: the full cap for a newcomer.
    let run = env.client(&["init", "primary", "alloc", "7G"]).shim().limit("8G").env("FGPU_LEDGER_SHARED", "1").success();
    assert_eq!(run.rc("alloc"), 0, "{run}");
}

#[test]
fn users_do_not_share_a_default_ledger() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to run a second user") {
        return;
    }
    let env = Env::new("per-user");
    // Root holds 6 GiB of an 8 GiB cap, with no ledger named: its own default ledger.
    let mut root_job = env.client(&["init", "primary", "alloc", "6G", "hold"]).shim().limit("8G");
    root_job.0.env_remove("FGPU_LEDGER");
    let mut root_job = root_job.spawn();
    root_job.wait_for("holding");
    use std::os::unix::fs::MetadataExt;
    // Where root's default ledger is on this host (its runtime directory, else /tmp), as
    // the shim, fgpu status and fgpu doctor all work it out.
    let places = fgpu_core::ledger::default_path::OsPlaces;
    let root_ledger = fgpu_core::ledger::default_path::choose(0, &places).unwrap().path;
    let root_dir = std::fs::metadata(root_ledger.parent().unwrap()).unwrap();
    assert_eq!((root_dir.uid(), root_dir.mode() & 0o777), (0, 0o700), "the default ledger's directory is root's own");
    assert_eq!(std::fs::metadata(&root_ledger).unwrap().mode() & 0o777, 0o600, "{}", root_ledger.display());
    let as_nobody = |args: &[&str]| {
        let mut cmd = env.command_as(65534, reachable_client("cuclient")).args(args).env("LD_PRELOAD", &reachable().front).env("FGPU_LIMIT", "8G");
        cmd.0.env_remove("FGPU_LEDGER");
        cmd
    };
    // Another user's job is not capped with root's: it gets its own 8 GiB.
    let run = as_nobody(&["init", "primary", "alloc", "4G", "info"]).success();
    assert_eq!(run.rc("alloc"), 0, "user 65534 is capped with root's job\n{run}");
    assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB - 4 * GIB).to_string(), "{run}");
    // Nor can it reach root's ledger by naming it, shared or not.
    for shared in ["0", "1"] {
        let run = as_nobody(&["init", "primary", "alloc", "1M"]).env("FGPU_LEDGER", &root_ledger).env("FGPU_LEDGER_SHARED", shared).success();
        assert_eq!(run.rc("alloc"), 2, "{run}");
        assert!(run.stderr().contains(&root_ledger.display().to_string()), "{run}");
    }
    // A place squatted by another user: tests/integration/security.rs (h3_...).
    root_job.finish();
}

#[test]
fn a_full_disk_leaves_no_trap_for_other_users() {
    // The ledger's file holds no data, only locks and a 40-byte hint: on a full file system
    // root's process still caps (the data is in shared memory), and the file it leaves is
    // one that every user can lock, not an empty 0644 file that refuses them later.
    if !prerequisite(is_root() && tool("unshare") && tool("setpriv"), "root, unshare(1) and setpriv(1) for a full file system and a second user") {
        return;
    }
    let env = Env::new("full-disk");
    let full = env.dir.join("full");
    std::fs::create_dir(&full).unwrap();
    let ledger = full.join("ledger");
    let client = reachable_client("cuclient");
    let script = format!(
        "set -e; mount -t tmpfs -o size=64k fgpu-test {full}; dd if=/dev/zero of={full}/filler bs=4k 2>/dev/null || true; \
         {client} init primary alloc 1G; stat -c 'mode=%a size=%s' {ledger}; \
         setpriv --reuid 65534 --regid 65534 --clear-groups -- {client} init primary alloc 1G",
        full = full.display(),
        client = client.display(),
        ledger = ledger.display()
    );
    let run = env
        .command("unshare")
        .args(["--mount", "sh", "-c", &script])
        .env("LD_PRELOAD", &reachable().front)
        .env("LD_LIBRARY_PATH", &reachable().sim_lib_dir)
        .env("FGPU_LIMIT", "8G")
        .env("FGPU_LEDGER", &ledger)
        .env("FGPU_LEDGER_SHARED", "1")
        .run();
    assert!(run.output.status.success(), "{run}");
    let rcs: Vec<String> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    assert_eq!(rcs, ["0", "0"], "root on a full disk, then another user, both capped and granted\n{run}");
    assert!(run.stdout().contains("mode=666"), "the file is open to every user of the ledger\n{run}");
}
