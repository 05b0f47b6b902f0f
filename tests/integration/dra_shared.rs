//! One ledger for all the pods of a claim: the served ledger (`fgpu_core::ledger::served`),
//! a sealed memory file fgpu-kubelet-plugin hands to every process of the claim over a
//! socket in the claim's configuration directory, with the lock file in the claim's ledger
//! directory. Pods have IPC namespaces of their own, which a System V segment could not
//! cross: here each stand-in pod is a process in mount and IPC namespaces of its own, with
//! the claim's files mounted as a container runtime mounts them. Real podman containers of
//! one claim: tests/cdi/dra.sh.
//!
//! Ground truth is the simulated driver's count of what each process holds.

use crate::dra::{alloc, mounted_as_a_runtime_would, spec_defining, uid, Node};
use fgpu_tests::dra::{claim_json, ClaimRef, Gates};
use fgpu_tests::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CONTEXT: u64 = 300 * MIB;

/// The descriptor a process holds of its served ledger's memory file (`/proc/PID/fd/N`).
pub(crate) fn memfd_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::read_link(p).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:fgpu-ledger")))
}

/// The IPC namespace of a process.
fn ipc_ns(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/ipc")).map(|l| l.display().to_string()).unwrap_or_default()
}

/// The stand-in pods: processes of the claim in mount and IPC namespaces of their own; both
/// "pods" hold memory at once, the plugin is restarted between their allocations, and a
/// process that starts while no plugin answers is refused (fail closed) rather than capped
/// on its own.
#[test]
fn dra_pods_of_one_claim_share_its_cap_through_a_plugin_restart() {
    let Some(node) = Node::new("dra-shared", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "shared", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), None)]), &["pod-a", "pod-b"]));
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "shared", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "", "{answer}\n{}", plugin.log());
    assert!(plugin.log().contains("reserved for 2 pods (pod-a, pod-b): they share its cap"), "{}", plugin.log());
    let spec = spec_defining(&node.cdi(), "fgpu.io/gpu", &format!("claim-{}", uid(1))).expect("the claim's spec");
    let c = client("cuclient");
    let pod = |then: &str| node.env.with_private_etc_in(&["--ipc"], &mounted_as_a_runtime_would(&spec, then));

    // Pod A holds 5 GiB.
    let Some(pod_a) = pod(&format!("exec {} init primary alloc 5G hold", c.display())) else { return };
    let mut a = pod_a.spawn();
    a.wait_for("holding");
    let sim = node.env.sim();
    let a_holds = sim.device_used(0);
    assert_eq!(a_holds, 5 * GIB + CONTEXT, "the simulator: pod A's 5 GiB and its context");
    assert!(memfd_of(a.pid()).is_some(), "pod A's process holds the served ledger's memory file");

    // The plugin restarts between the two pods' allocations (killed: a container's
    // processes all die with it), and takes the ledger over from pod A's process.
    let first_log = plugin.kill();
    let plugin = node.start(&[]);
    assert!(plugin.log().contains(&format!("taken over from PID {}", a.pid())), "{first_log}\n---\n{}", plugin.log());

    // Pod B, in another IPC namespace: the claim's 8 GiB with pod A's use counted, exactly
    // what is left of it and not one byte more.
    let left = 8 * GIB - a_holds - CONTEXT;
    let script = format!("readlink /proc/self/ns/ipc; C={}; $C init primary info alloc {left} alloc 1", c.display());
    let b = pod(&script).unwrap().run();
    let b_ipc = b.stdout().lines().next().unwrap_or_default().to_string();
    assert!(b_ipc.starts_with("ipc:[") && b_ipc != ipc_ns(a.pid()) && b_ipc != ipc_ns(std::process::id()), "pods in IPC namespaces of their own: {b_ipc}\n{b}");
    assert_eq!(b.field("info", "total"), (8 * GIB).to_string(), "{b}\n{}", plugin.log());
    assert_eq!(b.field("info", "free"), left.to_string(), "8 GiB less pod A's {a_holds} bytes and pod B's context\n{b}");
    assert_eq!(b.lines("alloc"), [format!("alloc {left} rc=0"), "alloc 1 rc=2".to_string()], "{b}");
    a.assert_running("pod A holds its 5 GiB throughout");
    assert_eq!(sim.device_used(0), a_holds, "the simulator: only pod A holds memory once pod B's process is gone");

    // No plugin: a process of the claim that starts now is refused GPU memory with one line
    // (after waiting for the plugin a while), never capped on a ledger of its own.
    let (code, _) = plugin.terminate(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    let started = Instant::now();
    let lone = pod(&format!("{} init primary alloc 1M", c.display())).unwrap().run();
    assert!(lone.output.status.success(), "the program runs on\n{lone}");
    assert_eq!(lone.rc("alloc"), 2, "{lone}");
    let said = lone.stderr().lines().filter(|l| l.contains("cannot have it from its keeper")).count();
    assert_eq!(said, 1, "one line says why\n{lone}");
    assert!(started.elapsed() >= Duration::from_secs(4), "it waited for the plugin first: {:?}", started.elapsed());

    // The plugin back: pod A's ledger again, not a fresh one.
    let plugin = node.start(&[]);
    let again = pod(&format!("{} init primary info", c.display())).unwrap().run();
    assert_eq!(again.field("info", "free"), left.to_string(), "{again}\n{}", plugin.log());
    a.kill(libc::SIGKILL);
    let answer = node.kubelet.unprepare(&node.dra(), &[ClaimRef::new("ml", "shared", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "");
}

/// A tenant of a served ledger truncates, grows or replaces what it can reach: its lock
/// file, its memory file through a member's descriptor. No process faults, the cap holds,
/// and a newcomer after the lock file was replaced is refused rather than given a ledger of
/// its own.
#[test]
fn tampering_with_a_served_ledgers_files_neither_crashes_nor_lifts_the_cap() {
    let env = Env::new("served-tamper");
    let (_keeper, _) = env.keep_ledger();
    let member = |args: &[&str]| env.client(args).shim().limit("2G").env("FGPU_LEDGER_SOCKET", env.ledger_socket());
    let mut holder = member(&["init", "primary", "alloc", "1G", "hold"]).spawn();
    holder.wait_for("holding");
    let memfd = memfd_of(holder.pid()).expect("the holder's memory file");
    // As root and as another user: the memory file can be neither shrunk nor grown.
    for size in ["0", "1", "8G"] {
        let run = Cmd(std::process::Command::new("truncate")).args(["-s", size]).arg(&memfd).run();
        assert!(!run.output.status.success() && run.stderr().contains("not permitted"), "truncate -s {size} of the memory file\n{run}");
    }
    // The lock file truncated and overwritten: nothing changes.
    std::fs::write(&env.ledger, b"garbage").unwrap();
    let left = 2 * GIB - (GIB + CONTEXT) - CONTEXT;
    let fresh = member(&["init", "primary", "alloc", &left.to_string(), "alloc", "1"]).run();
    assert_eq!(fresh.lines("alloc"), [format!("alloc {left} rc=0"), "alloc 1 rc=2".to_string()], "the cap holds, to the byte\n{fresh}");
    holder.assert_running("the holder survives");
    // The lock file replaced: a newcomer is refused with one line.
    std::fs::remove_file(&env.ledger).unwrap();
    std::fs::write(&env.ledger, b"").unwrap();
    let newcomer = member(&["init", "primary", "alloc", "1M"]).run();
    assert!(newcomer.output.status.success(), "{newcomer}");
    assert_eq!(newcomer.rc("alloc"), 2, "{newcomer}");
    assert!(newcomer.stderr().contains("replaced"), "{newcomer}");
    holder.assert_running("the holder survives the replacement");
    assert_eq!(env.sim().device_used(0), GIB + CONTEXT, "the simulator: the holder alone holds memory");
}

/// What root's observers see of served ledgers: `fgpu status --all` and the exporter list one
/// by its memory file, with what the simulator says its processes hold; a memory file a process
/// made itself under a ledger's name, unsealed, is not taken for one.
#[test]
fn status_all_shows_served_ledgers_and_only_sealed_ones() {
    let env = Env::new("served-status");
    let (_keeper, _) = env.keep_ledger();
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("4G").env("FGPU_LEDGER_SOCKET", env.ledger_socket()).spawn();
    holder.wait_for("holding");
    // A forgery: a memory file of a ledger's size, named like one, mapped shared, unsealed.
    let size = fgpu_core::ledger::layout::SEGMENT_SIZE;
    let forger = Cmd(std::process::Command::new("python3"))
        .args([
            "-c",
            &format!("import mmap, os, sys, time; fd = os.memfd_create('fgpu-ledger:forged'); os.ftruncate(fd, {size}); m = mmap.mmap(fd, {size}); m[:8] = b'FGPULDGR'; print('mapped', flush=True); time.sleep(60)"),
        ])
        .spawn();
    let mut forger = forger;
    forger.wait_for("mapped");
    let run = env.command(fgpu_bin()).args(["status", "--all", "--json"]).success();
    let status: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    let ledgers = status["ledgers"].as_array().cloned().unwrap_or_default();
    // Other tests' ledgers may be listed too (they run beside this one): this test's own
    // are told by their path, and the forger's by its PID.
    let mapped_by = |l: &serde_json::Value, pid: u32| l["mapped_by"].as_array().is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(pid as u64)));
    assert!(!ledgers.iter().any(|l| mapped_by(l, forger.pid())), "the forgery is not a ledger\n{run}");
    let ours: Vec<&serde_json::Value> = ledgers.iter().filter(|l| l["path"] == env.ledger.display().to_string()).collect();
    assert_eq!(ours.len(), 1, "the served ledger, once\n{run}");
    let l = ours[0];
    assert!(l["id"].as_str().is_some_and(|id| id.starts_with("memfd:")), "{l:#}");
    assert_eq!(l["state"], "ok", "{l:#}");
    assert!(mapped_by(l, holder.pid()), "{l:#}");
    let held = env.sim().device_used(0);
    assert_eq!(l["devices"][0]["used_bytes"].as_u64(), Some(held), "the simulator's figure\n{l:#}");
    // The exporter's scan is the same: the served ledger's figure, under its path; no forgery.
    let port = free_port();
    let _exporter = env.command(fgpu_bin()).args(["exporter", "--all", "--listen", &format!("127.0.0.1:{port}")]).spawn();
    eventually("the exporter listens", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let (_, body) = http_get(port, "/metrics", "text/plain").unwrap();
    let label = format!("ledger=\"{}", env.ledger.display());
    let used: Vec<&str> = body.lines().filter(|m| m.starts_with("fgpu_memory_used_bytes{") && m.contains(&label)).collect();
    assert_eq!(used.len(), 1, "this test's ledger, once, on its one GPU\n{body}");
    assert!(used[0].ends_with(&format!("}} {held}")), "the simulator's {held} bytes\n{body}");
    forger.kill(libc::SIGKILL);
    holder.kill(libc::SIGKILL);
}
