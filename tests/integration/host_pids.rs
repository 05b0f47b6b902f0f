//! Containers without `--pid=host` on a driver that gives host PIDs (`FGPU_SIM_NVML_PIDS=host`,
//! as older drivers do): a process in its own PID namespace learns its host PID from the
//! host's `fgpu service` (no CUDA call waits for it), so memory the driver takes without an
//! allocation call is counted, and NVML's lists answer for the container's processes.
//! Without the service it is matched in NVML's list; where that is ambiguous, one line says
//! what cannot be counted. Also the shim's side of the service: a connect the service's
//! backlog turns away is tried again later, and a service is trusted only from the initial
//! user namespace. The behaviours of current drivers are in `pid_modes.rs`.
//!
//! The real driver knows every process's host PID. The simulated one learns a namespaced
//! process's host PID when a process of the host's namespace looks at its state; here a
//! thread of the test does that ([`Env::driver_watch`]), standing in for the kernel driver
//! (docs/simulator.md), and the clients wait 300 ms after creating their context so that it
//! has.

use fgpu_tests::*;
use std::time::Duration;

/// Starts `fgpu service` on a socket in the test's directory.
fn service(env: &Env) -> (Background, std::path::PathBuf) {
    let socket = env.dir.join("host.sock");
    let mut service = env.command(fgpu_bin()).args(["service", "--socket"]).arg(&socket).spawn();
    eventually("fgpu service listens", Duration::from_secs(5), || socket.exists());
    let _ = &mut service;
    (service, socket)
}

/// A test world whose simulated NVML gives host PIDs, as older drivers do.
fn host_pids_env(name: &str) -> Env {
    Env::new(name).nvml_pids("host")
}

fn can_unshare() -> bool {
    prerequisite(is_root() && tool("unshare"), "root and unshare(1) to make a PID namespace")
}

/// `script` in a new PID namespace (with its own /proc), capped at 8 GiB.
fn in_pid_namespace(env: &Env, script: &str, socket: Option<&std::path::Path>) -> Run {
    let mut cmd = env.command("unshare").args(["--pid", "--fork", "--mount-proc", "sh", "-c", script]).shim().limit("8G");
    cmd = match socket {
        Some(path) => cmd.env("FGPU_HOST_SOCKET", path),
        None => cmd.env("FGPU_HOST_SOCKET", env.dir.join("no-service-here.sock")),
    };
    cmd.run()
}

#[test]
fn a_module_loaded_in_a_pid_namespace_is_counted_with_the_host_service() {
    if !can_unshare() {
        return;
    }
    let env = host_pids_env("hostpid-service");
    let (mut service, socket) = service(&env);
    let _watch = env.driver_watch();
    let cuclient = client("cuclient");
    // The module's 1 GiB and the 300 MiB context leave 6.7 GiB of the 8: 7000 MiB is refused.
    let script = format!("{} init primary sleep 300 module 1G ctxsync info alloc 7000M alloc 6000M", cuclient.display());
    let run = in_pid_namespace(&env, &script, Some(&socket));
    assert!(run.output.status.success(), "{run}");
    assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB - GIB).to_string(), "the module must be counted\n{run}");
    let rcs: Vec<String> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    assert_eq!(rcs, ["2", "0"], "{run}");
    assert!(!run.stderr().contains("host PID is unknown"), "{run}");
    // fgpu doctor in the namespace says the service answers.
    let doctor = in_pid_namespace(&env, &format!("{} doctor --json", fgpu_bin().display()), Some(&socket));
    assert!(doctor.stdout().contains("The host's fgpu service answers: this process is host PID"), "{doctor}");
    service.kill(libc::SIGTERM);
}

#[test]
fn nvml_lists_answer_for_the_containers_processes_in_a_pid_namespace() {
    if !can_unshare() || !prerequisite(tool("nsenter"), "nsenter(1) to join the namespace") {
        return;
    }
    let env = host_pids_env("hostpid-nvml");
    let (mut service, socket) = service(&env);
    let _watch = env.driver_watch();
    // The container: a process holding 1 GiB as PID 1 of its own PID namespace.
    let mut holder = env
        .command("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(client("cuclient"))
        .args(["init", "primary", "alloc", "1G", "ctxsync", "hold"])
        .shim()
        .limit("8G")
        .env("FGPU_HOST_SOCKET", &socket)
        .spawn();
    holder.wait_for("holding");
    let unshare = holder.pid();
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    let host_pid: u32 = children.split_whitespace().next().expect("unshare's child").parse().unwrap();
    eventually("the holder learns its host PID", Duration::from_secs(5), || env.ledger().snapshot(None).processes.iter().any(|p| p.host_pid == Some(host_pid)));
    // NVML, as a driver that gives host PIDs would, reports every tenant by host PID: the
    // holder (with what it holds) and another. The stand-in library does that for every
    // call; the reader tells from the holder's entry that the PIDs are host PIDs.
    let fake = crate::nvml::nvml_client(crate::nvml::Variant::FakeLibrary);
    let other = host_pid + 100_000;
    let held = GIB + 300 * MIB;
    let ops = ["list", "compute", "3", "list", "graphics", "3", "util", "acctpids", "acctstats", "1"];
    let run = env
        .command("nsenter")
        .args(["--target", &host_pid.to_string(), "--pid", "--mount", "--"])
        .arg(crate::nvml::nvml_client(crate::nvml::Variant::Dlsym))
        .args(ops)
        .env("LD_LIBRARY_PATH", &fake)
        .env("FGPU_FAKE_NVML_GPU_UUID", env.sim().device_uuid_string(0))
        .env("FGPU_FAKE_NVML_PROCS", format!("{host_pid}:{held},{other}:2000"))
        .shim()
        .limit("8G")
        .success();
    // The compute list shows what the ledger counts for it; the rest what the driver says.
    let compute = field(&run.line("list compute 3"), "procs").unwrap_or_default();
    let (pid, bytes) = compute.split_once(':').unwrap_or_else(|| panic!("{run}"));
    assert_eq!(pid, "1", "the container's process, by its PID in the namespace\n{run}");
    assert!(bytes.parse::<u64>().unwrap() > GIB, "{run}");
    assert_eq!(field(&run.line("list graphics 3"), "procs"), Some(format!("1:{held}")), "{run}");
    assert_eq!(field(&run.line("util"), "pids").as_deref(), Some("1"), "{run}");
    assert_eq!(field(&run.line("acctpids"), "pids").as_deref(), Some("1"), "{run}");
    assert_eq!(run.rc("acctstats pid=1 "), 0, "{run}");
    holder.finish();
    service.kill(libc::SIGTERM);
}

#[test]
fn without_the_service_the_process_is_matched_in_nvmls_list() {
    if !can_unshare() {
        return;
    }
    let env = host_pids_env("hostpid-match");
    let _watch = env.driver_watch();
    let cuclient = client("cuclient");
    // Alone on the GPU, the only process NVML lists that holds at least this one's count is
    // this one: the module is counted right after its load, before the next allocation.
    let script = format!("{} init primary sleep 300 module 1G alloc 7000M info", cuclient.display());
    let run = in_pid_namespace(&env, &script, None);
    assert!(run.output.status.success(), "{run}");
    assert_eq!(run.rc("alloc"), 2, "the module's 1 GiB counted, 7000 MiB refused\n{run}");
    assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB - GIB).to_string(), "{run}");
    assert!(!run.stderr().contains("host PID is unknown"), "{run}");
}

#[test]
fn without_the_service_an_ambiguous_look_says_so_and_a_later_one_matches() {
    if !can_unshare() {
        return;
    }
    let env = host_pids_env("hostpid-ambiguous");
    let _watch = env.driver_watch();
    // Another tenant (another ledger, in the host's namespace) holds 2 GiB on the GPU: at the
    // first look after the module load, two processes could be this one.
    let mut other = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("8G").env("FGPU_LEDGER", env.dir.join("other")).spawn();
    other.wait_for("holding");
    let cuclient = client("cuclient");
    // Then this process allocates 512 MiB: only its own entry in NVML moves by that much,
    // and the next look (a synchronisation, past the 500 ms interval) matches and counts.
    let script = format!("{} init primary sleep 300 module 1G alloc 512M sleep 600 ctxsync info", cuclient.display());
    let run = in_pid_namespace(&env, &script, None);
    assert!(run.output.status.success(), "{run}");
    let stderr = run.stderr();
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("host PID is unknown")).collect();
    assert_eq!(warnings.len(), 1, "one line says what could not be counted yet\n{run}");
    assert!(warnings[0].contains("fgpu service"), "and what fixes it\n{run}");
    assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB - GIB - 512 * MIB).to_string(), "matched later: the module counted\n{run}");
    let doctor = in_pid_namespace(&env, &format!("{} doctor --json", fgpu_bin().display()), None);
    assert!(doctor.stdout().contains("Host PIDs are unknown here"), "{doctor}");
    other.finish();
}

#[test]
fn a_module_counts_before_the_next_allocation() {
    // In the host's namespace: no synchronisation or cuMemGetInfo between the load and the
    // allocation, and the module's memory still counts (it is looked for right after the load).
    let env = Env::new("module-at-once");
    let run = env.client(&["init", "primary", "module", "1G", "alloc", "7000M", "alloc", "6800M"]).shim().limit("8G").success();
    let rcs: Vec<String> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    assert_eq!(rcs, ["2", "0"], "8 GiB - 300 MiB - 1 GiB leaves 6892 MiB\n{run}");
}

/// A newcomer's context, with the service on the host, is counted at the size NVML measures
/// for it (300 MiB here), not at the 512 MiB reserved before anything was measured, under
/// host PIDs and under PIDs as the container sees them alike (issue 19, part F).
#[test]
fn with_the_service_a_context_is_counted_at_its_measured_size() {
    if !can_unshare() {
        return;
    }
    for mode in ["host", "caller"] {
        let env = Env::new(&format!("hostpid-context-{mode}")).nvml_pids(mode);
        let (mut service, socket) = service(&env);
        let _watch = env.driver_watch();
        // The service's answer comes before the context (sleep), as for a newcomer that
        // joined its ledger first.
        let script = format!("{} init sleep 200 primary info", client("cuclient").display());
        let run = in_pid_namespace(&env, &script, Some(&socket));
        assert!(run.output.status.success(), "{mode}: {run}");
        assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB).to_string(), "{mode}: the context counts 300 MiB\n{run}");
        service.kill(libc::SIGTERM);
    }
}

/// A service whose backlog is full turns a connect away (EAGAIN); the shim asks again
/// later, without blocking any call, and learns its host PID (M3 of issue 18): under host
/// PIDs with another tenant on the GPU only the service's answer tells which entry is it.
#[test]
fn a_service_that_turns_a_connect_away_is_asked_again_later() {
    if !can_unshare() {
        return;
    }
    let env = host_pids_env("hostpid-retry");
    let socket = env.dir.join("busy.sock");
    let mut fake = env.command(client("fake_service")).arg(&socket).args(["--full-for", "1500"]).spawn();
    fake.wait_for("listening");
    let _watch = env.driver_watch();
    let mut other = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("8G").env("FGPU_LEDGER", env.dir.join("other")).spawn();
    other.wait_for("holding");
    // It keeps working meanwhile (synchronisations), as programs do: each call may ask again
    // when the backoff allows, and pick the answer up; none waits for it.
    let syncs = "sleep 400 ctxsync ".repeat(8);
    let script = format!("{} init primary {syncs}module 1G alloc 6900M info", client("cuclient").display());
    let run = env
        .command("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .shim()
        .limit("8G")
        .env("FGPU_HOST_SOCKET", &socket)
        .env("FGPU_LOG", "debug")
        .run();
    assert!(run.output.status.success(), "{run}");
    assert!(run.stderr().contains("asking the host's fgpu service again later"), "the first connect was turned away\n{run}");
    assert!(run.stderr().contains("from the host's fgpu service"), "a later one was answered\n{run}");
    assert_eq!(run.rc("alloc"), 2, "the module's 1 GiB counted: 6900 MiB does not fit\n{run}");
    assert_eq!(run.field("info", "free"), (8 * GIB - 300 * MIB - GIB).to_string(), "{run}");
    fake.kill(libc::SIGTERM);
    other.finish();
}

/// A process in a user namespace of its own (a rootless container) sees an ordinary user
/// outside as uid 0 if that user is mapped to root there: it must not take host PIDs from a
/// "service" such a user runs (L1 of issue 18). The fake service answers PID 4242.
#[test]
fn a_rootless_container_does_not_trust_a_service_of_an_ordinary_user() {
    if !prerequisite(is_root() && tool("unshare") && tool("setpriv"), "root, unshare(1) and setpriv(1) for another user and a user namespace") {
        return;
    }
    let env = host_pids_env("hostpid-userns");
    let nobody = 65534;
    let shared = env.dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let socket = shared.join("fake.sock");
    let mut fake = env.command_as(nobody, reachable_client("fake_service")).arg(&socket).args(["--answer", "4242"]).spawn();
    fake.wait_for("listening");
    // The same user, mapped to root in its own user namespace, in its own PID namespace.
    let script = format!("{} init primary sleep 300 module 64M info", reachable_client("cuclient").display());
    let run = env
        .command_as(nobody, "unshare")
        .args(["--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .env("LD_PRELOAD", &reachable().front)
        .env("FGPU_LIMIT", "8G")
        .env("FGPU_SIM_STATE", shared.join("sim-state"))
        .env("FGPU_LEDGER", shared.join("ledger"))
        .env("FGPU_HOST_SOCKET", &socket)
        .env("FGPU_LOG", "debug")
        .run();
    assert!(run.output.status.success(), "{run}");
    let stderr = run.stderr();
    assert!(!stderr.contains("host PID 4242"), "a service of an ordinary user must not be believed\n{run}");
    assert!(stderr.contains("user namespace of its own"), "and the shim says why\n{run}");
    fake.kill(libc::SIGTERM);
}
