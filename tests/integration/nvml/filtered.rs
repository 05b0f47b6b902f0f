//! What NVML gives a container beyond its memory: PIDs as the reader sees them, filtered
//! utilisation, accounting, graphics and MPS lists, detail lists and sessions, MIG device
//! handles, and a cap larger than the GPU.

use super::*;

/// A holder in its own PID namespace appears to a reader outside with the PID the reader
/// sees (the host PID, not 1), and to a reader in its namespace with its namespace PID.
#[test]
fn pids_are_given_as_the_reader_sees_them() {
    if !root() {
        return;
    }
    // PID 1 of its namespace, read from outside.
    let env = Env::new("nvml-pidns1");
    let mut inside = env
        .command("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(client("cuclient"))
        .args(["init", "primary", "alloc", "1G", "hold"])
        .shim()
        .limit("8G")
        .spawn();
    inside.wait_for("holding");
    let host_pid = descendants(inside.pid()).into_iter().find(|p| comm(*p) == "cuclient").expect("the namespaced holder");
    let run = nvml(&env, Variant::Dlsym, &["list", "compute", "3"]).shim().limit("8G").success();
    assert_eq!(procs_field(&run.line("list compute 3")), vec![(host_pid, GIB + CONTEXT)], "outside reader, host PID (not 1)\n{run}");
    let driver = nvml(&env, Variant::Dlsym, &["list", "compute", "3"]).success();
    assert_eq!(procs_field(&driver.line("list compute 3")), vec![(host_pid, GIB + CONTEXT)], "the driver's own host PID agrees\n{driver}");
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(host_pid as i32, libc::SIGKILL) };
    inside.kill(libc::SIGKILL);

    // A holder and a reader in one namespace, another reader outside.
    let env = Env::new("nvml-pidns2");
    let script = format!(
        r#"set -e
"{cu}" init primary alloc 512M sleep 60000 > "{dir}/inner-holder.out" &
h=$!
for i in $(seq 1000); do grep -q '^alloc' "{dir}/inner-holder.out" && break; sleep 0.02; done
echo "inner holder pid=$h"
"{reader}" list compute 3 list compute 1
echo ready
read line || true
kill $h
"#,
        cu = client("cuclient").display(),
        dir = env.dir.display(),
        reader = nvml_client(Variant::Dlsym).display(),
    );
    let mut ns = env.command("unshare").args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script]).shim().limit("8G").spawn();
    let started = ns.wait_for("inner holder");
    let ns_pid: u32 = field(&started, "pid").unwrap().parse().unwrap();
    ns.wait_for("ready");
    let inner_list = ns.lines.iter().find(|l| l.starts_with("list compute 3")).expect("inner reader output").clone();
    assert_eq!(procs_field(&inner_list), vec![(ns_pid, 512 * MIB + CONTEXT)], "reader inside: the namespace PID\n{}", ns.lines.join("\n"));
    let inner_v1 = ns.lines.iter().find(|l| l.starts_with("list compute 1")).unwrap().clone();
    assert_eq!(procs_field(&inner_v1), vec![(ns_pid, 512 * MIB + CONTEXT)], "{inner_v1}");
    let host_pid = descendants(ns.pid()).into_iter().find(|p| comm(*p) == "cuclient").expect("the namespaced holder");
    assert_ne!(host_pid, ns_pid);
    let outer = nvml(&env, Variant::Dlsym, &["list", "compute", "3"]).shim().limit("8G").success();
    assert_eq!(procs_field(&outer.line("list compute 3")), vec![(host_pid, 512 * MIB + CONTEXT)], "reader outside: the host PID\n{outer}");
    let run = ns.finish();
    assert!(run.output.status.success(), "{run}");
}

/// The calls the simulator has no data for (graphics and MPS lists, per-process
/// utilisation samples, accounting PIDs and stats), against a stand-in NVML that reports a
/// process of this container and one of another: only ours comes back, size queries
/// included, and another container's accounting stats are not found.
#[test]
fn utilisation_accounting_graphics_and_mps_are_filtered() {
    let env = Env::new("nvml-filtered");
    let mut mine = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    mine.wait_for("holding");
    let mut theirs = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    theirs.wait_for("holding");
    let (mine_pid, theirs_pid) = (mine.pid(), theirs.pid());
    let fake = nvml_client(Variant::FakeLibrary);
    let reported = format!("{mine_pid}:1000,{theirs_pid}:2000");
    let gpu0 = env.sim().device_uuid_string(0);
    let fake_env = |cmd: Cmd| cmd.env("LD_LIBRARY_PATH", &fake).env("FGPU_FAKE_NVML_GPU_UUID", &gpu0).env("FGPU_FAKE_NVML_PROCS", &reported);
    let (mine_s, theirs_s) = (mine_pid.to_string(), theirs_pid.to_string());
    let mut ops: Vec<&str> = Vec::new();
    for kind in ["graphics", "mps"] {
        for v in ["1", "2", "3"] {
            ops.extend(["list", kind, v]);
        }
        ops.extend(["small", kind, "2", "0"]);
    }
    ops.extend(["util", "acctpids", "acctstats", &mine_s, "acctstats", &theirs_s]);

    // The stand-in reports both, as a driver would.
    let bare = fake_env(nvml(&env, Variant::Dlsym, &ops)).success();
    assert_eq!(procs_field(&bare.line("list graphics 1")).len(), 2, "{bare}");
    assert_eq!(pids_field(&bare.line("util")).len(), 2, "{bare}");
    assert_eq!(bare.rc(&format!("acctstats pid={theirs_pid}")), NVML_SUCCESS, "{bare}");

    let run = fake_env(nvml(&env, Variant::Dlsym, &ops)).shim().limit("8G").success();
    for kind in ["graphics", "mps"] {
        for v in ["1", "2", "3"] {
            let line = run.line(&format!("list {kind} {v} "));
            assert_eq!(field(&line, "query_count").as_deref(), Some("1"), "size query counts ours only: {line}");
            assert_eq!(field(&line, "rc").as_deref(), Some("0"), "{line}");
            assert_eq!(procs_field(&line), vec![(mine_pid, 1000)], "{line}");
        }
        let small = run.line(&format!("small {kind} 2 "));
        assert_eq!((field(&small, "rc").as_deref(), field(&small, "count").as_deref()), (Some("7"), Some("1")), "{small}");
    }
    let util = run.line("util");
    assert_eq!(
        (field(&util, "query_rc").as_deref(), field(&util, "query_count").as_deref()),
        (Some("7"), Some("1")),
        "utilisation size query counts ours only: {util}"
    );
    assert_eq!((field(&util, "rc").as_deref(), pids_field(&util)), (Some("0"), vec![mine_pid]), "{util}");
    let acct = run.line("acctpids");
    assert_eq!(
        (field(&acct, "query_rc").as_deref(), field(&acct, "query_count").as_deref()),
        (Some("7"), Some("1")),
        "accounting size query counts ours only: {acct}"
    );
    assert_eq!((field(&acct, "rc").as_deref(), pids_field(&acct)), (Some("0"), vec![mine_pid]), "{acct}");
    assert_eq!(run.rc(&format!("acctstats pid={mine_pid} ")), NVML_SUCCESS, "{run}");
    assert_eq!(num(&run, &format!("acctstats pid={mine_pid} "), "maxmem"), 1000, "{run}");
    assert_eq!(run.rc(&format!("acctstats pid={theirs_pid} ")), NVML_ERROR_NOT_FOUND, "another container's stats\n{run}");

    // Only the other container's process: nothing, and no sample means NOT_FOUND.
    let run = nvml(&env, Variant::Dlsym, &["util", "acctpids", "list", "graphics", "3"])
        .env("LD_LIBRARY_PATH", &fake)
        .env("FGPU_FAKE_NVML_PROCS", format!("{theirs_pid}:2000"))
        .shim()
        .limit("8G")
        .success();
    assert_eq!(run.field("util", "query_rc"), NVML_ERROR_NOT_FOUND.to_string(), "{run}");
    assert_eq!(run.field("acctpids", "count"), "0", "{run}");
    assert_eq!(run.field("list graphics 3", "count"), "0", "{run}");

    // pynvml over the same stand-in.
    if let Some(python) = python() {
        let run = fake_env(py(&env, &python, "nvml_probe.py")).shim().limit("8G").success();
        let dev = &json(&run)["devices"][0];
        assert_eq!(dev["utilization"]["value"], serde_json::json!([mine_pid]), "{run}");
        assert_eq!(dev["accounting_pids"]["value"], serde_json::json!([mine_pid]), "{run}");
        for call in ["graphics", "graphics_v2", "mps", "mps_v2"] {
            assert_eq!(json_procs(&dev["pynvml"][call]), vec![(mine_pid, 1000)], "pynvml {call}\n{run}");
        }
    }
    mine.finish();
    theirs.finish();
}

/// The newer calls (r550's detail list and utilisation info, r610's accounting stats v2) and
/// the encoder and frame-buffer-capture session lists, against the stand-in NVML that
/// reports a process of this container and one of another: only ours comes back, size
/// queries included; compute mode of the detail list comes from the ledger; a broken
/// configuration shows nothing.
#[test]
fn detail_lists_utilisation_info_sessions_and_accounting_v2_are_filtered() {
    let env = Env::new("nvml-newer");
    let mut mine = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    mine.wait_for("holding");
    let mut theirs = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    theirs.wait_for("holding");
    let (mine_pid, theirs_pid) = (mine.pid(), theirs.pid());
    let fake = nvml_client(Variant::FakeLibrary);
    let reported = format!("{mine_pid}:1000,{theirs_pid}:2000");
    let gpu0 = env.sim().device_uuid_string(0);
    let fake_env = |cmd: Cmd| cmd.env("LD_LIBRARY_PATH", &fake).env("FGPU_FAKE_NVML_GPU_UUID", &gpu0).env("FGPU_FAKE_NVML_PROCS", &reported);
    let (mine_s, theirs_s) = (mine_pid.to_string(), theirs_pid.to_string());
    let ops = [
        "detail",
        "0",
        "detail",
        "1",
        "detail",
        "2",
        "detailsmall",
        "0",
        "0",
        "detailsmall",
        "1",
        "1",
        "putil",
        "enc",
        "fbc",
        "encsmall",
        "1",
        "acctstats2",
        &mine_s,
        "acctstats2",
        &theirs_s,
    ];
    let q = |line: &str, key: &str| field(line, key).unwrap_or_default();

    // The stand-in reports both, as a driver would.
    for variant in [Variant::Dlsym, Variant::Linked] {
        let bare = fake_env(nvml(&env, variant, &ops)).success();
        for mode in ["0", "1", "2"] {
            let line = bare.line(&format!("detail {mode} "));
            assert_eq!((q(&line, "query_rc"), q(&line, "query_count")), ("7".into(), "2".into()), "{bare}");
            assert_eq!(procs_field(&line).len(), 2, "{bare}");
        }
        for op in ["putil", "enc", "fbc"] {
            assert_eq!(pids_field(&bare.line(op)).len(), 2, "{bare}");
        }
        assert_eq!(q(&bare.line("encsmall"), "rc"), "7", "{bare}");
        assert_eq!(bare.rc(&format!("acctstats2 pid={theirs_pid} ")), NVML_SUCCESS, "{bare}");
    }

    for variant in [Variant::Dlsym, Variant::Linked] {
        let run = fake_env(nvml(&env, variant, &ops)).shim().limit("8G").success();
        // Compute mode: the ledger's list and bytes (the stand-in's 1000 is not used).
        let line = run.line("detail 0 ");
        assert_eq!(
            (q(&line, "query_rc"), q(&line, "query_count"), q(&line, "rc")),
            ("7".into(), "1".into(), "0".into()),
            "size query counts ours only: {line}"
        );
        assert_eq!(procs_field(&line), vec![(mine_pid, GIB + CONTEXT)], "{line}");
        for mode in ["1", "2"] {
            let line = run.line(&format!("detail {mode} "));
            assert_eq!(
                (q(&line, "query_rc"), q(&line, "query_count"), q(&line, "rc")),
                ("7".into(), "1".into(), "0".into()),
                "size query counts ours only: {line}"
            );
            assert_eq!(procs_field(&line), vec![(mine_pid, 1000)], "{line}");
        }
        for (prefix, expected) in [("detailsmall 0 ", "rc=7 count=1 overrun=0"), ("detailsmall 1 ", "rc=0 count=1 overrun=0")] {
            let line = run.line(prefix);
            assert!(line.ends_with(expected), "a buffer for one entry: ours fit, nothing written past it\n{line}");
        }
        let putil = run.line("putil");
        assert_eq!((q(&putil, "query_rc"), q(&putil, "query_count"), q(&putil, "rc")), ("7".into(), "1".into(), "0".into()), "{putil}");
        assert_eq!(pids_field(&putil), vec![mine_pid], "{putil}");
        for op in ["enc", "fbc"] {
            let line = run.line(&format!("{op} "));
            assert_eq!(
                (q(&line, "query_rc"), q(&line, "query_count"), q(&line, "rc")),
                ("0".into(), "1".into(), "0".into()),
                "session size query counts ours only: {line}"
            );
            assert_eq!(pids_field(&line), vec![mine_pid], "{line}");
        }
        assert_eq!((q(&run.line("encsmall"), "rc"), q(&run.line("encsmall"), "count")), ("0".into(), "1".into()), "{run}");
        let stats = run.line(&format!("acctstats2 pid={mine_pid} "));
        assert_eq!((q(&stats, "rc"), q(&stats, "maxmem"), q(&stats, "outpid")), ("0".into(), "1000".into(), mine_s.clone()), "{stats}");
        assert_eq!(run.rc(&format!("acctstats2 pid={theirs_pid} ")), NVML_ERROR_NOT_FOUND, "another container's stats\n{run}");
    }

    // Only the other container's process: nothing.
    let run = nvml(&env, Variant::Dlsym, &["detail", "1", "detail", "2", "putil", "enc", "fbc"])
        .env("LD_LIBRARY_PATH", &fake)
        .env("FGPU_FAKE_NVML_PROCS", format!("{theirs_pid}:2000"))
        .shim()
        .limit("8G")
        .success();
    for prefix in ["detail 1 ", "detail 2 "] {
        assert_eq!((run.field(prefix, "query_rc"), run.field(prefix, "count")), ("0".to_string(), "0".to_string()), "{run}");
    }
    assert_eq!(run.field("putil", "query_rc"), NVML_ERROR_NOT_FOUND.to_string(), "no sample of ours is the driver's NOT_FOUND\n{run}");
    for op in ["enc ", "fbc "] {
        assert_eq!(run.field(op, "query_count"), "0", "{run}");
    }

    // A broken configuration fails closed: no list shows anyone.
    let all = ["detail", "0", "detail", "1", "putil", "enc", "fbc", "acctstats2", &mine_s, "util", "acctpids", "acctstats", &mine_s, "list", "graphics", "2"];
    let run = fake_env(nvml(&env, Variant::Dlsym, &all)).shim().limit("banana").success();
    for prefix in ["detail 0 ", "detail 1 ", "enc ", "fbc ", "acctpids", "list graphics 2"] {
        assert_eq!(run.field(prefix, "count"), "0", "{prefix}\n{run}");
    }
    for prefix in ["putil", "util"] {
        assert_eq!(run.field(prefix, "query_rc"), NVML_ERROR_NOT_FOUND.to_string(), "{prefix}\n{run}");
    }
    assert_eq!(run.rc(&format!("acctstats2 pid={mine_pid} ")), NVML_ERROR_NOT_FOUND, "{run}");
    assert_eq!(run.rc(&format!("acctstats pid={mine_pid} ")), NVML_ERROR_NOT_FOUND, "{run}");
    mine.finish();
    theirs.finish();
}

#[test]
fn mig_device_handles_answer_for_the_container() {
    // The stand-in's one handle is a MIG instance whose UUID has the bytes CUDA reports (the
    // simulator's GPU 0), as on a real MIG instance; the cap is given by its MIG- UUID.
    let env = Env::new("nvml-mig");
    env.client(&["init"]).success();
    let gpu0 = env.sim().device_uuid_string(0);
    let mig = format!("MIG-{}", &gpu0[4..]);
    let limit = format!("{}=2G", &mig[..12]);
    let limit = limit.as_str();
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "info", "hold"]).shim().limit(limit).spawn();
    let info = holder.wait_for("info");
    assert_eq!(field(&info, "total").as_deref(), Some("2147483648"), "CUDA holds to the MIG key's cap: {info}");
    holder.wait_for("holding");
    let fake = nvml_client(Variant::FakeLibrary);
    let run = nvml(&env, Variant::Dlsym, &["mem", "mem2"])
        .env("LD_LIBRARY_PATH", &fake)
        .env("FGPU_FAKE_NVML_GPU_UUID", &gpu0)
        .env("FGPU_FAKE_NVML_UUID", &mig)
        .shim()
        .limit(limit)
        .success();
    assert_eq!((num(&run, "mem ", "total"), num(&run, "mem ", "used")), (2 * GIB, GIB + CONTEXT), "{run}");
    assert_eq!((num(&run, "mem2 ", "total"), num(&run, "mem2 ", "used"), num(&run, "mem2 ", "reserved")), (2 * GIB, GIB + CONTEXT, 0), "{run}");
    let bare =
        nvml(&env, Variant::Dlsym, &["mem"]).env("LD_LIBRARY_PATH", &fake).env("FGPU_FAKE_NVML_GPU_UUID", &gpu0).env("FGPU_FAKE_NVML_UUID", &mig).success();
    assert_eq!(num(&bare, "mem ", "total"), 80 * GIB, "without the shim, the stand-in's own answer\n{bare}");
}

/// A cap larger than the GPU never makes the GPU look larger: CUDA, NVML and nvidia-smi all
/// report the GPU's own 80 GiB under `FGPU_LIMIT=200G`. At the physical limit the driver's
/// own answer stands: what fits is granted, what does not is refused by the driver, and the
/// ledger keeps nothing of a refused request.
#[test]
fn a_cap_larger_than_the_gpu_reports_the_gpu() {
    let env = Env::new("nvml-cap-above");
    let physical = 80 * GIB;
    let mut holder = env.client(&["init", "primary", "info", "total", "alloc", "70G", "info", "hold"]).shim().limit("200G").spawn();
    holder.wait_for("holding");
    let infos: Vec<&String> = holder.lines.iter().filter(|l| l.starts_with("info")).collect();
    assert_eq!(field(infos[0], "total"), Some(physical.to_string()), "cuMemGetInfo total\n{:?}", holder.lines);
    let total_line = holder.lines.iter().find(|l| l.starts_with("total")).unwrap();
    assert_eq!(field(total_line, "total"), Some(physical.to_string()), "cuDeviceTotalMem\n{:?}", holder.lines);
    let sim = env.sim();
    assert_eq!(field(infos[1], "free"), Some(sim.device_free(0).to_string()), "free is what the device really has left\n{:?}", holder.lines);

    // NVML (v1 and v2): total is the GPU's, used is the container's, total = used + free.
    let run = nvml(&env, Variant::Dlsym, &["mem", "mem2"]).shim().limit("200G").success();
    let used = 70 * GIB + CONTEXT;
    assert_eq!((num(&run, "mem ", "total"), num(&run, "mem ", "used"), num(&run, "mem ", "free")), (physical, used, physical - used), "{run}");
    assert_eq!((num(&run, "mem2 ", "total"), num(&run, "mem2 ", "used"), num(&run, "mem2 ", "free")), (physical, used, physical - used), "{run}");

    // The real nvidia-smi.
    if let Some(smi) = nvidia_smi() {
        let run = env.command(&smi).args(["--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"]).shim().limit("200G").success();
        assert_eq!(run.stdout().trim().replace(' ', ""), format!("81920,{}", used / MIB), "{run}");
    }

    // At the physical limit: a second process of the container gets what fits, and the
    // driver refuses what does not (CUDA_ERROR_OUT_OF_MEMORY), whatever the cap says.
    let run = env.client(&["init", "primary", "info", "alloc", "20G", "alloc", "9G"]).shim().limit("200G").success();
    assert_eq!(run.field("info", "total"), physical.to_string(), "{run}");
    assert_eq!(run.lines("alloc"), vec![format!("alloc {} rc=2", 20 * GIB), format!("alloc {} rc=0", 9 * GIB)], "{run}");
    env.ledger().reclaim_dead(None);
    let (_, ledger_used) = ledger_view(&env, 0);
    assert_eq!(ledger_used, 70 * GIB + CONTEXT, "the refused 20G and the finished process leave nothing behind");
    assert_eq!(ledger_used, sim.device_used(0), "the ledger agrees with the device");
    holder.finish();
}
