//! Caps and shares inside MIG instances, on the simulated driver's MIG (an H100 80GB):
//! a process that sees a MIG device (`CUDA_VISIBLE_DEVICES=MIG-…`) is held to its cap
//! within that instance's memory, and CUDA, NVML on the MIG device's handle and the real
//! `nvidia-smi` say so; the ledger keeps each instance apart from the others and from a GPU
//! beside them, under its own `MIG-` UUID; a compute share holds inside an instance,
//! measured by the process's events since NVML has no per-process samples there, and a
//! share that cannot be measured is refused. Ground truth: the simulator's instance memory
//! (`gpu_instance_used`) and each MIG device's own timeline (`mig_device_busy`).

use fgpu_sim_state::{mig::Product, now_ns, MigDevice, SimConfig, SimState};
use fgpu_tests::*;
use serde_json::Value;
use std::time::Duration;

/// `MIG 3g.40gb` and `1g.10gb` on an H100 80GB: GPU instance profile IDs, and the
/// compute instance profile as large as each (the MIG user guide's `-lcip`).
const PROFILE_3G: (u32, u32) = (9, 2);
const PROFILE_1G: (u32, u32) = (19, 0);

/// A test directory whose simulated GPUs are `devices` H100s, those of `mig` (a bit per
/// GPU) in MIG mode; the state file is made here, so every later process opens it.
fn h100s(name: &str, devices: u32, mig: u32) -> (Env, SimState) {
    let env = Env::new(name);
    let sim = SimState::open_with(&env.sim_state, &SimConfig { devices, product: Product::H100_80GB, mig, ..SimConfig::default() }).unwrap();
    (env, sim)
}

/// A GPU instance of `profile` on GPU `dev` with its full-size compute instance: its MIG device.
fn carve(sim: &SimState, dev: usize, (gi_profile, ci_profile): (u32, u32)) -> MigDevice {
    let gi = sim.create_gpu_instance(dev, gi_profile, None).unwrap();
    let ci = sim.create_compute_instance(dev, gi.id, ci_profile, None).unwrap();
    sim.mig_device(dev, gi.id, ci.id).unwrap()
}

/// `cuclient ARGS` on `device` (a `CUDA_VISIBLE_DEVICES` entry) under the shim with `limit`.
fn on(env: &Env, device: &str, limit: &str, args: &[&str]) -> Cmd {
    env.client(args).shim().limit(limit).env("CUDA_VISIBLE_DEVICES", device)
}

fn number(run_line: &str, key: &str) -> u64 {
    field(run_line, key).unwrap_or_else(|| panic!("no {key}= in {run_line:?}")).parse().unwrap()
}

/// The lines of `text` with runs of spaces squeezed.
fn squeezed(text: &str) -> Vec<String> {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

#[test]
fn a_cap_inside_a_mig_instance_is_what_cuda_nvml_and_nvidia_smi_show() {
    let (env, sim) = h100s("mig-caps-memory", 1, 1);
    let (m3, m1) = (carve(&sim, 0, PROFILE_3G), carve(&sim, 0, PROFILE_1G));
    let (gi3, context) = (m3.gpu_instance.id, sim.context_overhead());

    // FGPU_LIMIT=4G inside the 3g.40gb instance (39.5 GiB): 3 GiB fit, 1 GiB more does not.
    let mut a = on(&env, &m3.uuid_string(), "4G", &["init", "primary", "info", "total", "alloc", "3G", "alloc", "1G", "info", "hold"]).spawn();
    a.wait_for("holding");
    let lines = a.lines.clone();
    let line =
        |prefix: &str, nth: usize| lines.iter().filter(|l| l.starts_with(prefix)).nth(nth).cloned().unwrap_or_else(|| panic!("no {prefix} {nth}: {lines:?}"));
    assert_eq!((number(&line("info", 0), "total"), number(&line("info", 0), "free")), (4 * GIB, 4 * GIB - context), "cuMemGetInfo: {lines:?}");
    assert_eq!(number(&line("total", 0), "total"), 4 * GIB, "cuDeviceTotalMem");
    assert_eq!((line("alloc", 0), line("alloc", 1)), ("alloc 3221225472 rc=0".into(), "alloc 1073741824 rc=2".into()), "the cap refuses, not the instance");
    assert_eq!(number(&line("info", 1), "free"), GIB - context);
    let held = 3 * GIB + context;
    assert_eq!(sim.gpu_instance_used(0, gi3), held, "ground truth: the instance holds the process's context and 3 GiB");
    assert!(sim.gpu_instance_free(0, gi3) > 30 * GIB, "the instance itself had room for the refused 1 GiB");

    // A cap larger than the instance is the instance's size (another ledger, the 1g.10gb).
    let b = on(&env, &m1.uuid_string(), "100G", &["init", "primary", "info", "total"]).env("FGPU_LEDGER", env.dir.join("other.ledger")).success();
    assert_eq!((number(&b.line("info"), "total"), number(&b.line("total"), "total")), (m1.memory(), m1.memory()), "{b}");
    assert_eq!(m1.memory(), 9984 * MIB, "the guide's 1g.10gb on an H100");

    // NVML under the shim, in A's ledger: the MIG device's handle shows the cap and what the
    // ledger's process holds there, with its GPU and compute instance; the other instance
    // (another ledger's) and the GPU itself show the cap and nothing of A's.
    if let Some(python) = python_with("pynvml") {
        let run = env.command(&python).arg(workspace().join("tests/python/mig_memory.py")).shim().limit("4G").success();
        let seen: Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
        let by_uuid = |u: &str| seen.as_array().unwrap().iter().find(|d| d["uuid"] == u).cloned().unwrap_or_else(|| panic!("no {u} in {seen}"));
        let mine = by_uuid(&m3.uuid_string());
        assert_eq!(mine["v1"], serde_json::json!([4 * GIB, held, 4 * GIB - held]), "nvmlDeviceGetMemoryInfo on the MIG device: {mine}");
        assert_eq!(mine["v2"], serde_json::json!([4 * GIB, 0, held, 4 * GIB - held]), "_v2: {mine}");
        assert_eq!(mine["procs"], serde_json::json!([[a.pid(), held, gi3, 0]]), "its process list: {mine}");
        let other = by_uuid(&m1.uuid_string());
        assert_eq!((&other["v1"], &other["procs"]), (&serde_json::json!([4 * GIB, 0, 4 * GIB]), &serde_json::json!([])), "{other}");
        let parent = by_uuid(&sim.device_uuid_string(0));
        assert_eq!((&parent["v1"], &parent["procs"]), (&serde_json::json!([4 * GIB, 0, 4 * GIB]), &serde_json::json!([])), "the GPU: {parent}");
    }

    // The real nvidia-smi inside: its table of MIG devices shows the cap and the use.
    if let Some(smi) = provided_path("FGPU_TEST_NVIDIA_SMI", "the real nvidia-smi from scripts/get-nvidia-smi.sh") {
        let run = env.command(&smi).shim().limit("4G").success();
        let rows = squeezed(&run.stdout());
        let want = format!("| 0 {gi3} 0 {} | {}MiB / 4096MiB |", m3.index, held / MIB);
        assert!(rows.iter().any(|r| r.starts_with(&want)), "nvidia-smi's MIG row {want:?}\n{run}");
        let other = format!("| 0 {} 0 {} | 0MiB / 4096MiB |", m1.gpu_instance.id, m1.index);
        assert!(rows.iter().any(|r| r.starts_with(&other)), "the other instance: {other:?}\n{run}");
        assert!(rows.iter().any(|r| r.contains("| 0MiB / 4096MiB |")), "the GPU's own row\n{run}");
    }

    // fgpu status names the instance by its MIG- UUID.
    let status = env.command(fgpu_bin()).args(["status", "--ledger"]).arg(&env.ledger).success();
    assert!(status.stdout().contains(&m3.uuid_string()), "{status}");
    assert!(!status.stdout().contains(&format!("GPU-{}", &m3.uuid_string()[4..])), "{status}");
    a.finish();
}

#[test]
fn mig_instances_and_a_gpu_beside_them_keep_their_own_caps_in_one_ledger() {
    // GPU 0 in MIG mode with two 3g.40gb instances, GPU 1 a whole H100 (a GPU in MIG mode
    // has no whole-GPU CUDA device, so the GPU beside the instances is another one).
    let (env, sim) = h100s("mig-caps-keys", 2, 0b01);
    let (x, y) = (carve(&sim, 0, PROFILE_3G), carve(&sim, 0, PROFILE_3G));
    let gpu1 = sim.device_uuid_string(1);
    let context = sim.context_overhead();
    // Prefix keys, checked against every GPU and MIG device NVML lists.
    let limit = format!("{}=2G,{}=3G,*=5G", &x.uuid_string()[..12], &y.uuid_string()[..12]);
    let hold = |device: &str, args: &[&str]| {
        let mut args: Vec<&str> = ["init", "primary", "total"].iter().chain(args).copied().collect();
        args.push("hold");
        let mut p = on(&env, device, &limit, &args).spawn();
        p.wait_for("holding");
        p
    };
    // Two processes share instance x's 2 GiB; y and the GPU each have their own cap.
    let mut x1 = hold(&x.uuid_string(), &["alloc", "1G"]);
    let mut x2 = hold(&x.uuid_string(), &["alloc", "1G", "alloc", "256M"]);
    let mut y1 = hold(&y.uuid_string(), &["alloc", "2G", "alloc", "1G"]);
    let mut g1 = hold(&gpu1, &["alloc", "4G", "alloc", "1G"]);
    let allocs = |p: &Background| p.lines.iter().filter(|l| l.starts_with("alloc")).map(|l| l.rsplit(' ').next().unwrap().to_string()).collect::<Vec<_>>();
    let total = |p: &Background| number(p.lines.iter().find(|l| l.starts_with("total")).unwrap(), "total");
    assert_eq!((total(&x1), total(&x2), total(&y1), total(&g1)), (2 * GIB, 2 * GIB, 3 * GIB, 5 * GIB), "each device's own cap");
    assert_eq!(allocs(&x1), ["rc=0"]);
    assert_eq!(allocs(&x2), ["rc=2", "rc=0"], "x's cap is shared: 1 GiB more does not fit beside x1, 256 MiB does");
    assert_eq!(allocs(&y1), ["rc=0", "rc=2"], "y's 3 GiB: its context and 2 GiB, not 1 more");
    assert_eq!(allocs(&g1), ["rc=0", "rc=2"], "the GPU's 5 GiB");

    // The ledger: three entries, printed as NVML prints them, each used as the driver says.
    let truth = [
        (x.uuid_string(), 2 * GIB, sim.gpu_instance_used(0, x.gpu_instance.id)),
        (y.uuid_string(), 3 * GIB, sim.gpu_instance_used(0, y.gpu_instance.id)),
        (gpu1.clone(), 5 * GIB, sim.device_used(1)),
    ];
    assert_eq!(truth.iter().map(|t| t.2).collect::<Vec<_>>(), [2 * context + GIB + 256 * MIB, context + 2 * GIB, context + 4 * GIB], "ground truth");
    let ledger = env.ledger();
    let mut seen: Vec<(String, u64, u64)> = ledger.snapshot(None).devices.iter().map(|d| (d.uuid_string(), d.cap, d.used)).collect();
    seen.sort();
    let mut want = truth.to_vec();
    want.sort();
    assert_eq!(seen, want);
    let status = env.command(fgpu_bin()).args(["status", "--ledger"]).arg(&env.ledger).success();
    for (uuid, _, _) in &truth {
        assert!(status.stdout().contains(uuid.as_str()), "{uuid}\n{status}");
    }
    for p in [&mut x1, &mut x2, &mut y1, &mut g1] {
        p.finish();
    }
}

/// What each process got of its MIG device's timeline over `WINDOW`.
const WINDOW: Duration = Duration::from_secs(10);

#[test]
fn a_share_holds_inside_a_mig_instance_beside_a_busy_loop_per_core() {
    let (env, sim) = h100s("mig-caps-share", 1, 1);
    let (a, b) = (carve(&sim, 0, PROFILE_3G), carve(&sim, 0, PROFILE_3G));
    let _busy = BusyLoops::one_per_cpu();
    let load = |device: &MigDevice, ledger: &str, share: Option<&str>| {
        let mut cmd = env.command(client("compute_load")).env("CUDA_VISIBLE_DEVICES", device.uuid_string()).env("FGPU_LEDGER", env.dir.join(ledger));
        if let Some(share) = share {
            cmd = cmd.shim().env("FGPU_COMPUTE", share);
        }
        let mut p = cmd.spawn();
        p.wait_for("ready");
        p
    };
    // Alone in instance a at 25 %; in instance b, one at 30 % beside an uncapped one.
    let alone = load(&a, "a.ledger", Some("25%"));
    let shared = load(&b, "b.ledger", Some("30%"));
    let uncapped = load(&b, "c.ledger", None);
    std::thread::sleep(Duration::from_millis(500));
    let from = now_ns();
    std::thread::sleep(WINDOW);
    let to = now_ns();
    let (wa, wb) = (sim.mig_device_busy(0, a.gpu_instance.id, 0, from, to).unwrap(), sim.mig_device_busy(0, b.gpu_instance.id, 0, from, to).unwrap());
    assert!(wa.complete && wb.complete, "the timelines' history covers the window");
    let got = |w: &fgpu_sim_state::BusyWindow, p: &Background| w.share_of_pid(p.pid()) * 100.0;
    let (a25, b30, b_free) = (got(&wa, &alone), got(&wb, &shared), got(&wb, &uncapped));
    println!("over {:.2} s: alone at 25 %: {a25:.2} %; at 30 % beside an uncapped one: {b30:.2} % and {b_free:.2} %", (to - from) as f64 / 1e9);
    assert_eq!(sim.device_busy(0, from, to).device_busy_ns, 0, "nothing ran on the GPU's own timeline");
    assert!((22.0..=28.0).contains(&a25), "alone in its instance at 25 %: {a25:.2} %");
    // Events measure: the neighbour's time slices are in them, so the share is a ceiling
    // that holds the process below it (as on a whole GPU measured by events).
    assert!((10.0..=33.0).contains(&b30), "at 30 % beside an uncapped process in its instance: {b30:.2} %");
    assert!(b_free >= 65.0, "the uncapped process gets the rest: {b_free:.2} %");
}

#[test]
fn a_share_that_cannot_be_measured_inside_a_mig_instance_is_refused() {
    let (env, sim) = h100s("mig-caps-refused", 1, 1);
    let m = carve(&sim, 0, PROFILE_1G);
    // The driver cannot say whether the stream is being captured, so no marker is recorded,
    // and NVML gives no per-process samples on a MIG device: nothing can measure the share.
    let from = now_ns();
    let run = env
        .command(client("compute_load"))
        .args(["--seconds", "3", "--us", "20000"])
        .shim()
        .env("FGPU_COMPUTE", "30%")
        .env("CUDA_VISIBLE_DEVICES", m.uuid_string())
        .env("FGPU_SIM_FAIL", "cuStreamIsCapturing")
        .run();
    let busy = sim.mig_device_busy(0, m.gpu_instance.id, 0, from, now_ns()).unwrap();
    assert!(run.stdout().contains("error rc=800"), "a launch is refused with CUDA_ERROR_NOT_PERMITTED\n{run}");
    let stderr = run.stderr();
    let refused: Vec<&str> = stderr.lines().filter(|l| l.contains("cannot be measured")).collect();
    assert_eq!(refused.len(), 1, "one line says why\n{run}");
    assert!(refused[0].contains(&m.uuid_string()), "{}", refused[0]);
    // Ground truth: one 20 ms kernel went to the instance, with no marker (its time unknown
    // to fgpu), and nothing after it; the process ended while it ran, so at most its 20 ms
    // are on the timeline (a context torn down stops its work).
    let submitted = sim.items_submitted(m.timeline(), run_pid(&run));
    assert_eq!((submitted.kernels, submitted.markers), (1, 0), "{run}");
    assert!(busy.device_busy_ns <= 20_000_000, "ground truth: {busy:?}\n{run}");
}

/// The PID a finished `compute_load` printed (`ready pid=N`).
fn run_pid(run: &Run) -> u32 {
    number(&run.line("ready"), "pid") as u32
}
