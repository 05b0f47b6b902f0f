//! Claims under load and over time: concurrent prepares within each GPU's capacity, claims
//! deleted while the plugin was down, claim files out of other users' reach, and a graceful
//! stop.

use super::*;

/// kubelet prepares different pods' claims at once: none waits for another's API call. The
/// node's own account refuses what would pass a GPU's capacity, counting a claim once.
#[test]
fn dra_prepares_concurrently_within_each_gpus_capacity() {
    let Some(node) = Node::new("dra-concurrent", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    const N: u32 = 16;
    for i in 0..N {
        node.api.add_claim(claim_json("ml", &format!("c{i}"), &uid(100 + i), Some(&[alloc("gpu-0", Some("4Gi"), Some("5"))]), &["p"]));
    }
    // What is left after 16 x 4 GiB: 81408 - 65536 = 15872 MiB; 16 GiB does not fit.
    node.api.add_claim(claim_json("ml", "big", &uid(200), Some(&[alloc("gpu-0", Some("16Gi"), None)]), &["big-0"]));
    node.api.add_claim(claim_json("ml", "busy", &uid(201), Some(&[alloc("gpu-0", Some("1Gi"), Some("25"))]), &["busy-0"]));
    node.api.add_claim(claim_json("ml", "shared", &uid(202), Some(&[alloc("gpu-0", Some("15Gi"), Some("20"))]), &["s-0", "s-1"]));
    let plugin = node.start(&[]);
    // Each claim's GET takes 1 s: sixteen in a row would take 16 s.
    node.api.state.lock().unwrap().claim_delay = Duration::from_secs(1);
    let claims: Vec<ClaimRef> = (0..N).map(|i| ClaimRef::new("ml", &format!("c{i}"), &uid(100 + i))).collect();
    let answer = node.kubelet.prepare_concurrently(&node.dra(), &claims).unwrap();
    assert_eq!(answer["errors"], json!({}), "{answer}");
    for c in &claims {
        assert_eq!(answer["claims"][&c.uid]["error"], "", "{answer}\n{}", plugin.log());
    }
    let in_flight = node.api.state.lock().unwrap().claims_in_flight_max;
    eprintln!("16 concurrent prepares: the slowest took {:.2} s; {in_flight} claim reads were in flight at once", answer["slowest"].as_f64().unwrap());
    assert!(in_flight >= 8, "the plugin read at most {in_flight} claims at once:\n{answer}");
    node.api.state.lock().unwrap().claim_delay = Duration::ZERO;
    let err = |name: &str, u: u32| {
        let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", name, &uid(u))]).unwrap();
        answer[uid(u)]["error"].as_str().unwrap().to_string()
    };
    let big = err("big", 200);
    assert!(big.contains("consume 64Gi of its 81408Mi memory capacity, and this claim asks 16Gi more"), "{big}");
    let busy = err("busy", 201);
    assert!(busy.contains("consume 80 of its 100 compute, and this claim asks 25 more"), "{busy}");
    // A claim of two pods, prepared for each: once, and counted once.
    assert_eq!(err("shared", 202), "");
    assert_eq!(err("shared", 202), "");
    let status = node.status();
    assert_eq!(status["gpus"][0]["memoryUsed"].as_u64(), Some(64 * GIB + 15 * GIB), "{status}");
    assert_eq!(status["gpus"][0]["computeUsedMillipercent"].as_u64(), Some(100_000), "{status}");
    assert_eq!(status["gpus"][0]["claims"].as_array().unwrap().len(), 17, "{status}");
}

/// Claims deleted while the plugin was down are unprepared when it starts, only where the
/// API server says they are gone (404, or another claim of the name); one the server
/// cannot read now stays prepared.
#[test]
fn dra_claims_gone_while_the_plugin_was_down_are_cleaned_up_on_404_only() {
    let Some(node) = Node::new("dra-gone", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    for (i, name) in ["deleted", "recreated", "unreadable", "kept"].iter().enumerate() {
        node.api.add_claim(claim_json("ml", name, &uid(i as u32), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    }
    let plugin = node.start(&[]);
    let refs: Vec<ClaimRef> = ["deleted", "recreated", "unreadable", "kept"].iter().enumerate().map(|(i, n)| ClaimRef::new("ml", n, &uid(i as u32))).collect();
    let answer = node.kubelet.prepare(&node.dra(), &refs).unwrap();
    assert!(answer.as_object().unwrap().values().all(|r| r["error"] == ""), "{answer}");
    drop(plugin);
    node.api.remove_claim("ml", "deleted");
    node.api.add_claim(claim_json("ml", "recreated", &uid(99), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    node.api.state.lock().unwrap().claim_refusals.insert(("ml".into(), "unreadable".into()), 500);
    let plugin = node.start(&[]);
    eventually("the claims that are gone are unprepared", Duration::from_secs(30), || node.checkpoint()["claims"].as_object().unwrap().len() == 2);
    let left: Vec<String> = node.checkpoint()["claims"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(left, [uid(2), uid(3)], "{}", plugin.log());
    assert!(!node.cdi().join(format!("fgpu-claim-{}.json", uid(0))).exists() && !node.state().join(format!("claims/{}", uid(1))).exists());
    assert!(node.cdi().join(format!("fgpu-claim-{}.json", uid(2))).exists(), "kept on an API error");
    assert!(
        plugin.log().contains("no longer exists") && plugin.log().contains("is another claim now") && plugin.log().contains("it stays prepared"),
        "{}",
        plugin.log()
    );
}

/// Nobody but root reaches a claim's files: another user of the node can neither list nor
/// open, lock or create anything under them; the sockets, the checkpoint and the status are
/// root's alone; directories an earlier release left 0755 are set right.
#[test]
fn dra_claim_files_are_out_of_other_users_reach() {
    if !prerequisite(is_root() && tool("setpriv"), "needs root and setpriv(1) to act as another user") {
        return;
    }
    let Some(node) = Node::new("dra-private", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "train", &uid(1), Some(&[alloc("gpu-0", Some("8Gi"), None)]), &["p"]));
    // An earlier release's tree: claims/ and a claim's directory 0755.
    let old = node.state().join(format!("claims/{}", uid(5)));
    std::fs::create_dir_all(old.join("config")).unwrap();
    for dir in [node.state().join("claims"), old.clone()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "train", &uid(1))]).unwrap();
    assert_eq!(answer[uid(1)]["error"], "", "{answer}\n{}", plugin.log());
    let claim = node.state().join(format!("claims/{}", uid(1)));
    // The ledger's files, as the plugin made them, and a process of the claim that holds
    // the ledger's memory file.
    let socket = claim.join("config/ledger.sock");
    let mut member = node
        .env
        .command(client("cuclient"))
        .env("FGPU_LEDGER", claim.join("ledger/ledger"))
        .env("FGPU_LEDGER_SOCKET", &socket)
        .env("FGPU_LIMIT", "1G")
        .shim()
        .args(["init", "primary", "alloc", "1M", "hold"])
        .spawn();
    member.wait_for("holding");
    assert_eq!(mode(&claim.join("ledger/ledger")), 0o666, "every process of the claim, as any user, locks it");
    assert_eq!(mode(&socket), 0o666, "every process of the claim, as any user, asks it");
    assert_eq!(mode(&node.state().join("claims")), 0o700);
    assert_eq!(mode(&claim), 0o700);
    assert_eq!(mode(&old), 0o700, "an earlier release's 0755 is set right");
    assert_eq!(mode(&node.registration()), 0o600);
    assert_eq!(mode(&node.dra()), 0o600);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io")), 0o700);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io/checkpoint.json")), 0o600);
    assert_eq!(mode(&node.plugins().join("gpu.fgpu.io/status.json")), 0o600);
    // Another user (nobody) tries.
    let ledger = claim.join("ledger/ledger");
    let attacks = format!(
        "ls {claims} >/dev/null 2>&1 && echo listed; cat {conf} >/dev/null 2>&1 && echo read-config; \
         cat {ledger} >/dev/null 2>&1 && echo opened-ledger; flock -n {ledger} true 2>/dev/null && echo locked-ledger; \
         touch {dir}/intruder 2>/dev/null && echo created; ls {dir} >/dev/null 2>&1 && echo listed-ledger; echo done",
        claims = node.state().join("claims").display(),
        conf = claim.join("config/fgpu.conf").display(),
        ledger = ledger.display(),
        dir = claim.join("ledger").display()
    );
    let run = node.env.command_as(65534, "sh").args(["-c", &attacks]).run();
    assert_eq!(run.stdout().trim(), "done", "another user reached a claim's files\n{run}");
    // The served ledger: its keeper's socket, and the memory file a process of the claim
    // holds (taken with pidfd_getfd, or reopened through /proc).
    let reach = format!(
        r#"
import ctypes, os, socket
try:
    s = socket.socket(socket.AF_UNIX); s.connect({socket:?}); print("connected-to-the-keeper")
except OSError as e: print("socket", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, {pid}, 0)
if pidfd >= 0 and any(libc.syscall(438, pidfd, n, 0) >= 0 for n in range(256)): print("took-a-descriptor")
try:
    for n in os.listdir("/proc/{pid}/fd"):
        os.open("/proc/{pid}/fd/" + n, os.O_RDONLY); print("reopened-a-descriptor"); break
except OSError as e: print("proc", e.errno)
print("done")
"#,
        socket = socket.display().to_string(),
        pid = member.pid()
    );
    let Some(python) = python_with("ctypes") else { return };
    let run = node.env.command_as(65534, &python).args(["-c", &reach]).run();
    let out = run.stdout();
    assert!(
        out.contains("done") && !out.contains("connected") && !out.contains("took") && !out.contains("reopened"),
        "another user reached the claim's ledger\n{run}"
    );
    assert!(out.contains(&format!("socket {}", libc::EACCES)), "the socket is out of reach (claims/ is root's alone)\n{run}");
    member.kill(libc::SIGKILL);
}

/// SIGTERM: the calls in flight finish, kubelet's registration socket goes first, prepared
/// claims stay prepared.
#[test]
fn dra_stops_gracefully() {
    let Some(node) = Node::new("dra-stop", 1, Gates::ALL) else { return };
    node.nvidia_spec();
    node.api.add_claim(claim_json("ml", "slow", &uid(1), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    node.api.add_claim(claim_json("ml", "done", &uid(2), Some(&[alloc("gpu-0", Some("1Gi"), None)]), &["p"]));
    let plugin = node.start(&[]);
    let answer = node.kubelet.prepare(&node.dra(), &[ClaimRef::new("ml", "done", &uid(2))]).unwrap();
    assert_eq!(answer[uid(2)]["error"], "");
    node.api.state.lock().unwrap().claim_delay = Duration::from_secs(3);
    let (dra, python) = (node.dra(), python_with("grpc").unwrap());
    let claims = json!([{"namespace": "ml", "name": "slow", "uid": uid(1)}]).to_string();
    let in_flight =
        std::thread::spawn(move || Cmd(std::process::Command::new(python)).arg(fgpu_tests::dra::fake_kubelet()).args(["prepare"]).arg(&dra).arg(&claims).run());
    eventually("the prepare is in flight", Duration::from_secs(20), || node.api.state.lock().unwrap().claims_in_flight == 1);
    let (code, log) = plugin.terminate(Duration::from_secs(30));
    let run = in_flight.join().unwrap();
    assert_eq!(code, Some(0), "{log}");
    let answer: Value = serde_json::from_str(run.stdout().trim()).unwrap_or(Value::Null);
    assert_eq!(answer["claims"][uid(1)]["error"], "", "the call in flight was cut\n{run}\n{log}");
    assert!(!node.registration().exists(), "kubelet's registration socket stays\n{log}");
    assert!(node.cdi().join(format!("fgpu-claim-{}.json", uid(1))).exists() && node.cdi().join(format!("fgpu-claim-{}.json", uid(2))).exists(), "{log}");
    assert!(log.contains("prepared claims stay prepared"), "{log}");
}
