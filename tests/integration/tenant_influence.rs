//! What a tenant can make of root's tools, of placement and of the host's shared-memory
//! limit (docs/security.md, "Attacks"), from the second security review: a cap written in
//! a tenant's ledger does not steer root's `fgpu run --gpus auto`, a path a tenant records
//! is never looked up in root's file system, and a user who takes every shared-memory
//! segment, or every place of another user's placement lock, is named or refused, never
//! silently passed over. Each test fails on the code before its fix. (F1, the scan that a
//! tenant's file stalled, is tested with a fake /proc in `cli/src/ledgers.rs`.)

use fgpu_core::ledger::layout::{DeviceEntry, DEVICES_OFFSET, DEVICE_READY, MAX_DEVICES, SEGMENT_SIZE};
use fgpu_tests::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Relaxed, Release};

const TENANT: u32 = 4362;

fn fgpu(env: &Env) -> Cmd {
    let mut cmd = env.command(fgpu_bin());
    cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
    cmd
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{run}"))
}

/// Paths removed when the test ends, however it ends (some belong to other users, in
/// `/tmp`).
struct RemovedAtEnd(Vec<PathBuf>);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// A directory every user may write in (sticky), under the reachable copies.
fn open_dir(name: &str) -> PathBuf {
    let dir = reachable().dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// The id of the one ledger-sized segment user `uid` owns, from the kernel's table.
fn segment_of(uid: u32) -> i32 {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap();
    let rows: Vec<Vec<&str>> = table.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let mine: Vec<&Vec<&str>> =
        rows.iter().filter(|r| r.get(7) == Some(&uid.to_string().as_str()) && r.get(3) == Some(&SEGMENT_SIZE.to_string().as_str())).collect();
    assert_eq!(mine.len(), 1, "one ledger of uid {uid}\n{table}");
    mine[0][1].parse().unwrap()
}

/// Writes into segment `shmid` a cap of `cap` on the GPU `uuid` (its entry, or a free one),
/// as any process of that ledger can: every one maps it read-write.
fn claim(shmid: i32, uuid: &str, cap: u64, total: u64) {
    let bytes = fgpu_core::uuid::parse_gpu_uuid(uuid).unwrap();
    let words = [u64::from_le_bytes(bytes[..8].try_into().unwrap()), u64::from_le_bytes(bytes[8..].try_into().unwrap())];
    // SAFETY: models shmat(2) of an existing segment at a kernel-chosen address.
    let base = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
    assert_ne!(base as isize, -1, "attach segment {shmid}: {}", std::io::Error::last_os_error());
    // SAFETY: the segment is SEGMENT_SIZE bytes; the device entries (all atomics, 8-byte
    // aligned) sit at DEVICES_OFFSET, as fgpu_core::ledger::layout says.
    let entries = unsafe { std::slice::from_raw_parts(base.cast::<u8>().add(DEVICES_OFFSET).cast::<DeviceEntry>(), MAX_DEVICES) };
    let same = |e: &DeviceEntry| e.state.load(Relaxed) == DEVICE_READY && [e.uuid[0].load(Relaxed), e.uuid[1].load(Relaxed)] == words;
    let entry = entries.iter().find(|e| same(e)).or_else(|| entries.iter().find(|e| e.state.load(Relaxed) != DEVICE_READY)).unwrap();
    entry.uuid[0].store(words[0], Relaxed);
    entry.uuid[1].store(words[1], Relaxed);
    entry.total_memory.store(total, Relaxed);
    entry.cap.store(cap, Relaxed);
    entry.state.store(DEVICE_READY, Release);
    // SAFETY: attached above; nothing borrowed from it is used after.
    unsafe { libc::shmdt(base) };
}

/// The GPUs' UUIDs, from the driver as `fgpu` sees it.
fn gpu_uuids(env: &Env) -> Vec<String> {
    let probe = json(&fgpu(env).arg("__driver-probe").success());
    probe["devices"].as_array().unwrap().iter().map(|d| d["uuid"].as_str().unwrap().to_string()).collect()
}

/// F3: a tenant capped at 1 GiB writes into its own ledger a cap of 80 GiB on GPU 1, and
/// then on both GPUs: root's `--gpus auto` still counts only what the driver shows the
/// tenant's processes hold. A job that must wait says what for. Root's commands run in an
/// IPC namespace of the test's own (entered with nsenter), so that the ledgers of other
/// tests, on simulated GPUs with the same UUIDs, are not root's own there.
#[test]
fn f3_caps_a_tenant_writes_do_not_steer_roots_placement() {
    if !prerequisite(is_root() && tool("setpriv") && tool("unshare") && tool("nsenter"), "needs root, setpriv(1), unshare(1) and nsenter(1)") {
        return;
    }
    let env = Env::new("infl-f3").devices(2);
    env.client(&["init"]).success();
    let dir = open_dir("f3");
    let _remove = RemovedAtEnd(vec![dir.clone()]);
    let mut tenant = env
        .command_as(TENANT, reachable_client("cuclient"))
        .args(["init", "primary", "alloc", "256M", "hold"])
        .env("LD_PRELOAD", &reachable().front)
        .env("FGPU_LEDGER", dir.join("ledger"))
        .limit("1G")
        .spawn();
    tenant.wait_for("holding");
    let uuids = gpu_uuids(&env);
    let shmid = segment_of(TENANT);
    claim(shmid, &uuids[1], 80 * GIB, 80 * GIB);
    let mut namespace = env.command("unshare").args(["--ipc", "sh", "-c", "echo ready; exec cat"]).spawn();
    namespace.wait_for("ready");
    let ns = namespace.pid().to_string();
    let in_ns = |script: String| {
        let mut cmd = env.command("nsenter").args(["--target", &ns, "--ipc", "--", "sh", "-c", &script]);
        cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
        cmd
    };
    let fgpu_run = |args: &str| format!("exec {} run --gpus auto {args} 2>&1", fgpu_bin().display());
    let place = |limit: &str| in_ns(fgpu_run(&format!("--limit {limit} -- true"))).run();
    let run = place("70G");
    assert!(run.output.status.success(), "{run}");
    assert!(run.stdout().contains("fgpu run: on GPU 1 ("), "GPU 1 is free whatever the tenant's ledger claims\n{run}");
    claim(shmid, &uuids[0], 80 * GIB, 80 * GIB);
    let run = place("4G");
    assert!(run.output.status.success(), "a claim forged on every GPU refused a job\n{run}");
    assert!(run.stdout().contains("fgpu run: on GPU 1 ("), "{run}");

    // Root's own jobs commit their caps; one that finds no room says what holds it.
    let client = client("cuclient").display().to_string();
    let hold = || {
        let mut job = in_ns(fgpu_run(&format!("--limit 70G -- {client} init primary alloc 1M hold"))).spawn();
        job.wait_for("holding");
        job
    };
    let mut first = hold(); // GPU 1: 80 GiB free, against GPU 0's 80 less the tenant's
    let mut second = hold(); // GPU 0
    let mut waiter = in_ns(fgpu_run("--wait --limit 12G -- true")).spawn();
    let line = waiter.wait_for("fgpu run: waiting for room");
    for (gpu, uuid) in uuids.iter().enumerate() {
        assert!(line.contains(&format!("GPU {gpu} ({uuid}) needs 12 GiB, has ")), "{line}");
    }
    assert_eq!(line.matches("committed 70 GiB by ").count(), 2, "each GPU names the job that holds it\n{line}");
    for job in [&first, &second] {
        assert!(line.contains(&job.pid().to_string()), "the jobs' PIDs are named\n{line}");
    }
    assert!(line.contains(&format!("PID {} ", tenant.pid())), "what the tenant holds is named as the driver shows it\n{line}");
    first.finish();
    let done = waiter.finish();
    assert!(done.output.status.success(), "placed once room was let go\n{done}");
    assert!(done.stdout().contains("fgpu run: on GPU 1 ("), "{done}");
    second.finish();
    namespace.finish();
    tenant.finish();
}

/// F4: `status --all` told a tenant whether a path of its choosing exists in root's file
/// system ("was replaced by another file" against "was deleted"). A tenant in a mount
/// namespace of its own records a ledger path that, in root's, names a file or nothing:
/// root's report of its ledger is the same either way, and says neither.
#[test]
fn f4_status_tells_a_tenant_nothing_of_roots_file_system() {
    if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1) for a tenant with a mount namespace of its own") {
        return;
    }
    let env = Env::new("infl-f4");
    env.client(&["init"]).success();
    let probe = env.dir.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let ledger = probe.join("ledger");
    let script = format!("mount -t tmpfs fgpu-tenant {} && exec \"$0\" init primary alloc 64M hold", probe.display());
    let mut tenant =
        env.command("unshare").args(["--mount", "sh", "-c", &script]).arg(client("cuclient")).shim().env("FGPU_LEDGER", &ledger).limit("1G").spawn();
    tenant.wait_for("holding");
    let report = |exists: bool| {
        if exists {
            std::fs::write(&ledger, b"a file of root's").unwrap();
        } else {
            let _ = std::fs::remove_file(&ledger);
        }
        let run = fgpu(&env).args(["status", "--all", "--json"]).success();
        let value = json(&run);
        let found = value["ledgers"].as_array().unwrap().iter().find(|l| l["path"] == ledger.display().to_string()).cloned();
        let found = found.unwrap_or_else(|| panic!("the tenant's ledger is found\n{run}"));
        (found["state"].clone(), found["error"].clone(), run)
    };
    let (with_file, without_file) = (report(true), report(false));
    assert_eq!(with_file.0, "ok", "{}", with_file.2);
    assert_eq!(
        (&with_file.0, &with_file.1),
        (&without_file.0, &without_file.1),
        "the report differs with what exists in root's file system\n{}\n{}",
        with_file.2,
        without_file.2
    );
    assert_eq!(with_file.1, Value::Null, "{}", with_file.2);
    // A ledger named here, in root's own file system, is still told of: its file deleted
    // under its processes.
    let mut own = env.client(&["init", "primary", "alloc", "64M", "hold"]).shim().limit("1G").spawn();
    own.wait_for("holding");
    std::fs::remove_file(&env.ledger).unwrap();
    let run = fgpu(&env).args(["status", "--json"]).run();
    assert!(run.stdout().contains("the file was deleted or replaced while processes still use the ledger"), "{run}");
    own.finish();
    tenant.finish();
}

/// F5: a user who makes shared-memory segments up to kernel.shmmni keeps every other
/// user's new ledger from being made. Refused still (fail closed), but the line names the
/// limit and who holds the segments, and `fgpu doctor` reports it. In an IPC namespace of
/// the test's own, with kernel.shmmni set to 8 there.
#[test]
fn f5_a_full_shared_memory_table_is_named() {
    if !prerequisite(is_root() && tool("unshare") && tool("setpriv") && tool("ipcmk"), "needs root, unshare(1), setpriv(1) and ipcmk(1)") {
        return;
    }
    let env = Env::new("infl-f5");
    env.client(&["init"]).success();
    let squatter = TENANT + 1;
    let script = format!(
        "echo 8 > /proc/sys/kernel/shmmni && for i in 1 2 3 4 5 6 7 8; do setpriv --reuid {squatter} --regid {squatter} --clear-groups ipcmk -M 4096 >/dev/null || exit 9; done; \
         \"$0\" init primary alloc 1M; echo ===; {fgpu} doctor --json; true",
        fgpu = fgpu_bin().display()
    );
    let run = env.command("unshare").args(["--ipc", "sh", "-c", &script]).arg(client("cuclient")).shim().limit("1G").env("TMPDIR", &env.dir).run();
    let stdout = run.stdout();
    let (client_out, doctor_out) = stdout.split_once("===\n").unwrap_or_else(|| panic!("{run}"));
    assert!(client_out.contains("rc=2"), "GPU memory is refused: no ledger can be made\n{run}");
    let refusal = run.stderr().lines().find(|l| l.contains("cannot create its shared memory")).map(str::to_string).unwrap_or_else(|| panic!("{run}"));
    assert!(refusal.contains("kernel.shmmni (8)") && refusal.contains(&format!("uid {squatter} holds 8")), "the line names the limit and who holds it\n{run}");
    let doctor: Value = serde_json::from_str(doctor_out).unwrap_or_else(|e| panic!("{e}\n{run}"));
    let shm = doctor["findings"].as_array().unwrap().iter().find(|f| f["check"] == "shm").cloned().unwrap_or_else(|| panic!("no shm finding\n{run}"));
    assert_eq!(shm["level"], "fail", "{run}");
    let message = shm["message"].as_str().unwrap();
    assert!(message.contains("8 of kernel.shmmni 8 shared-memory segments") && message.contains(&format!("uid {squatter} holds 8")), "{message}");
}

/// F5: every default place of a user's taken (another user made `/tmp/fgpu-UID` ... `.7`
/// first, and there is no /run/user/UID), `fgpu run --gpus auto` took no placement lock at
/// all, so two placements could count the same room. Now it locks in `~/.cache/fgpu` of a
/// home directory that is the user's own, and refuses where there is none.
#[test]
fn f5_the_placement_lock_is_never_skipped() {
    if !prerequisite(is_root() && tool("unshare") && tool("setpriv"), "needs root, unshare(1) and setpriv(1)") {
        return;
    }
    let env = Env::new("infl-f5-lock");
    env.client(&["init"]).success();
    let (user, squatter) = (TENANT + 10, TENANT + 11);
    let places: Vec<String> = (0..8).map(|i| if i == 0 { format!("/tmp/fgpu-{user}") } else { format!("/tmp/fgpu-{user}.{i}") }).collect();
    drop(RemovedAtEnd(places.iter().map(PathBuf::from).collect())); // left by an earlier run
    let home = open_dir("f5-home").join("home");
    let tmp = open_dir("f5-tmp");
    let _remove = RemovedAtEnd(places.iter().map(PathBuf::from).chain([home.parent().unwrap().to_path_buf(), tmp.clone()]).collect());
    let squat = places.iter().map(|p| format!("mkdir -m 0700 {p}")).collect::<Vec<_>>().join(" && ");
    let fgpu_copy = reachable_fgpu();
    let run_as_user = format!(
        "setpriv --reuid {user} --regid {user} --clear-groups env TMPDIR={tmp} FGPU_SHIM={front} {fgpu} run --gpus auto --limit 1G -- true",
        tmp = tmp.display(),
        front = reachable().front.display(),
        fgpu = fgpu_copy.display()
    );
    // The squatter's directories in /tmp (removed after), a /run of the test's own (no
    // /run/user/UID); then the user with no home, and with one (a passwd entry in a
    // private /etc).
    Cmd(std::process::Command::new("setpriv"))
        .args(["--reuid", &squatter.to_string(), "--regid", &squatter.to_string(), "--clear-groups", "sh", "-c", &squat])
        .success();
    let script = |passwd: &str| format!("mount -t tmpfs fgpu-run /run && mkdir -m 0755 /run/user && {passwd} {run_as_user}");
    let homeless = env.with_private_etc(&script("")).expect("checked above").run();
    assert!(!homeless.output.status.success(), "a placement with no safe place for its lock is refused\n{homeless}");
    assert!(homeless.stderr().contains("no safe place for the placement lock"), "{homeless}");
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(user), Some(user)).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let passwd = format!("echo 'fgpu-f5:x:{user}:{user}::{}:/bin/sh' >> /etc/passwd &&", home.display());
    let homed = env.with_private_etc(&script(&passwd)).expect("checked above").run();
    assert!(homed.output.status.success(), "{homed}");
    assert!(placed_lock(&home).exists(), "the lock is in the user's home\n{homed}");
}

fn placed_lock(home: &Path) -> PathBuf {
    home.join(".cache/fgpu/placement.lock")
}
