//! The root-owned configuration file: a cap the environment can lower but never raise, a
//! ledger the environment cannot leave, and the front preloaded through /etc/ld.so.preload.
//! Each test gets a private /etc (an overlay in its own mount namespace).

use fgpu_tests::*;

fn totals(run: &Run) -> Vec<u64> {
    run.lines("info").iter().map(|l| field(l, "total").unwrap().parse().unwrap()).collect()
}

#[test]
fn a_file_cap_cannot_be_raised_from_the_environment() {
    let env = Env::new("conf-raise");
    let client = client("cuclient");
    let c = client.display();
    let script = format!(
        "mkdir -p /etc/fgpu; printf 'limit = 2G\\nledger = {ledger}\\n' > /etc/fgpu/fgpu.conf; chmod 644 /etc/fgpu/fgpu.conf; \
         echo {front} > /etc/ld.so.preload; \
         unset FGPU_LIMIT; {c} init primary info; \
         FGPU_LIMIT=64G {c} init primary info; \
         LD_PRELOAD= FGPU_LIMIT=64G {c} init primary info; \
         FGPU_LIMIT=1G {c} init primary info; \
         FGPU_LEDGER={other} {c} init primary alloc 1G sleep 3000 & sleep 1; \
         FGPU_LEDGER={third} {c} init primary alloc 1G; wait",
        ledger = env.ledger.display(),
        front = front_path().display(),
        other = env.dir.join("mine").display(),
        third = env.dir.join("theirs").display(),
    );
    let Some(cmd) = env.with_private_etc(&script) else { return };
    let run = cmd.success();
    assert_eq!(totals(&run), vec![2 * GIB, 2 * GIB, 2 * GIB, GIB], "file cap; 64G ignored (even with LD_PRELOAD emptied); 1G lowers it\n{run}");
    assert_eq!(run.lines("alloc"), vec!["alloc 1073741824 rc=0", "alloc 1073741824 rc=2"], "FGPU_LEDGER cannot leave the file's ledger\n{run}");
}

#[test]
fn an_untrusted_or_broken_file_fails_closed() {
    let env = Env::new("conf-bad");
    let c = client("cuclient");
    for (setup, expected) in [
        ("printf 'limit = 2G\\n' > /etc/fgpu/fgpu.conf; chmod 666 /etc/fgpu/fgpu.conf", "not owned by root or is writable"),
        ("printf 'limit = lots\\n' > /etc/fgpu/fgpu.conf; chmod 644 /etc/fgpu/fgpu.conf", "fgpu.conf:1: limit \"lots\" is not valid"),
        ("printf 'limt = 2G\\n' > /etc/fgpu/fgpu.conf; chmod 644 /etc/fgpu/fgpu.conf", "is not a `key = value` line"),
    ] {
        let script = format!("mkdir -p /etc/fgpu; {setup}; {} init primary alloc 1M", c.display());
        let Some(cmd) = env.with_private_etc(&script) else { return };
        let run = cmd.shim().success();
        assert_eq!(run.rc("alloc"), 2, "{run}");
        assert!(run.stderr().contains(expected), "{expected}\n{run}");
    }
}

#[test]
fn caps_follow_the_physical_gpu_whatever_cuda_visible_devices_says() {
    let env = Env::new("visible").devices(2);
    env.client(&["init"]).success();
    let second = env.sim().device_uuid_string(1);
    let limit = format!("{}=2G,*=8G", &second[..13]);
    // Physical GPU 1 is CUDA device 0 here and CUDA device 1 there: both see its 2 GiB cap
    // and share it.
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit(&limit).env("CUDA_VISIBLE_DEVICES", "1").spawn();
    holder.wait_for("holding");
    let run = env.client(&["init", "device", "1", "primary", "info", "alloc", "1G"]).shim().limit(&limit).env("CUDA_VISIBLE_DEVICES", "0,1").success();
    assert_eq!(run.field("info", "total"), (2 * GIB).to_string(), "{run}");
    assert_eq!(run.rc("alloc"), 2, "the 1 GiB held through the other ordinal counts\n{run}");
    let first = env.client(&["init", "primary", "info"]).shim().limit(&limit).env("CUDA_VISIBLE_DEVICES", "0,1").success();
    assert_eq!(first.field("info", "total"), (8 * GIB).to_string(), "{first}");
}
