//! `fgpu mig` and `fgpu run --mig` against the simulated driver's MIG (docs/mig.md), with
//! the simulator's own instance table (`SimState::gpu_instances`, `mig_devices`) and the
//! real `nvidia-smi mig -lgi` as the judges: listing, creating and destroying; several runs
//! at once carving, filling and freeing one GPU; a crashed run's instance collected; and
//! the one-line refusals without the capability and with MIG off.

use fgpu_sim_state::{mig::Product, SimConfig, SimState};
use fgpu_tests::*;
use serde_json::Value;
use std::path::PathBuf;

/// A test directory whose simulated GPUs are `devices` H100s, those of `mig` (a bit per
/// GPU) in MIG mode, and fgpu's MIG record and capability file inside it.
struct MigEnv {
    env: Env,
    sim: SimState,
    record: PathBuf,
}

impl MigEnv {
    fn new(name: &str, product: Product, mig: u32, devices: u32) -> MigEnv {
        let env = Env::new(name);
        let sim = SimState::open_with(&env.sim_state, &SimConfig { devices, product, mig, ..SimConfig::default() }).unwrap();
        let record = env.dir.join("mig-record");
        MigEnv { env, sim, record }
    }

    /// `fgpu ARGS` seeing the simulated driver, with the test's record and capability.
    fn fgpu(&self, args: &[&str]) -> Cmd {
        self.env
            .command(fgpu_bin())
            .args(args)
            .env("FGPU_MIG_RECORD", &self.record)
            .env("FGPU_MIG_CAPABILITY", fgpu_sim_state::mig_config_capability_path(&self.env.sim_state))
    }

    /// (GPU instance ID, first slice, slice count) of GPU 0's instances, as the simulator
    /// holds them.
    fn truth(&self, gpu: usize) -> Vec<(u32, u32, u32)> {
        let mut v: Vec<_> = self.sim.gpu_instances(gpu).unwrap().iter().map(|g| (g.id, g.start, g.size)).collect();
        v.sort_unstable();
        v
    }

    fn list_json(&self) -> Value {
        let run = self.fgpu(&["mig", "list", "--json"]).success();
        serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"))
    }
}

fn nvidia_smi() -> Option<PathBuf> {
    provided_path("FGPU_TEST_NVIDIA_SMI", "the real nvidia-smi from scripts/get-nvidia-smi.sh")
}

/// `nvidia-smi mig -lgi`'s instance rows, squeezed: "GPU NAME PROFILE-ID INSTANCE-ID START:SIZE".
fn smi_instances(m: &MigEnv, smi: &PathBuf) -> Vec<String> {
    let run = m.env.command(smi).args(["mig", "-lgi"]).run();
    let mut rows: Vec<String> = run
        .stdout()
        .lines()
        .filter(|l| l.contains("MIG "))
        .map(|l| l.trim_matches(|c| c == '|' || c == ' ').split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    rows.sort();
    rows
}

#[test]
fn mig_list_create_and_destroy_judged_by_nvidia_smi() {
    let Some(smi) = nvidia_smi() else { return };
    let m = MigEnv::new("mig-cli-crud", Product::H100_80GB, 1, 1);

    // An empty GPU: every placement free, as the guide's -lgipp lists them.
    let list = m.list_json();
    let free = &list["gpus"][0]["free"];
    let one_g = free.as_array().unwrap().iter().find(|p| p["profile"] == "1g.10gb").unwrap();
    assert_eq!(one_g["fits"], 7, "{list}");
    assert_eq!(one_g["id"], 19);

    // A 3g goes to the second half (4:4, instance 2), a 1g beside it on the first half.
    let made = m.fgpu(&["mig", "create", "3g.40gb"]).success();
    let three_g = made.stdout().trim().to_string();
    assert!(three_g.starts_with("MIG-"), "{made}");
    assert_eq!(m.truth(0), [(2, 4, 4)], "{made}");
    let made = m.fgpu(&["mig", "create", "1g.10gb", "--gpu", "0"]).success();
    let one = made.stdout().trim().to_string();
    let truth = m.truth(0);
    assert_eq!(truth.len(), 2, "{made}");
    let (one_id, one_start, _) = *truth.iter().find(|t| t.2 == 1).unwrap();
    assert!(one_start < 4, "the 1g goes beside the 3g, not into its half: {truth:?}");
    assert_eq!(smi_instances(&m, &smi), [format!("0 MIG 1g.10gb 19 {one_id} {one_start}:1"), "0 MIG 3g.40gb 9 2 4:4".to_string()]);
    // The MIG UUIDs fgpu printed are the simulator's.
    let mut uuids: Vec<String> = m.sim.mig_devices(0).iter().map(|d| d.uuid_string()).collect();
    uuids.sort();
    let mut printed = vec![three_g.clone(), one.clone()];
    printed.sort();
    assert_eq!(uuids, printed);

    // One made by nvidia-smi is listed as not fgpu's, and fgpu will not destroy it.
    m.env.command(&smi).args(["mig", "-cgi", "1g.10gb", "-C"]).success();
    assert_eq!(m.truth(0).len(), 3);
    let list = m.list_json();
    assert_eq!(list["gpus"][0]["instances"].as_array().unwrap().len(), 3, "{list}");
    assert_eq!(list["gpus"][0]["fgpu_created"].as_array().unwrap().len(), 2, "{list}");
    let theirs = m.sim.mig_devices(0).iter().map(|d| d.uuid_string()).find(|u| *u != one && *u != three_g).unwrap();
    let refused = m.fgpu(&["mig", "destroy", &theirs]).run();
    assert_eq!(refused.output.status.code(), Some(1), "{refused}");
    assert!(refused.stderr().contains("is not an instance fgpu created"), "{refused}");
    let text = m.fgpu(&["mig", "list"]).success().stdout();
    assert!(text.contains("created by not fgpu") && text.contains("created by fgpu, kept"), "{text}");

    // Destroyed: the driver's table has only nvidia-smi's left.
    let gone = m.fgpu(&["mig", "destroy", &three_g, &one]).success();
    assert_eq!(m.truth(0).len(), 1, "{gone}");
    assert_eq!(smi_instances(&m, &smi).len(), 1);
    assert!(smi_instances(&m, &smi)[0].starts_with("0 MIG 1g.10gb 19"), "{:?}", smi_instances(&m, &smi));
    assert!(std::fs::read_dir(&m.record).unwrap().next().is_none(), "the record is empty again");
}

/// Another creator takes the chosen placement between fgpu's look and its create (the
/// simulator's `FGPU_SIM_MIG_RACE`: a rival creates there first, and NVML answers
/// `INSUFFICIENT_RESOURCES`): fgpu looks again and carves the next placement, and leaves
/// the rival's instance alone.
#[test]
fn a_placement_taken_meanwhile_is_chosen_again() {
    let m = MigEnv::new("mig-cli-race", Product::H100_80GB, 1, 1);
    let made = m.fgpu(&["mig", "create", "1g.10gb"]).env("FGPU_SIM_MIG_RACE", "2").success();
    assert_eq!(made.stderr().matches("was taken meanwhile").count(), 2, "{made}");
    let truth = m.truth(0);
    assert_eq!(truth.len(), 3, "two rivals' instances and fgpu's: {truth:?}\n{made}");
    assert_eq!(truth.iter().map(|t| t.1).collect::<std::collections::BTreeSet<_>>().len(), 3, "three placements: {truth:?}");
    let list = m.list_json();
    assert_eq!(list["gpus"][0]["fgpu_created"].as_array().unwrap().len(), 1, "{list}");
    // What fgpu printed is an instance the driver has; the rivals' are not fgpu's to destroy.
    let mine = made.stdout().trim().to_string();
    let uuids: Vec<String> = m.sim.mig_devices(0).iter().map(|d| d.uuid_string()).collect();
    assert!(uuids.contains(&mine), "{mine} in {uuids:?}");
    for theirs in uuids.iter().filter(|u| **u != mine) {
        let refused = m.fgpu(&["mig", "destroy", theirs]).run();
        assert_eq!(refused.output.status.code(), Some(1), "{refused}");
    }
    m.fgpu(&["mig", "destroy", &mine]).success();
    assert_eq!(m.truth(0).len(), 2, "only fgpu's instance went");
}

/// Eight `fgpu run --mig 1g.10gb` at once on one H100 (room for seven): seven get distinct
/// instances, each job sees its own 1g memory, the eighth is refused with one line; when
/// the jobs end every instance is gone.
#[test]
fn concurrent_runs_carve_fill_and_free_a_gpu() {
    let m = MigEnv::new("mig-cli-runs", Product::H100_80GB, 1, 1);
    // All eight wait for one file, so that they choose and create at the same moment.
    let go = m.env.dir.join("go");
    let mut jobs: Vec<Background> = (0..8)
        .map(|_| {
            m.env
                .command("sh")
                .args(["-c", "while [ ! -e \"$0\" ]; do sleep 0.01; done; exec \"$@\""])
                .arg(&go)
                .arg(fgpu_bin())
                .args(["run", "--mig", "1g.10gb", "--limit", "4G", "--"])
                .arg(client("cuclient"))
                .args(["init", "primary", "info", "hold"])
                .env("FGPU_MIG_RECORD", &m.record)
                .env("FGPU_MIG_CAPABILITY", fgpu_sim_state::mig_config_capability_path(&m.env.sim_state))
                .env("LD_LIBRARY_PATH", sim_lib_dir())
                .spawn()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(&go, "").unwrap();
    // Each job either holds its instance or was refused.
    let mut holding = Vec::new();
    let mut refused = Vec::new();
    for (i, job) in jobs.iter_mut().enumerate() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if job.lines_so_far().iter().any(|l| l == "holding") {
                holding.push(i);
                break;
            }
            if !job.running() {
                refused.push(i);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "job {i} neither held nor ended");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert_eq!((holding.len(), refused.len()), (7, 1), "holding {holding:?}, refused {refused:?}");
    let truth = m.truth(0);
    let mut starts: Vec<u32> = truth.iter().map(|t| t.1).collect();
    starts.sort_unstable();
    assert_eq!(starts, [0, 1, 2, 3, 4, 5, 6], "seven 1g instances, one per slice: {truth:?}");
    for &i in &holding {
        let info = jobs[i].lines.iter().find(|l| l.starts_with("info ")).cloned().unwrap();
        // The cap (4 GiB) inside the 1g instance's 9984 MiB.
        assert_eq!(field(&info, "total").unwrap(), (4u64 << 30).to_string(), "job {i}: {info}");
    }
    let out = jobs[refused[0]].finish();
    assert_eq!(out.output.status.code(), Some(125), "{out}");
    let err = out.stderr();
    assert_eq!(err.lines().filter(|l| l.starts_with("fgpu run: --mig 1g.10gb:")).count(), 1, "{out}");
    assert!(err.contains("no room for a 1g.10gb"), "{out}");
    let mut retries = err.matches("taken meanwhile").count();
    // Free: each job's end destroys its instance.
    for &i in &holding {
        let out = jobs[i].finish();
        assert!(out.output.status.success(), "{out}");
        retries += out.stderr().matches("taken meanwhile").count();
    }
    println!("eight concurrent fgpu run --mig 1g.10gb: 7 carved, 1 refused, {retries} placement(s) taken meanwhile and chosen again");
    assert_eq!(m.truth(0), [], "every instance destroyed when its job ended");
    assert!(std::fs::read_dir(&m.record).unwrap().next().is_none(), "the record is empty again");
}

/// A run killed with SIGKILL leaves its instance; `fgpu mig gc` keeps it while its job's
/// process still uses it, destroys it once it does not; and the next run collects another.
#[test]
fn a_crashed_runs_instance_is_collected_by_gc_and_the_next_run() {
    let m = MigEnv::new("mig-cli-gc", Product::H100_80GB, 1, 1);
    // The job holds until its FIFO is closed (not its stdin, which the test's wait for the
    // killed fgpu closes).
    let fifo = m.env.dir.join("job-fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let start = |profile: &str| {
        let mut job = m
            .fgpu(&["run", "--mig", profile, "--", "sh", "-c", "exec \"$0\" init primary alloc 64M hold < \"$1\""])
            .arg(client("cuclient"))
            .arg(&fifo)
            .env("LD_LIBRARY_PATH", sim_lib_dir())
            .spawn();
        let held = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
        job.wait_for("holding");
        (job, held)
    };
    let (mut job, held) = start("2g.20gb");
    assert_eq!(m.truth(0).len(), 1);
    job.kill(libc::SIGKILL);
    let text = m.fgpu(&["mig", "list"]).success().stdout();
    assert!(text.contains("`fgpu mig gc` destroys it"), "{text}");
    // Its process (the job's cuclient) still holds the instance.
    let kept = m.fgpu(&["mig", "gc"]).success();
    assert!(kept.stdout().contains("kept") && kept.stdout().contains("in use"), "{kept}\n{text}\n{:?}", job.lines_so_far());
    assert_eq!(m.truth(0).len(), 1);
    drop(held);
    job.finish();
    let collected = m.fgpu(&["mig", "gc"]).success();
    assert!(collected.stdout().starts_with("destroyed MIG-"), "{collected}");
    assert_eq!(m.truth(0), []);

    // The next run collects a crashed one before it carves its own.
    let (mut job, held) = start("3g.40gb");
    job.kill(libc::SIGKILL);
    drop(held);
    job.finish();
    assert_eq!(m.truth(0).len(), 1);
    let next = m.fgpu(&["run", "--mig", "1g.10gb", "--", "true"]).success();
    assert!(next.stderr().contains("destroyed MIG-"), "{next}");
    assert_eq!(m.truth(0), [], "the crashed run's instance and the new run's are both gone");
}

#[test]
fn without_the_capability_or_with_mig_off_one_line_says_why() {
    let m = MigEnv::new("mig-cli-refusals", Product::H100_80GB, 0b10, 2);
    // MIG off on GPU 0: named, with the command that enables it; fgpu changes nothing.
    let off = m.fgpu(&["mig", "create", "1g.10gb", "--gpu", "0"]).run();
    assert_eq!(off.output.status.code(), Some(1), "{off}");
    assert_eq!(off.stderr().lines().count(), 1, "{off}");
    assert!(off.stderr().contains("`sudo nvidia-smi -i 0 -mig 1` enables it"), "{off}");
    assert_eq!(m.sim.mig_mode(0), Ok((false, false)), "the mode is unchanged");
    // --gpu 1 is in MIG mode.
    m.fgpu(&["mig", "create", "1g.10gb", "--gpu", "1"]).success();
    assert_eq!(m.truth(1).len(), 1);

    let none = MigEnv::new("mig-cli-off", Product::H100_80GB, 0, 1);
    let run = none.fgpu(&["run", "--mig", "1g.10gb", "--", "true"]).run();
    assert_eq!(run.output.status.code(), Some(125), "{run}");
    assert_eq!(run.stderr().lines().count(), 1, "{run}");
    assert!(run.stderr().contains("no GPU is in MIG mode") && run.stderr().contains("nvidia-smi -i 0 -mig 1"), "{run}");

    // Not root, and no read access to the capability: one line says which.
    if !is_root() {
        return;
    }
    let user = m
        .env
        .command_as(65534, fgpu_bin())
        .args(["mig", "create", "1g.10gb"])
        .env("FGPU_MIG_RECORD", m.env.dir.join("nobody-record"))
        .env("FGPU_MIG_CAPABILITY", fgpu_sim_state::mig_config_capability_path(&m.env.sim_state))
        .run();
    assert_eq!(user.output.status.code(), Some(1), "{user}");
    assert_eq!(user.stderr().lines().count(), 1, "{user}");
    assert!(user.stderr().contains("needs root or the MIG config capability") && user.stderr().contains("uid 65534 has neither"), "{user}");
    assert_eq!(m.truth(1).len(), 1, "nothing was created");
}

/// `fgpu status` shows the instances; `--gpus auto` leaves GPUs in MIG mode out, and says
/// so when that leaves none.
#[test]
fn status_shows_instances_and_gpus_auto_skips_mig_gpus() {
    let m = MigEnv::new("mig-cli-status", Product::H100_80GB, 0b01, 2);
    let uuid = m.fgpu(&["mig", "create", "2g.20gb"]).success().stdout().trim().to_string();
    let text = m.fgpu(&["status"]).success();
    let line = text.stdout().lines().find(|l| l.contains(&uuid)).map(String::from).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("GPU 0") && line.contains("2g.20gb") && line.contains("made by fgpu"), "{line}");
    let json: Value = serde_json::from_str(&m.fgpu(&["status", "--json"]).success().stdout()).unwrap();
    let instances = json["mig_instances"].as_array().unwrap_or_else(|| panic!("{json}"));
    assert_eq!(instances.len(), 1, "{json}");
    assert_eq!(instances[0]["mig_uuids"][0], uuid.as_str());
    assert_eq!(instances[0]["gpu_instance"], m.truth(0)[0].0);

    // GPU 0 is in MIG mode: the whole-GPU job goes to GPU 1.
    let placed = m.fgpu(&["run", "--gpus", "auto", "--limit", "1G", "--", "sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES"]).success();
    assert_eq!(placed.line("visible="), format!("visible={}", m.sim.device_uuid_string(1)), "{placed}");

    let all = MigEnv::new("mig-cli-status-all", Product::H100_80GB, 0b11, 2);
    let refused = all.fgpu(&["run", "--gpus", "auto", "--limit", "1G", "--", "true"]).run();
    assert_eq!(refused.output.status.code(), Some(125), "{refused}");
    assert!(refused.stderr().contains("every GPU is in MIG mode") && refused.stderr().contains("--mig PROFILE"), "{refused}");
    m.fgpu(&["mig", "destroy", &uuid]).success();
}

#[test]
fn create_at_a_placement_by_gpu_uuid_and_destroy_tells_in_use_apart() {
    let m = MigEnv::new("mig-cli-placement", Product::A100_80GB, 1, 1);
    let gpu = m.sim.device_uuid_string(0);
    // Exactly at slice 4, the GPU named by its UUID; the record's entry as JSON.
    let run = m.fgpu(&["mig", "create", "3g.40gb", "--gpu", &gpu, "--placement", "4", "--json"]).success();
    let made: Value = serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    let gi = made["gpu_instance"].as_u64().unwrap() as u32;
    assert_eq!(m.truth(0), [(gi, 4, 4)], "{run}");
    let device = m.sim.mig_device(0, gi, made["compute_instance"].as_u64().unwrap() as u32).unwrap();
    assert_eq!(made["mig_uuid"], device.uuid_string(), "{run}");
    assert_eq!((made["gpu_uuid"].as_str(), made["gpu_minor"].as_u64(), made["placement"].clone()), (Some(gpu.as_str()), Some(0), serde_json::json!([4, 4])));
    assert_eq!(made["memory_mib"], 40192);

    // A placement another instance holds: exit 4, the holder named, nothing created.
    let taken = m.fgpu(&["mig", "create", "2g.20gb", "--gpu", "0", "--placement", "4"]).run();
    assert_eq!(taken.output.status.code(), Some(4), "{taken}");
    assert!(taken.stderr().contains(&format!("placement 4 of 2g.20gb on GPU 0 is taken by instance {gi} (3g.40gb at 4:4)")), "{taken}");
    // A placement the profile does not have, and one without its GPU.
    let none = m.fgpu(&["mig", "create", "3g.40gb", "--gpu", "0", "--placement", "1"]).run();
    assert_eq!(none.output.status.code(), Some(1), "{none}");
    assert!(none.stderr().contains("3g.40gb on GPU 0 has no placement starting at slice 1 (its placements: 0:4 4:4)"), "{none}");
    assert_eq!(m.fgpu(&["mig", "create", "3g.40gb", "--placement", "0"]).run().output.status.code(), Some(2));
    assert_eq!(m.truth(0), [(gi, 4, 4)]);

    // destroy --json: in use (exit 3) while a process is on it, destroyed once it is gone.
    let uuid = device.uuid_string();
    let mut job = m.env.client(&["init", "primary", "alloc", "256M", "hold"]).env("CUDA_VISIBLE_DEVICES", &uuid).spawn();
    job.wait_for("holding");
    let busy = m.fgpu(&["mig", "destroy", "--json", &uuid]).run();
    assert_eq!(busy.output.status.code(), Some(3), "{busy}");
    let line: Value = serde_json::from_str(busy.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{busy}"));
    assert_eq!(line["outcome"], "in_use", "{busy}");
    assert!(line["message"].as_str().unwrap().contains(&format!("by PID(s) [{}]", job.pid())), "{busy}");
    job.kill(libc::SIGKILL);
    let _ = job.finish();
    let gone = m.fgpu(&["mig", "destroy", "--json", &uuid, "MIG-00000000-0000-0000-0000-000000000000"]).run();
    let lines: Vec<Value> = gone.stdout().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.iter().map(|l| l["outcome"].as_str().unwrap()).collect::<Vec<_>>(), ["destroyed", "not_recorded"], "{gone}");
    assert_eq!(gone.output.status.code(), Some(1), "another failure than in use: {gone}");
    assert_eq!(m.truth(0), []);
}
