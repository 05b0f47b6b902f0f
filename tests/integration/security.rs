//! fgpu against hostile tenants and other users (docs/security.md, "Attacks"): what a
//! ledger's processes write never makes root's tools write a file, a job's ledger is
//! private to its user unless shared on purpose, nobody can take another user's default
//! ledger, and the host services survive floods. Each test is one finding of the security
//! review and fails on the code before its fix.

use fgpu_core::ledger::layout::{Header, MAGIC, MAX_DEVICES, MAX_SLOTS, PATH_BYTES, SEGMENT_SIZE, SHARING_USER, VERSION};
use fgpu_tests::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TENANT: u32 = 65534;

fn fgpu(env: &Env) -> Cmd {
    let mut cmd = env.command(fgpu_bin());
    cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
    cmd
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{run}"))
}

/// A root-owned file a tenant would like root to chmod and overwrite (think /etc/shadow):
/// its mode, owner, bytes and change time, to compare after.
struct Target {
    path: PathBuf,
    before: (u32, u32, Vec<u8>, i64, i64),
}

impl Target {
    fn new(dir: &Path) -> Target {
        let secret = dir.join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = secret.join("shadow");
        std::fs::write(&path, b"root:$6$precious:19000:0:99999:7:::\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = Self::state(&path);
        Target { path, before }
    }

    fn state(path: &Path) -> (u32, u32, Vec<u8>, i64, i64) {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.mode() & 0o7777, meta.uid(), std::fs::read(path).unwrap(), meta.ctime(), meta.ctime_nsec())
    }

    fn assert_untouched(&self, what: &str) {
        let now = Self::state(&self.path);
        assert_eq!(now.0, self.before.0, "{what}: the mode of {} changed", self.path.display());
        assert_eq!(now.2, self.before.2, "{what}: the bytes of {} changed", self.path.display());
        assert_eq!((now.3, now.4), (self.before.3, self.before.4), "{what}: {} was changed (ctime moved)", self.path.display());
    }

    fn identity(&self) -> (u64, u64) {
        let meta = std::fs::metadata(&self.path).unwrap();
        (meta.dev(), meta.ino())
    }
}

/// A ledger header as a tenant writes it: valid in every field a reader checks, naming
/// `path` and claiming the file `lock` (device, inode).
fn forged_header(path: &str, lock: (u64, u64)) -> Vec<u8> {
    use std::mem::offset_of;
    let mut h = vec![0u8; 512];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(offset_of!(Header, magic), &MAGIC.to_le_bytes());
    put(offset_of!(Header, version), &VERSION.to_le_bytes());
    put(offset_of!(Header, max_devices), &(MAX_DEVICES as u32).to_le_bytes());
    put(offset_of!(Header, max_slots), &(MAX_SLOTS as u32).to_le_bytes());
    put(offset_of!(Header, slot_size), &576u32.to_le_bytes());
    put(offset_of!(Header, segment_size), &(SEGMENT_SIZE as u64).to_le_bytes());
    put(offset_of!(Header, lock_dev), &lock.0.to_le_bytes());
    put(offset_of!(Header, lock_ino), &lock.1.to_le_bytes());
    put(offset_of!(Header, sharing), &SHARING_USER.to_le_bytes());
    let mut padded = path.as_bytes().to_vec();
    padded.resize(PATH_BYTES, 0);
    put(offset_of!(Header, path), &padded);
    h
}

/// A tenant process holding a forged ledger segment, in `root` (a directory it is
/// chrooted into, as a container's processes are) or in the host's root.
fn forge(env: &Env, header: &[u8], root: Option<&Path>) -> (Background, i32) {
    let file = env.dir.join(format!("header-{}", root.is_some()));
    std::fs::write(&file, header).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = env.command(client("ledger_tenant")).args(["forge".as_ref(), file.as_os_str(), SEGMENT_SIZE.to_string().as_ref()]);
    if let Some(root) = root {
        cmd = cmd.arg(root);
    }
    let mut tenant = cmd.arg(TENANT.to_string()).spawn();
    let line = tenant.wait_for("forged");
    let shmid = field(&line, "shmid").unwrap().parse().unwrap();
    (tenant, shmid)
}

fn http_get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    fgpu_tests::http_get(port, path, "text/plain")
}

fn start_exporter(env: &Env, args: &[&str]) -> (Background, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let exporter = fgpu(env).args(["exporter", "--listen", &listen]).args(args).spawn();
    eventually("the exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    (exporter, port)
}

// ------------------------------------------------------------------------------ H1

/// H1: a segment whose header names a root-owned file, through a symbolic link inside a
/// chrooted tenant's root (which root's tools used to follow out of it) and as a plain
/// host path (a tenant whose root is the host's): `fgpu status --all` and a scrape of
/// `fgpu exporter --all` leave the file's mode, bytes and change time as they were, and
/// show the segment as not verified.
#[test]
fn h1_a_path_in_a_ledger_never_makes_roots_tools_change_a_file() {
    if !prerequisite(is_root(), "needs root: the tools under attack run as root, the tenant as another user") {
        return;
    }
    let env = Env::new("sec-h1");
    let target = Target::new(&env.dir);
    // The tenant's root: a directory with /tmp/d -> the target's directory, as the host
    // names it (inside the root it leads nowhere).
    let root = env.dir.join("tenant-root");
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::os::unix::fs::symlink(target.path.parent().unwrap(), root.join("tmp/d")).unwrap();
    let (mut chrooted, _) = forge(&env, &forged_header("/tmp/d/shadow", target.identity()), Some(&root));
    let (mut plain, plain_shmid) = forge(&env, &forged_header(target.path.to_str().unwrap(), target.identity()), None);

    for walk in [false, true] {
        let mut status = fgpu(&env).args(["status", "--all", "--json"]);
        if walk {
            // As on a kernel without openat2: the walk refuses every link.
            status = status.env("FGPU_RESOLVE_BY_WALK", "1");
        }
        let run = status.run();
        target.assert_untouched(&format!("fgpu status --all (walk: {walk})"));
        let report = json(&run);
        let ours: Vec<&Value> = report["ledgers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| {
                l["mapped_by"].as_array().is_some_and(|m| m.iter().any(|p| p.as_u64() == Some(chrooted.pid() as u64) || p.as_u64() == Some(plain.pid() as u64)))
            })
            .collect();
        assert_eq!(ours.len(), 2, "both forged ledgers are shown\n{run}");
        for l in &ours {
            let state = l["state"].as_str().unwrap();
            assert!(state == "unverified" || state == "error", "a forged ledger is never taken as verified: {state}\n{run}");
        }
        let plain_report = ours.iter().find(|l| l["id"].as_str().unwrap().ends_with(&format!(":shm:{plain_shmid}"))).unwrap();
        assert_eq!(plain_report["state"], "unverified", "{run}");
        assert!(plain_report["error"].as_str().unwrap().contains("uid 0"), "it says why\n{run}");
        let text = fgpu(&env).args(["status", "--all"]).run();
        assert!(text.stdout().contains("not verified"), "{text}");
        target.assert_untouched("fgpu status --all (text)");
    }

    let (_exporter, port) = start_exporter(&env, &["--all"]);
    let (head, body) = http_get(port, "/metrics").unwrap();
    assert!(head.contains(" 200 "), "{head}");
    target.assert_untouched("a scrape of fgpu exporter --all");
    assert!(body.contains("fgpu_ledger_state{") && body.contains("state=\"unverified\"} 1"), "{body}");
    chrooted.finish();
    plain.finish();
}

// ------------------------------------------------------------------------------ H2

/// H2: another user can neither attach nor read the ledger of a `fgpu run` job; with
/// --shared-ledger two users' runs share one cap on purpose.
#[test]
fn h2_a_run_ledger_is_private_to_its_user() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to run jobs as two users") {
        return;
    }
    let env = Env::new("sec-h2");
    // The simulated GPU, made by root for every user.
    env.client(&["init"]).success();
    let dir = reachable().dir.join(format!("h2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let fgpu_copy = reachable_fgpu();
    let run_as = |uid: u32, args: &[&str]| {
        env.command_as(uid, &fgpu_copy)
            .args(["run", "--limit", "1G"])
            .args(args)
            .env("TMPDIR", &dir)
            .env("FGPU_SHIM", &reachable().front)
            .arg("--")
            .arg(reachable_client("cuclient"))
    };
    let mut victim = run_as(4242, &[]).args(["init", "primary", "alloc", "256M", "hold"]).spawn();
    victim.wait_for("holding");
    // The victim's segment, from the kernel's table.
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap();
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.split_whitespace().nth(7) == Some("4242"))
        .unwrap_or_else(|| panic!("no segment of uid 4242\n{table}"))
        .split_whitespace()
        .collect();
    let (shmid, perms) = (row[1], u32::from_str_radix(row[2], 8).unwrap());
    assert_eq!(perms & 0o777, 0o600, "the run's shared memory is the user's own\n{table}");
    let attach = env.command_as(4243, reachable_client("ledger_tenant")).args(["attach", shmid]).success();
    assert!(attach.stdout().contains("attach errno=13"), "another user attached the run's ledger\n{attach}");
    let look = env.command_as(4243, &fgpu_copy).args(["status", "--all", "--json"]).run();
    assert!(!look.stdout().contains("\"pid_in_namespace\""), "another user read the run's processes\n{look}");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path().join("ledger")).filter(|p| p.exists()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(std::fs::metadata(&files[0]).unwrap().mode() & 0o777, 0o600);
    victim.finish();

    // Shared on purpose: two users, one cap.
    let shared = dir.join("shared-ledger");
    let ledger = shared.display().to_string();
    let mut first = run_as(4242, &["--ledger", &ledger, "--shared-ledger"]).args(["init", "primary", "alloc", "600M", "hold"]).spawn();
    first.wait_for("holding");
    let second = run_as(4243, &["--ledger", &ledger, "--shared-ledger"]).args(["init", "primary", "alloc", "600M"]).success();
    assert_eq!(second.rc("alloc"), 2, "one cap for both users: 600M + 600M + contexts > 1G\n{second}");
    first.finish();
    // Without --shared-ledger the other user may not use the file at all: asked once the
    // first user's job has ended, when the cap alone would grant 1 MiB, and refused for
    // the file's owner.
    let refused = run_as(4243, &["--ledger", &ledger]).args(["init", "primary", "alloc", "1M"]).success();
    assert_eq!(refused.rc("alloc"), 2, "{refused}");
    assert!(refused.stderr().contains("belongs to uid 4242, not to this user (uid 4243)"), "refused for another reason than the file's owner\n{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------------------ H3

/// `sh -c script` with a /run/user of its own (a tmpfs), so the test reads no host state.
fn with_own_run_user(env: &Env, script: &str) -> Cmd {
    let setup = format!("set -e; mount -t tmpfs fgpu-run /run; mkdir -m 0755 /run/user; {script}");
    env.command("unshare").args(["--mount", "sh", "-c", &setup])
}

/// H3: a directory another user made in `/tmp` (or a link there) no longer locks a user
/// out: the user's default ledger moves to the next place of its own and says so once; a
/// runtime directory of the user's, where logind makes one, comes first.
#[test]
fn h3_a_squatted_default_ledger_does_not_lock_a_user_out() {
    if !prerequisite(is_root() && tool("setpriv") && tool("unshare"), "needs root, setpriv(1) and unshare(1) for two users and a /run/user of the test's own") {
        return;
    }
    let env = Env::new("sec-h3");
    let (victim, squatter) = (4252u32, 4253u32);
    let places: Vec<String> = (0..8).map(|i| if i == 0 { format!("/tmp/fgpu-{victim}") } else { format!("/tmp/fgpu-{victim}.{i}") }).collect();
    let clean = || {
        for p in &places {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_dir_all(p);
        }
    };
    clean();
    // The simulated GPU, made by root for every user.
    env.client(&["init"]).success();
    let client = reachable_client("cuclient");
    let job = |script_before: &str| {
        let script =
            format!("{script_before} setpriv --reuid {victim} --regid {victim} --clear-groups -- {c} init primary alloc 1G info", c = client.display());
        let mut cmd =
            with_own_run_user(&env, &script).env("LD_PRELOAD", &reachable().front).env("LD_LIBRARY_PATH", &reachable().sim_lib_dir).env("FGPU_LIMIT", "8G");
        cmd.0.env_remove("FGPU_LEDGER");
        cmd.run()
    };
    // The squat of the review: `mkdir -m 0700 /tmp/fgpu-VICTIM` by another user.
    let squat = env.command_as(squatter, "mkdir").args(["-m", "0700", &places[0]]).success();
    drop(squat);
    let run = job("");
    assert!(run.output.status.success(), "{run}");
    assert_eq!(run.rc("alloc"), 0, "the squatted user still gets GPU memory\n{run}");
    assert!(
        run.stderr().contains(&format!("{} belongs to uid {squatter}", places[0])) && run.stderr().contains(&places[1]),
        "said once, with the place used\n{run}"
    );
    assert_eq!(run.stderr().matches("belongs to uid").count(), 1, "{run}");
    let ledger_dir = std::fs::metadata(&places[1]).unwrap();
    assert_eq!((ledger_dir.uid(), ledger_dir.mode() & 0o777), (victim, 0o700), "the place used is the user's own");

    // A link in the next place: passed over too.
    std::os::unix::fs::symlink("/tmp", &places[2]).unwrap();
    std::fs::remove_dir_all(&places[1]).unwrap();
    env.command_as(squatter, "mkdir").args(["-m", "0777", &places[1]]).success();
    let run = job("");
    assert_eq!(run.rc("alloc"), 0, "{run}");
    assert!(std::fs::metadata(&places[3]).is_ok_and(|m| m.uid() == victim), "{run}");

    // Where the user has a runtime directory, the ledger is there and /tmp does not matter.
    let run = job(&format!("mkdir -m 0700 /run/user/{victim} && chown {victim}:{victim} /run/user/{victim} &&"));
    assert_eq!(run.rc("alloc"), 0, "{run}");
    assert!(!run.stderr().contains("belongs to uid"), "nothing passed over\n{run}");

    // Every place taken: refused with one line naming them, never uncapped.
    clean();
    for p in &places {
        env.command_as(squatter, "mkdir").args(["-m", "0700", p]).success();
    }
    let run = job("");
    assert_eq!(run.rc("alloc"), 2, "{run}");
    assert!(run.stderr().contains("no place is left for the default ledger") && run.stderr().contains("FGPU_LEDGER"), "{run}");
    clean();
}

// ------------------------------------------------------------------------------ M1

/// M1: locks held by a user on three ledgers' files (their init and refill locks) cost
/// `fgpu status --all` no wait: observers never wait for a lock.
#[test]
fn m1_held_locks_do_not_stall_status() {
    let env = Env::new("sec-m1");
    let mut holders = Vec::new();
    let mut lockers = Vec::new();
    for i in 0..3 {
        let ledger = env.dir.join(format!("ledger-{i}"));
        let mut holder = env.client(&["init", "primary", "alloc", "64M", "hold"]).shim().limit("1G").env("FGPU_LEDGER", &ledger).spawn();
        holder.wait_for("holding");
        let offsets: Vec<String> = (0..3).map(|d| (fgpu_core::ledger::layout::LOCK_BASE + d).to_string()).collect();
        let mut locker = env.command(client("ledger_tenant")).arg("hold-lock").arg(&ledger).args(&offsets).spawn();
        locker.wait_for("locked");
        holders.push(holder);
        lockers.push(locker);
    }
    let started = Instant::now();
    let run = fgpu(&env).args(["status", "--all", "--json"]).success();
    let took = started.elapsed();
    let report = json(&run);
    for i in 0..3 {
        let path = env.dir.join(format!("ledger-{i}")).display().to_string();
        let l = report["ledgers"].as_array().unwrap().iter().find(|l| l["path"] == path).unwrap_or_else(|| panic!("{path} is shown\n{run}"));
        assert_eq!(l["state"], "ok", "{run}");
    }
    // Before the fix each held init lock cost 5 s (15 s here); the budget for all is 2 s.
    assert!(took < Duration::from_secs(4), "status --all took {took:?} with locks held\n{run}");
    for mut l in lockers {
        l.finish();
    }
    for mut h in holders {
        h.finish();
    }
}

// ------------------------------------------------------------------------------ M4

/// M4: one lock from the first free slot's byte to the end of a ledger's file, held by a
/// process that is no member, keeps nobody out: a newcomer still gets a slot (its liveness
/// is then its process's), what it holds counts against the cap, and the simulated driver
/// never holds more than the cap.
#[test]
fn m4_a_lock_over_every_slot_keeps_nobody_out() {
    let env = Env::new("sec-m4");
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("4G").spawn();
    holder.wait_for("holding");
    let start = fgpu_core::ledger::layout::alive_lock(1).to_string();
    let mut locker = env.command(client("ledger_tenant")).arg("hold-range").arg(&env.ledger).arg(&start).spawn();
    locker.wait_for("locked");
    let run = env.client(&["init", "primary", "alloc", "2G", "alloc", "1G"]).shim().limit("4G").success();
    let rcs: Vec<i64> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap().parse().unwrap()).collect();
    assert_eq!(rcs, vec![0, 2], "granted within the cap, refused past it (1.3 GiB held, 0.3 + 2 GiB more, then 1 GiB over 4 GiB)\n{run}");
    assert!(!run.stderr().contains("locked by a process"), "{run}");
    let sim = env.sim();
    assert!(sim.device_used(0) <= 4 * GIB);
    locker.finish();
    holder.finish();
}

// ------------------------------------------------------------------------------ M2

/// M2: 350 connections opened within 5 s and left idle, under a limit of 256 open files,
/// neither stop the exporter nor keep a scrape out: one 15 s in answers within 5 s, and it
/// serves on afterwards. A head larger than the exporter reads is refused, and a request
/// sent in part is dropped within the idle timeout.
#[test]
fn m2_the_exporter_survives_a_flood() {
    if !prerequisite(tool("prlimit"), "needs prlimit(1) (util-linux) to start the exporter with 256 open files") {
        return;
    }
    let env = Env::new("sec-m2");
    let mut holder = env.client(&["init", "primary", "alloc", "64M", "hold"]).shim().limit("1G").spawn();
    holder.wait_for("holding");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    // prlimit sets the limit and execs the exporter (one process, one PID).
    let mut exporter =
        env.command("prlimit").args(["--nofile=256:256", "--"]).arg(fgpu_bin()).args(["exporter", "--listen", &listen]).env("TMPDIR", &env.dir).spawn();
    eventually("the exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    // SAFETY: raising this test process's own soft limit to its hard limit; no memory involved.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(4096);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let start = Instant::now();
    let mut flood = Vec::new();
    for i in 0..350 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            if i % 2 == 0 {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            }
            flood.push(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(start.elapsed() < Duration::from_secs(8));
    // The flood happened: its connections were made and are held (a flood that could not
    // connect would leave the exporter nothing to survive).
    println!("the flood holds {} connections", flood.len());
    assert_load("connections of the flood held open", flood.len(), 300);
    // A head far past the limit: refused, never read whole.
    let mut big = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = big.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    while sent < 64 << 20 {
        if big.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert!(sent < 64 << 20, "the exporter read a 64 MiB header line");
    while start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let asked = Instant::now();
    let (head, body) = http_get(port, "/metrics").unwrap_or_else(|e| panic!("no answer 15 s into the flood: {e}"));
    let took = asked.elapsed();
    assert!(head.contains(" 200 ") && body.contains("fgpu_ledger_up"), "{head}\n{body}");
    assert!(took < Duration::from_secs(5), "the scrape took {took:?}");
    // The idle ones were closed by the exporter: each reads end-of-file (or a reset).
    let closed = flood
        .iter_mut()
        .filter(|s: &&mut std::net::TcpStream| {
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut buf = [0u8; 1];
            !matches!((&**s).read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut)
        })
        .count();
    assert_eq!(closed, flood.len(), "idle connections are closed within the idle timeout");
    drop(flood);
    for _ in 0..3 {
        let (head, _) = http_get(port, "/metrics").unwrap();
        assert!(head.contains(" 200 "), "{head}");
    }
    assert!(exporter.child.as_mut().unwrap().try_wait().unwrap().is_none(), "the exporter is still running\n{}", exporter.finish());
    exporter.kill(libc::SIGTERM);
    holder.finish();
}

// ------------------------------------------------------------------------------ M3

/// M3: twelve clients hammering `fgpu service` do not keep a newcomer from learning its
/// host PID: 300 newcomer asks, each retried on EAGAIN with a short backoff as the shim
/// does, all get their answer.
#[test]
fn m3_the_service_answers_while_flooded() {
    if !prerequisite(is_root(), "needs root: the service trusts only a root peer") {
        return;
    }
    let env = Env::new("sec-m3");
    let socket = env.dir.join("svc/host.sock");
    let mut service = fgpu(&env).args(["service", "--socket"]).arg(&socket).spawn();
    eventually("the service listens", Duration::from_secs(10), || std::os::unix::net::UnixStream::connect(&socket).is_ok());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Requests of the flood the service took (a send that succeeded).
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flooders: Vec<_> = (0..12)
        .map(|_| {
            let (socket, stop, sent) = (socket.clone(), stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut open = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(s) = fgpu_core::hostpid::Request::send(&socket) {
                        open.push(s);
                        sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if open.len() > 64 {
                        open.clear();
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let sent_before = sent.load(std::sync::atomic::Ordering::Relaxed);
    let mut failed = Vec::new();
    for _ in 0..300 {
        let mut delay = Duration::from_millis(1);
        let mut answer = None;
        for _ in 0..12 {
            match fgpu_core::hostpid::Request::send(&socket) {
                Ok(request) => {
                    answer = Some(request.wait(Duration::from_secs(2)));
                    break;
                }
                Err(e) if e.retry => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                Err(e) => panic!("{}", e.message),
            }
        }
        if answer != Some(fgpu_core::hostpid::Answer::HostPid(std::process::id())) {
            failed.push(answer);
        }
    }
    // The flood ran while the newcomers asked: the service took at least ten of the
    // flooders' requests for each newcomer's (a quiet machine takes about 20 000 a second).
    let flooded = sent.load(std::sync::atomic::Ordering::Relaxed) - sent_before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    println!("the flooders sent {flooded} requests while the 300 newcomers asked ({sent_before} before)");
    assert_load("the flooders' requests the service took while the newcomers asked", flooded, 3000);
    assert!(failed.is_empty(), "{} of 300 newcomers got no host PID: {:?}", failed.len(), &failed[..failed.len().min(5)]);
    service.kill(libc::SIGTERM);
}

// ------------------------------------------------------------------------------ low

/// L2: what a ledger's processes write (a process name, the ledger's path) reaches the
/// terminal with its control characters escaped; L3: the owner's `fgpu status` keeps the
/// file's mode.
#[test]
fn l2_l3_status_escapes_what_tenants_write_and_changes_no_mode() {
    let env = Env::new("sec-l2");
    let evil_name = env.dir.join("x\x1b[2J\x1b[31mLedger");
    std::fs::copy(client("cuclient"), &evil_name).unwrap();
    let ledger = env.dir.join("led\nLedger /fake (the default)");
    let mut holder = env.command(&evil_name).args(["init", "primary", "alloc", "64M", "hold"]).shim().limit("1G").env("FGPU_LEDGER", &ledger).spawn();
    holder.wait_for("holding");
    let mode = std::fs::metadata(&ledger).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "a ledger named in FGPU_LEDGER is private");
    let named = fgpu(&env).arg("status").arg("--ledger").arg(&ledger).run();
    let all = fgpu(&env).args(["status", "--all"]).run();
    for run in [&named, &all] {
        let out = run.stdout();
        assert!(!out.contains('\x1b'), "a raw escape reached the terminal\n{run}");
        assert!(!out.lines().any(|l| l.starts_with("Ledger /fake")), "a line was forged\n{run}");
        assert!(out.contains("\\u{1b}") && out.contains("led\\nLedger"), "written as escapes\n{run}");
    }
    assert_eq!(std::fs::metadata(&ledger).unwrap().mode() & 0o7777, mode, "status changed the ledger file's mode");
    holder.finish();
}

/// L5: `fgpu service` leaves the mode of a directory it did not create.
#[test]
fn l5_the_service_never_chmods_a_directory_it_did_not_make() {
    if !prerequisite(is_root(), "needs root: the service runs as root") {
        return;
    }
    let env = Env::new("sec-l5");
    let shared = env.dir.join("sticky");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.join("s.sock");
    let mut service = fgpu(&env).args(["service", "--socket"]).arg(&socket).spawn();
    eventually("the service listens", Duration::from_secs(10), || socket.exists());
    assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
    service.kill(libc::SIGTERM);
    let made = env.dir.join("made/here/s.sock");
    let mut service = fgpu(&env).args(["service", "--socket"]).arg(&made).spawn();
    eventually("the service listens", Duration::from_secs(10), || made.exists());
    assert_eq!(std::fs::metadata(made.parent().unwrap()).unwrap().mode() & 0o7777, 0o755);
    service.kill(libc::SIGTERM);
}

/// L6: the exporter tells host PIDs the kernel vouches for from those a ledger states: in
/// the host's PID namespace it sees the process hold its slot (`host_pid`); from a PID
/// namespace of its own it can only repeat what the slot states (`stated_host_pid`).
#[test]
fn l6_the_exporter_tells_vouched_host_pids_from_stated_ones() {
    if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1) for an exporter in a PID namespace of its own") {
        return;
    }
    let env = Env::new("sec-l6");
    let mut holder = env.client(&["init", "primary", "alloc", "64M", "hold"]).shim().limit("1G").spawn();
    holder.wait_for("holding");
    let pid = holder.pid();
    let (_exporter, port) = start_exporter(&env, &[]);
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert!(body.contains(&format!("host_pid=\"{pid}\",stated_host_pid=\"\"")), "vouched in the host's namespace\n{body}");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _nested =
        env.command("unshare").args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"]).arg(fgpu_bin()).args(["exporter", "--listen", &listen]).spawn();
    eventually("the nested exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert!(body.contains(&format!("host_pid=\"\",stated_host_pid=\"{pid}\"")), "only stated from a nested namespace\n{body}");
    holder.finish();
}
