//! The simulated GPUs' UUIDs: each simulator state (a simulated host) has its own, as real
//! GPUs do, so fgpu never mistakes the ledgers of one simulated host's GPUs for another's.

use fgpu_tests::*;

/// Each GPU's UUID as `fgpu-sim-ctl show` (a process of its own) prints it.
fn shown_uuids(env: &Env) -> Vec<String> {
    let run = Cmd(std::process::Command::new(release_dir().join("fgpu-sim-ctl"))).arg("--state").arg(&env.sim_state).arg("show").success();
    run.stdout().lines().map(|l| l.split_whitespace().nth(2).unwrap_or_else(|| panic!("{run}")).trim_end_matches(':').to_string()).collect()
}

/// `fgpu run` as the test's user, seeing `env`'s simulated driver.
fn fgpu(env: &Env) -> Cmd {
    let mut cmd = env.command(fgpu_bin());
    cmd.0.env("TMPDIR", &env.dir).env_remove("XDG_RUNTIME_DIR").env_remove("FGPU_SHIM");
    cmd
}

/// Two simulated hosts share no GPU UUID; every process of one host (this test, and
/// `fgpu-sim-ctl` twice) sees the same UUIDs; `FGPU_SIM_UUID_SEED` pins them.
#[test]
fn each_simulated_host_has_gpu_uuids_of_its_own() {
    let (a, b) = (Env::new("uuids-a").devices(4), Env::new("uuids-b").devices(4));
    a.client(&["init"]).success();
    b.client(&["init"]).success();
    let uuids = |env: &Env| (0..4).map(|i| env.sim().device_uuid_string(i)).collect::<Vec<_>>();
    let (ua, ub) = (uuids(&a), uuids(&b));
    assert!(ua.iter().all(|u| !ub.contains(u)), "two simulated hosts share GPU UUIDs:\n{ua:?}\n{ub:?}");
    assert_eq!(shown_uuids(&a), ua, "another process of the same host");
    assert_eq!(shown_uuids(&a), ua, "a third process of the same host");
    let (c, d) = (Env::new("uuids-c").devices(2), Env::new("uuids-d").devices(2));
    c.client(&["init"]).env("FGPU_SIM_UUID_SEED", "0x1234").success();
    d.client(&["init"]).env("FGPU_SIM_UUID_SEED", "4660").success();
    assert_eq!(uuids(&c)[..2], uuids(&d)[..2], "the same seed, the same UUIDs");
    assert!(uuids(&c).iter().all(|u| !ua.contains(u)));
}

/// The ledger of a job on simulated host A with a 12 GiB cap on its 16 GiB GPU 0 does not
/// fill host B's GPU 0: `fgpu run --gpus auto --limit 8G` places a job there. (With the
/// same UUIDs on every simulated host, B's placement counted A's cap and found no room.)
#[test]
fn gpus_auto_on_one_simulated_host_ignores_another_hosts_ledgers() {
    let (a, b) = (Env::new("uuids-host-a").sim_memory("16G"), Env::new("uuids-host-b").sim_memory("16G"));
    let mut held =
        fgpu(&a).args(["run", "--gpus", "auto", "--limit", "12G", "--"]).arg(client("cuclient")).args(["init", "primary", "alloc", "1G", "hold"]).spawn();
    held.wait_for("holding");
    let run = fgpu(&b).args(["run", "--gpus", "auto", "--limit", "8G", "--"]).arg(client("cuclient")).args(["init", "primary", "info"]).run();
    assert!(run.output.status.success(), "host B's GPU is empty, yet no room\n{run}");
    assert_eq!(run.field("info", "total"), (8u64 << 30).to_string(), "{run}");
    held.finish();
}
