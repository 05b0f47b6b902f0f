//! The simulated driver's MIG against NVIDIA's documentation, with NVIDIA's own client as
//! the judge: the profiles and placements of each product against the MIG user guide's
//! tables (transcribed here, apart from the simulator's code), the real `nvidia-smi` (535)
//! printing the guide's rows and carving instances, pynvml driving modes, instances and
//! their errors, CUDA seeing a MIG device, and pynvml's list calls holding their two-call
//! pattern while processes come and go.

use fgpu_sim_state::{mig::Product, SimConfig, SimState};
use fgpu_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NVML_ERROR_NOT_SUPPORTED: i64 = 3;
const NVML_ERROR_NO_PERMISSION: i64 = 4;
const NVML_ERROR_NOT_FOUND: i64 = 6;
const NVML_ERROR_RESET_REQUIRED: i64 = 16;
const NVML_ERROR_IN_USE: i64 = 19;
const NVML_ERROR_INSUFFICIENT_RESOURCES: i64 = 23;

/// A test directory whose simulated GPUs are `devices` of `product`, those of `mig` (a bit
/// per GPU) in MIG mode: the state file is made here, so every later process opens it.
fn mig_env(name: &str, product: Product, mig: u32, devices: u32) -> (Env, SimState) {
    let env = Env::new(name);
    let sim = SimState::open_with(&env.sim_state, &SimConfig { devices, product, mig, ..SimConfig::default() }).unwrap();
    (env, sim)
}

fn python() -> Option<PathBuf> {
    python_with("pynvml")
}

fn script(name: &str) -> PathBuf {
    workspace().join("tests/python").join(name)
}

/// `mig_probe.py` steps: one JSON object per step.
fn probe(env: &Env, python: &Path, steps: &[&str]) -> Vec<Value> {
    let run = env.command(python).arg(script("mig_probe.py")).args(steps).env("PYTHONDONTWRITEBYTECODE", "1").success();
    run.stdout().lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{run}"))).collect()
}

fn rc(v: &Value) -> i64 {
    v["rc"].as_i64().unwrap_or_else(|| panic!("no rc in {v}"))
}

// ---- the guide's tables, transcribed ----

/// One row of a "GPU Instance Profiles on ..." table of the MIG user guide ("Supported MIG
/// Profiles"), with what the guide's `nvidia-smi mig -lgip` and `-lgipp` examples print for
/// it: profile ID, memory in GiB as printed, SMs, placements.
struct GuideRow {
    name: &'static str,
    /// Fraction of memory, in eighths (1/8 is 1, 1/4 and 2/8 are 2, 4/8 is 4, Full is 8).
    memory_eighths: u32,
    /// Fraction of SMs, in sevenths.
    sm_sevenths: u32,
    nvdec: u32,
    jpeg: u32,
    ofa: u32,
    copy_engines: u32,
    instances: u32,
    id: u32,
    gib: &'static str,
    sms: u32,
    starts: &'static [u32],
}

#[rustfmt::skip]
#[allow(clippy::too_many_arguments)] // one argument per column of the guide's table
const fn row(name: &'static str, memory_eighths: u32, sm_sevenths: u32, nvdec: u32, jpeg: u32, ofa: u32, copy_engines: u32, instances: u32, id: u32, gib: &'static str, sms: u32, starts: &'static [u32]) -> GuideRow {
    GuideRow { name, memory_eighths, sm_sevenths, nvdec, jpeg, ofa, copy_engines, instances, id, gib, sms, starts }
}

/// The guide's A100 table (its names for A100-SXM4-80GB); memory and SMs as `nvidia-smi mig
/// -lgip` prints them on an A100-SXM4-80GB.
#[rustfmt::skip]
const A100_80GB: [GuideRow; 7] = [
    row("1g.10gb", 1, 1, 0, 0, 0, 1, 7, 19, "9.50", 14, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.10gb+me", 1, 1, 1, 1, 1, 1, 1, 20, "9.50", 14, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.20gb", 2, 1, 1, 0, 0, 1, 4, 15, "19.50", 14, &[0, 2, 4, 6]),
    row("2g.20gb", 2, 2, 1, 0, 0, 2, 3, 14, "19.50", 28, &[0, 2, 4]),
    row("3g.40gb", 4, 3, 2, 0, 0, 3, 2, 9, "39.25", 42, &[0, 4]),
    row("4g.40gb", 4, 4, 2, 0, 0, 4, 1, 5, "39.25", 56, &[0]),
    row("7g.80gb", 8, 7, 5, 1, 1, 7, 1, 0, "79.00", 98, &[0]),
];

/// The guide's H100 table; memory and SMs as `nvidia-smi mig -lgip` prints them on an
/// H100 80GB HBM3.
#[rustfmt::skip]
const H100_80GB: [GuideRow; 7] = [
    row("1g.10gb", 1, 1, 1, 1, 0, 1, 7, 19, "9.75", 16, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.10gb+me", 1, 1, 1, 1, 1, 1, 1, 20, "9.75", 16, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.20gb", 2, 1, 1, 1, 0, 1, 4, 15, "19.62", 26, &[0, 2, 4, 6]),
    row("2g.20gb", 2, 2, 2, 2, 0, 2, 3, 14, "19.62", 32, &[0, 2, 4]),
    row("3g.40gb", 4, 3, 3, 3, 0, 3, 2, 9, "39.50", 60, &[0, 4]),
    row("4g.40gb", 4, 4, 4, 4, 0, 4, 1, 5, "39.50", 64, &[0]),
    row("7g.80gb", 8, 7, 7, 7, 1, 8, 1, 0, "79.25", 132, &[0]),
];

/// The guide's H200 table; memory and SMs as printed on an H200 where published (1g.18gb
/// 16.00, 2g.35gb 32.50, 7g.141gb 140.00 GiB; 3g.71gb 60 and 4g.71gb 64 SMs), the rest the
/// simulator's stated choices (docs/simulator.md).
#[rustfmt::skip]
const H200_141GB: [GuideRow; 7] = [
    row("1g.18gb", 1, 1, 1, 1, 0, 1, 7, 19, "16.00", 16, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.18gb+me", 1, 1, 1, 1, 1, 1, 1, 20, "16.00", 16, &[0, 1, 2, 3, 4, 5, 6]),
    row("1g.35gb", 2, 1, 1, 1, 0, 1, 4, 15, "32.50", 26, &[0, 2, 4, 6]),
    row("2g.35gb", 2, 2, 2, 2, 0, 2, 3, 14, "32.50", 32, &[0, 2, 4]),
    row("3g.71gb", 4, 3, 3, 3, 0, 3, 2, 9, "69.88", 60, &[0, 4]),
    row("4g.71gb", 4, 4, 4, 4, 0, 4, 1, 5, "69.88", 64, &[0]),
    row("7g.141gb", 8, 7, 7, 7, 1, 8, 1, 0, "140.00", 132, &[0]),
];

/// Compute instance profiles the guide's `nvidia-smi mig -lcip` examples list for an A100
/// 3g and 4g GPU instance: (name suffix, profile ID, instances, SMs, default).
const A100_3G_CIS: [(&str, u32, u32, u32); 3] = [("1c.3g", 0, 3, 14), ("2c.3g", 1, 1, 28), ("3g", 2, 1, 42)];
const A100_4G_CIS: [(&str, u32, u32, u32); 3] = [("1c.4g", 0, 4, 14), ("2c.4g", 1, 2, 28), ("4g", 3, 1, 56)];

/// GiB as `nvidia-smi mig -lgip` prints a profile's memory (MiB / 1024, two decimals).
fn gib(mib: u64) -> String {
    format!("{:.2}", mib as f64 / 1024.0)
}

#[test]
fn every_products_profiles_and_placements_are_the_guides() {
    let Some(python) = python() else { return };
    for (product, table) in [(Product::A100_80GB, &A100_80GB), (Product::H100_80GB, &H100_80GB), (Product::H200_141GB, &H200_141GB)] {
        let (env, _sim) = mig_env(&format!("mig-profiles-{}", product.key()), product, 1, 1);
        let out = probe(&env, &python, &["mode", "profiles"]);
        assert_eq!(out[0]["mode"], serde_json::json!([1, 1]), "{product:?}: {}", out[0]);
        assert_eq!(out[0]["max_mig"], 7, "{}", out[0]);
        let gis: Vec<&Value> = out[1]["gi"].as_array().unwrap().iter().filter(|p| rc(p) == 0).collect();
        assert_eq!(gis.len(), table.len(), "{product:?}: one profile per row of the guide's table\n{}", out[1]);
        for want in table {
            let got = gis.iter().find(|p| p["id"] == want.id).unwrap_or_else(|| panic!("{product:?}: no profile {} (ID {})", want.name, want.id));
            let mib = got["memory_mib"].as_u64().unwrap();
            let starts: Vec<u64> = got["placements"].as_array().unwrap().iter().map(|p| p[0].as_u64().unwrap()).collect();
            let sizes: Vec<u64> = got["placements"].as_array().unwrap().iter().map(|p| p[1].as_u64().unwrap()).collect();
            let what = format!("{product:?} {}: {got}", want.name);
            assert_eq!(got["name"], format!("MIG {}", want.name), "{what}");
            assert_eq!(got["slices"], want.sm_sevenths, "SMs {}/7: {what}", want.sm_sevenths);
            assert!(sizes.iter().all(|&s| s == want.memory_eighths as u64), "memory {}/8 of the slices: {what}", want.memory_eighths);
            assert_eq!(starts, want.starts.iter().map(|&s| s as u64).collect::<Vec<_>>(), "placements: {what}");
            let engines = (&got["dec"], &got["jpeg"], &got["ofa"], &got["ce"], &got["enc"], &got["count"], &got["capacity"]);
            let guide = (want.nvdec, want.jpeg, want.ofa, want.copy_engines, 0, want.instances, want.instances);
            assert_eq!(
                engines,
                (&guide.0.into(), &guide.1.into(), &guide.2.into(), &guide.3.into(), &guide.4.into(), &guide.5.into(), &guide.6.into()),
                "NVDEC, JPEG, OFA, CE, ENC, instances, capacity: {what}"
            );
            assert_eq!((gib(mib), got["sms"].as_u64().unwrap()), (want.gib.to_string(), want.sms as u64), "-lgip memory and SMs: {what}");
        }
        // Compute instances: every GPU instance offers 1c in each of its compute slices and
        // the profile as large as itself (named after it, with all its SMs, the default).
        for want in table {
            let cis = out[1]["ci"][want.id.to_string()].as_array().unwrap_or_else(|| panic!("{product:?} {}: {}", want.name, out[1]["ci"]));
            let one = cis.iter().find(|c| c["id"] == 0).unwrap();
            assert_eq!((&one["count"], &one["slices"]), (&want.sm_sevenths.into(), &1.into()), "{product:?} {}: {one}", want.name);
            let whole = cis.iter().find(|c| c["slices"] == want.sm_sevenths).unwrap();
            assert_eq!((&whole["name"], &whole["sms"], &whole["count"]), (&format!("MIG {}", want.name).into(), &want.sms.into(), &1.into()), "{whole}");
        }
        if product == Product::A100_80GB {
            for (gi, wanted) in [("9", &A100_3G_CIS), ("5", &A100_4G_CIS)] {
                let got: Vec<(String, u64, u64, u64)> = out[1]["ci"][gi]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| (c["name"].as_str().unwrap().to_string(), c["id"].as_u64().unwrap(), c["count"].as_u64().unwrap(), c["sms"].as_u64().unwrap()))
                    .collect();
                let want: Vec<(String, u64, u64, u64)> =
                    wanted.iter().map(|(n, id, count, sms)| (format!("MIG {n}.40gb"), *id as u64, *count as u64, *sms as u64)).collect();
                assert_eq!(got, want, "A100 -lcip of profile {gi}");
            }
        }
    }
}

// ---- nvidia-smi ----

fn nvidia_smi() -> Option<PathBuf> {
    provided_path("FGPU_TEST_NVIDIA_SMI", "the real nvidia-smi from scripts/get-nvidia-smi.sh")
}

/// The lines of `text` with runs of spaces squeezed, blank lines dropped.
fn squeezed(text: &str) -> Vec<String> {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|l| !l.is_empty()).collect()
}

fn smi(env: &Env, smi: &Path, args: &[&str]) -> Run {
    env.command(smi).args(args).run()
}

/// Asserts that `run` printed `want` (squeezed lines) in order, each line found after the
/// previous one.
fn printed(run: &Run, want: &[&str]) {
    let got = squeezed(&run.stdout());
    let mut at = 0;
    for w in want {
        let w = w.split_whitespace().collect::<Vec<_>>().join(" ");
        match got[at..].iter().position(|g| *g == w) {
            Some(k) => at += k + 1,
            None => panic!("nvidia-smi did not print {w:?} (after line {at})\n{run}"),
        }
    }
}

/// The rows `nvidia-smi mig -lgip` prints for a table: two lines per profile.
fn lgip_rows(table: &[GuideRow]) -> Vec<String> {
    table
        .iter()
        .flat_map(|r| {
            let first = format!("| 0 MIG {} {} {}/{} {} No {} {} 0 |", r.name, r.id, r.instances, r.instances, r.gib, r.sms, r.nvdec);
            let second = format!("| {} {} {} |", r.copy_engines, r.jpeg, r.ofa);
            [first, second]
        })
        .collect()
}

/// The guide's `nvidia-smi mig -lgipp`, the same on all three products.
const LGIPP: [&str; 7] = [
    "GPU 0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1",
    "GPU 0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1",
    "GPU 0 Profile ID 15 Placements: {0,2,4,6}:2",
    "GPU 0 Profile ID 14 Placements: {0,2,4}:2",
    "GPU 0 Profile ID 9 Placements: {0,4}:4",
    "GPU 0 Profile ID 5 Placement : {0}:4",
    "GPU 0 Profile ID 0 Placement : {0}:8",
];

#[test]
fn nvidia_smi_prints_the_guides_rows_and_carves_an_a100() {
    let Some(smi_path) = nvidia_smi() else { return };
    let (env, sim) = mig_env("mig-smi-a100", Product::A100_80GB, 1, 1);
    let gpu = sim.device_uuid_string(0);
    let s = |args: &[&str]| smi(&env, &smi_path, args);

    let list = s(&["-L"]);
    printed(&list, &[&format!("GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpu})")]);
    let lgip = s(&["mig", "-lgip"]);
    println!("nvidia-smi mig -lgip, simulated A100-SXM4-80GB:\n{}", lgip.stdout());
    let rows = lgip_rows(&A100_80GB);
    printed(&lgip, &rows.iter().map(String::as_str).collect::<Vec<_>>());
    printed(&s(&["mig", "-lgipp"]), &LGIPP);

    // The guide's example: two 3g instances, profile ID and name, with their default
    // compute instances; the first goes to 4:4 (instance 2), the second to 0:4 (instance 1).
    let made = s(&["mig", "-cgi", "9,3g.40gb", "-C"]);
    printed(
        &made,
        &[
            "Successfully created GPU instance ID 2 on GPU 0 using profile MIG 3g.40gb (ID 9)",
            "Successfully created compute instance ID 0 on GPU 0 GPU instance ID 2 using profile MIG 3g.40gb (ID 2)",
            "Successfully created GPU instance ID 1 on GPU 0 using profile MIG 3g.40gb (ID 9)",
            "Successfully created compute instance ID 0 on GPU 0 GPU instance ID 1 using profile MIG 3g.40gb (ID 2)",
        ],
    );
    printed(&s(&["mig", "-lgi"]), &["| 0 MIG 3g.40gb 9 1 0:4 |", "| 0 MIG 3g.40gb 9 2 4:4 |"]);
    printed(&s(&["mig", "-lci"]), &["| 0 1 MIG 3g.40gb 2 0 0:3 |", "| 0 2 MIG 3g.40gb 2 0 0:3 |"]);
    printed(&s(&["mig", "-lgip"]), &["| 0 MIG 1g.10gb 19 0/7 9.50 No 14 0 0 |", "| 0 MIG 3g.40gb 9 0/2 39.25 No 42 2 0 |"]);
    let migs = sim.mig_devices(0);
    printed(
        &s(&["-L"]),
        &[
            &format!("GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpu})"),
            &format!("MIG 3g.40gb Device 0: (UUID: {})", migs[0].uuid_string()),
            &format!("MIG 3g.40gb Device 1: (UUID: {})", migs[1].uuid_string()),
        ],
    );
    // nvidia-smi's own table of MIG devices: memory, BAR1, SMs and shared engines.
    printed(&s(&[]), &["| 0 1 0 0 | 0MiB / 40192MiB | 42 0 | 3 0 2 0 0 |", "| 0 2 0 1 | 0MiB / 40192MiB | 42 0 | 3 0 2 0 0 |"]);
    // Compute instances first, as the guide says.
    let refused = s(&["mig", "-dgi"]);
    assert_eq!(refused.output.status.code(), Some(NVML_ERROR_IN_USE as i32), "{refused}");
    printed(&refused, &["Unable to destroy GPU instance ID 1 from GPU 0: In use by another client"]);
    printed(
        &s(&["mig", "-dci"]),
        &[
            "Successfully destroyed compute instance ID 0 from GPU 0 GPU instance ID 1",
            "Successfully destroyed compute instance ID 0 from GPU 0 GPU instance ID 2",
        ],
    );
    printed(&s(&["mig", "-dgi"]), &["Successfully destroyed GPU instance ID 1 from GPU 0", "Successfully destroyed GPU instance ID 2 from GPU 0"]);
    assert_eq!(sim.gpu_instances(0), Ok(Vec::new()), "the ground truth has no instance left");

    // Enabling MIG on an Ampere GPU waits for a GPU reset.
    let (env, sim) = mig_env("mig-smi-a100-mode", Product::A100_80GB, 0, 1);
    let enable = smi(&env, &smi_path, &["-i", "0", "-mig", "1"]);
    printed(&enable, &["Warning: MIG mode is in pending enable state for GPU 00000000:18:00.0:GPU requires reset"]);
    assert_eq!(sim.mig_mode(0), Ok((false, true)), "{enable}");
    sim.reset_gpu(0).unwrap();
    printed(&smi(&env, &smi_path, &["--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"]), &["Enabled, Enabled"]);
}

#[test]
fn nvidia_smi_prints_the_guides_rows_and_carves_an_h100() {
    let Some(smi_path) = nvidia_smi() else { return };
    let (env, sim) = mig_env("mig-smi-h100", Product::H100_80GB, 0, 1);
    let s = |args: &[&str]| smi(&env, &smi_path, args);
    printed(&s(&["mig", "-lgip"]), &["No MIG-enabled devices found."]);
    // Hopper enables MIG without a reset.
    printed(&s(&["-i", "0", "-mig", "1"]), &["Enabled MIG Mode for GPU 00000000:18:00.0", "All done."]);
    let lgip = s(&["mig", "-lgip"]);
    println!("nvidia-smi mig -lgip, simulated H100 80GB HBM3:\n{}", lgip.stdout());
    let rows = lgip_rows(&H100_80GB);
    printed(&lgip, &rows.iter().map(String::as_str).collect::<Vec<_>>());
    printed(&s(&["mig", "-lgipp"]), &LGIPP);

    // An H100's seven 1g instances, in the order a real one creates them.
    let made = s(&["mig", "-cgi", "19,19,19,19,19,19,19", "-C"]);
    let ids: Vec<String> = made.lines("Successfully created GPU instance ID").iter().map(|l| l.split_whitespace().nth(5).unwrap().to_string()).collect();
    assert_eq!(ids, ["13", "11", "12", "7", "8", "9", "10"], "{made}");
    let lgi: Vec<String> = (0..7).map(|k| format!("| 0 MIG 1g.10gb 19 {} {k}:1 |", 7 + k)).collect();
    printed(&s(&["mig", "-lgi"]), &lgi.iter().map(String::as_str).collect::<Vec<_>>());
    let lci: Vec<String> = (7..14).map(|gi| format!("| 0 {gi} MIG 1g.10gb 0 0 0:1 |")).collect();
    printed(&s(&["mig", "-lci"]), &lci.iter().map(String::as_str).collect::<Vec<_>>());
    let full = s(&["mig", "-cgi", "9"]);
    printed(&full, &["Unable to create a GPU instance on GPU 0 using profile 9: Insufficient Resources"]);
    let dci: Vec<String> = (7..14).map(|gi| format!("Successfully destroyed compute instance ID 0 from GPU 0 GPU instance ID {gi}")).collect();
    printed(&s(&["mig", "-dci"]), &dci.iter().map(String::as_str).collect::<Vec<_>>());
    let dgi: Vec<String> = (7..14).map(|gi| format!("Successfully destroyed GPU instance ID {gi} from GPU 0")).collect();
    printed(&s(&["mig", "-dgi"]), &dgi.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(sim.gpu_instances(0), Ok(Vec::new()));
    // Hopper forgets MIG mode at a reboot.
    sim.reboot().unwrap();
    printed(&s(&["--query-gpu=mig.mode.current", "--format=csv,noheader"]), &["Disabled"]);
}

// ---- pynvml: modes, errors, MIG devices ----

/// A process holding a context (and 1 GiB) on device 0 as CUDA enumerates it, until
/// finished.
fn holder(env: &Env, visible: Option<&str>) -> Background {
    let mut cmd = env.client(&["init", "primary", "alloc", "1G", "hold"]);
    if let Some(v) = visible {
        cmd = cmd.env("CUDA_VISIBLE_DEVICES", v);
    }
    let mut b = cmd.spawn();
    b.wait_for("holding");
    b
}

#[test]
fn instances_and_modes_answer_as_nvml_documents() {
    let Some(python) = python() else { return };
    // Hopper: IN_USE while a process holds the GPU, at once when none does.
    let (env, sim) = mig_env("mig-modes-h100", Product::H100_80GB, 0, 1);
    let mut busy = holder(&env, None);
    let out = probe(&env, &python, &["setmode", "1", "mode"]);
    assert_eq!((rc(&out[0]), &out[0]["activation"]), (0, &NVML_ERROR_IN_USE.into()), "{}", out[0]);
    assert_eq!(out[1]["mode"], serde_json::json!([0, 1]), "pending while in use: {}", out[1]);
    busy.finish();
    let out = probe(&env, &python, &["setmode", "1", "mode", "parent"]);
    assert_eq!((rc(&out[0]), &out[0]["activation"]), (0, &0.into()), "{}", out[0]);
    assert_eq!(out[1]["mode"], serde_json::json!([1, 1]));
    // On a MIG-enabled GPU utilisation, samples and accounting are not supported.
    let parent = &out[2];
    assert_eq!((&parent["utilization_rc"], &parent["samples_rc"], &parent["accounting_rc"]), (&3.into(), &3.into(), &3.into()), "{parent}");
    assert_eq!(parent["accounting_mode"], 0, "{parent}");

    // Ampere: pending until a GPU reset.
    let (env_a, sim_a) = mig_env("mig-modes-a100", Product::A100_80GB, 0, 1);
    let out = probe(&env_a, &python, &["setmode", "1", "mode", "capacity", "19"]);
    assert_eq!(out[0]["activation"], NVML_ERROR_RESET_REQUIRED, "{}", out[0]);
    assert_eq!(out[1]["mode"], serde_json::json!([0, 1]));
    assert_eq!(rc(&out[2]), NVML_ERROR_NOT_SUPPORTED, "no MIG until the reset: {}", out[2]);
    sim_a.reset_gpu(0).unwrap();
    assert_eq!(probe(&env_a, &python, &["mode"])[0]["mode"], serde_json::json!([1, 1]));

    // Instances and their errors (the H100, now in MIG mode).
    let out = probe(
        &env,
        &python,
        &[
            "create", "9", "create", "19", "6", "create", "19", "0", "capacity", "19", "capacity", "9", "ci", "2", "2", "ci", "2", "1", "dgi", "2", "dgi", "3",
            "dci", "2", "5",
        ],
    );
    let rcs: Vec<i64> = out.iter().map(rc).collect();
    assert_eq!(
        rcs,
        [0, NVML_ERROR_INSUFFICIENT_RESOURCES, 0, 0, 0, 0, NVML_ERROR_INSUFFICIENT_RESOURCES, NVML_ERROR_IN_USE, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_FOUND],
        "{out:?}"
    );
    assert_eq!((&out[0]["gi"], &out[0]["start"], &out[0]["size"]), (&2.into(), &4.into(), &4.into()), "3g at 4:4 is instance 2: {}", out[0]);
    assert_eq!(out[2]["gi"], 7, "1g at 0:1 is instance 7: {}", out[2]);
    assert_eq!((&out[3]["capacity"], &out[4]["capacity"]), (&3.into(), &0.into()), "1g: 1, 2, 3 free; 3g: none");
    assert_eq!(sim.gpu_instances(0).unwrap().iter().map(|g| (g.id, g.start, g.size)).collect::<Vec<_>>(), [(2, 4, 4), (7, 0, 1)]);

    // A process on the MIG device keeps its compute instance (and GPU instance) alive.
    let mig = sim.mig_device(0, 2, 0).unwrap();
    let mut user = holder(&env, Some(&mig.uuid_string()));
    let out = probe(&env, &python, &["dci", "2", "0", "devices", "parent", "byuuid", &mig.uuid_string()]);
    assert_eq!(rc(&out[0]), NVML_ERROR_IN_USE, "{}", out[0]);
    let dev = &out[1]["devices"][0];
    let context = sim.context_overhead();
    let held = (1u64 << 30) + context;
    assert_eq!(
        (&dev["uuid"], &dev["gi"], &dev["ci"], &dev["is_mig"], &dev["parent_index"]),
        (&mig.uuid_string().into(), &2.into(), &0.into(), &1.into(), &0.into()),
        "{dev}"
    );
    assert_eq!(dev["name"], "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "{dev}");
    assert_eq!((dev["total"].as_u64(), dev["used"].as_u64(), dev["sms"].as_u64()), (Some(40448 << 20), Some(held), Some(60)), "{dev}");
    assert_eq!(dev["procs"], serde_json::json!([[user.pid(), held, 2, 0]]), "the MIG device's own processes: {dev}");
    assert_eq!(out[2]["procs"], serde_json::json!([[user.pid(), held, 2, 0]]), "the GPU's list names the instances: {}", out[2]);
    assert_eq!(out[2]["used"], held, "the GPU's memory is its instances' together: {}", out[2]);
    assert_eq!((&out[3]["is_mig"], &out[3]["gi"]), (&1.into(), &2.into()), "{}", out[3]);
    assert_eq!(sim.gpu_instance_used(0, 2), held, "ground truth");
    user.finish();
    let out = probe(&env, &python, &["dci", "2", "0", "ci", "2", "2"]);
    assert_eq!(out.iter().map(rc).collect::<Vec<_>>(), [0, 0]);
    let again = sim.mig_device(0, 2, 0).unwrap();
    assert_ne!(again.uuid_string(), mig.uuid_string(), "a new MIG UUID at each creation");

    // Creating and destroying need root or read access to the mig/config capability.
    if is_root() && tool("setpriv") {
        let cap = fgpu_sim_state::mig_config_capability_path(&env.sim_state);
        let as_nobody = |steps: &[&str]| {
            let run = env.command_as(65534, &python).arg(script("mig_probe.py")).args(steps).env("PYTHONDONTWRITEBYTECODE", "1").success();
            run.stdout().lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect::<Vec<_>>()
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&env.sim_state, std::fs::Permissions::from_mode(0o666)).unwrap();
        let refused = as_nobody(&["create", "19", "setmode", "0"]);
        assert_eq!(refused.iter().map(rc).collect::<Vec<_>>(), [NVML_ERROR_NO_PERMISSION, NVML_ERROR_NO_PERMISSION], "{refused:?}");
        std::fs::set_permissions(&cap, std::fs::Permissions::from_mode(0o444)).unwrap();
        let granted = as_nobody(&["create", "19"]);
        assert_eq!(rc(&granted[0]), 0, "read access to mig/config grants it: {}", granted[0]);
    } else {
        prerequisite(false, "root and setpriv, to run pynvml as another user");
    }
}

// ---- CUDA on a MIG device ----

fn cuda_steps(env: &Env, python: &Path, visible: Option<&str>, steps: &[&str]) -> Background {
    let mut cmd = env.command(python).arg(script("mig_cuda.py")).args(steps).env("PYTHONDONTWRITEBYTECODE", "1");
    if let Some(v) = visible {
        cmd = cmd.env("CUDA_VISIBLE_DEVICES", v);
    }
    cmd.spawn()
}

fn json_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn cuda_sees_a_mig_device_with_its_memory_name_sms_uuid_and_timeline() {
    let Some(python) = python() else { return };
    let (env, sim) = mig_env("mig-cuda", Product::H100_80GB, 1, 1);
    let big = sim.create_gpu_instance(0, 9, None).unwrap();
    sim.create_compute_instance(0, big.id, 2, None).unwrap();
    let small = sim.create_gpu_instance(0, 19, None).unwrap();
    sim.create_compute_instance(0, small.id, 0, None).unwrap();
    let (m3, m1) = (sim.mig_device(0, big.id, 0).unwrap(), sim.mig_device(0, small.id, 0).unwrap());
    let uuid_of = |m: &fgpu_sim_state::MigDevice| m.uuid_string()[4..].to_string();
    let gpu_uuid = sim.device_uuid_string(0)[4..].to_string();

    // Both run 300 ms of kernels at once, each on its own compute instance.
    let from = fgpu_sim_state::now_ns();
    let mut a = cuda_steps(
        &env,
        &python,
        Some(&m3.uuid_string()),
        &["info", "alloc", &(30u64 << 30).to_string(), "alloc", &(20u64 << 30).to_string(), "run", "300", "hold"],
    );
    let mut b = cuda_steps(&env, &python, Some(&format!("MIG-{}/{}/0", sim.device_uuid_string(0), small.id)), &["info", "run", "300", "hold"]);
    let info = json_line(&a.wait_for("{\"count\""));
    assert_eq!(info["count"], 1, "{info}");
    assert_eq!(info["name"], "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "{info}");
    assert_eq!((info["total_mem"].as_u64(), info["mem_total"].as_u64(), info["sms"].as_u64()), (Some(40448 << 20), Some(40448 << 20), Some(60)), "{info}");
    assert_eq!(
        (info["uuid"].as_str(), info["uuid_v2"].as_str()),
        (Some(gpu_uuid.as_str()), Some(uuid_of(&m3).as_str())),
        "v1 the GPU's, _v2 the MIG device's: {info}"
    );
    assert_eq!(info["free"].as_u64(), Some((40448 << 20) - sim.context_overhead()), "{info}");
    let first = json_line(&a.wait_for("{\"alloc\""));
    let second = json_line(&a.wait_for("{\"alloc\""));
    assert_eq!((&first["rc"], &second["rc"]), (&0.into(), &2.into()), "the GPU instance's memory is the limit: {first} {second}");
    let small_info = json_line(&b.wait_for("{\"count\""));
    assert_eq!((&small_info["name"], &small_info["sms"]), (&"NVIDIA H100 80GB HBM3 MIG 1g.10gb".into(), &16.into()), "{small_info}");
    assert_eq!(small_info["uuid_v2"].as_str(), Some(uuid_of(&m1).as_str()), "MIG-GPU-<uuid>/<gi>/<ci> names it too: {small_info}");
    a.wait_for("{\"ran_ms\"");
    b.wait_for("{\"ran_ms\"");
    let to = fgpu_sim_state::now_ns();
    let big_busy = sim.mig_device_busy(0, big.id, 0, from, to).unwrap();
    let small_busy = sim.mig_device_busy(0, small.id, 0, from, to).unwrap();
    let gpu_busy = sim.device_busy(0, from, to);
    println!(
        "busy: 3g {} ms, 1g {} ms, whole GPU {} ms, over {} ms",
        big_busy.device_busy_ns / 1_000_000,
        small_busy.device_busy_ns / 1_000_000,
        gpu_busy.device_busy_ns / 1_000_000,
        (to - from) / 1_000_000
    );
    assert_eq!(big_busy.busy_of_pid(a.pid()), 300_000_000, "its own timeline: {big_busy:?}");
    assert_eq!(small_busy.busy_of_pid(b.pid()), 300_000_000, "{small_busy:?}");
    assert_eq!(gpu_busy.device_busy_ns, 0, "nothing ran on the GPU's own timeline");
    // Its allocation, its context and its module (2 MiB).
    assert_eq!(sim.gpu_instance_used(0, big.id), (30u64 << 30) + sim.context_overhead() + (2 << 20), "ground truth");
    a.finish();
    b.finish();

    // Without CUDA_VISIBLE_DEVICES, CUDA enumerates the first MIG device only.
    let mut c = cuda_steps(&env, &python, None, &["info"]);
    let info = json_line(&c.wait_for("{\"count\""));
    assert_eq!((&info["count"], info["uuid_v2"].as_str()), (&1.into(), Some(uuid_of(&m3).as_str())), "{info}");
    c.finish();
}

// ---- the two-call pattern under churn ----

/// Short-lived processes running kernels on GPU 0, one started every 100 ms for `seconds`,
/// each living 1 s: samples, process lists and accounting change all the time. Returns how
/// many were started.
fn churn(env: &Env, seconds: u64, shim: bool) -> std::thread::JoinHandle<usize> {
    let commands: Vec<Cmd> = (0..seconds * 10)
        .map(|_| {
            let c = env.command(client("compute_load")).args(["--seconds", "1", "--us", "1000"]);
            if shim {
                c.shim().limit("8G")
            } else {
                c
            }
        })
        .collect();
    std::thread::spawn(move || {
        let mut started = Vec::new();
        for cmd in commands {
            started.push(cmd.spawn());
            std::thread::sleep(Duration::from_millis(100));
        }
        let n = started.len();
        for mut p in started {
            p.finish();
        }
        n
    })
}

#[test]
fn pynvml_list_calls_hold_while_processes_come_and_go() {
    let Some(python) = python() else { return };
    for shim in [false, true] {
        let env = Env::new(&format!("mig-churn-{shim}"));
        let spawner = churn(&env, 7, shim);
        std::thread::sleep(Duration::from_millis(500));
        let mut cmd = env.command(&python).arg(script("nvml_churn.py")).arg("5").env("PYTHONDONTWRITEBYTECODE", "1");
        if shim {
            cmd = cmd.shim().limit("8G");
        }
        let run = cmd.success();
        let started = spawner.join().unwrap();
        let report: Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
        let util = &report["process_utilization_all"];
        println!(
            "shim={shim}: {started} processes came and went; {} rounds of calls; samples named {} processes over {} timestamps",
            util["ok"],
            util["pids"].as_array().map_or(0, Vec::len),
            util["stamps"]
        );
        for (call, r) in report.as_object().unwrap() {
            assert_eq!(r["errors"], serde_json::json!({}), "shim={shim}: {call} failed its two-call pattern\n{run}");
            assert!(r["ok"].as_u64().unwrap() + r["not_found"].as_u64().unwrap() >= 100, "shim={shim}: {call} ran too few times\n{run}");
        }
        // The churn happened: many processes sampled, over many sample periods.
        assert!(util["pids"].as_array().unwrap().len() >= 15, "shim={shim}: {util}");
        assert!(util["stamps"].as_u64().unwrap() >= 15, "shim={shim}: {util}");
        assert!(report["compute_processes"]["pids"].as_array().unwrap().len() >= 15, "shim={shim}: {}", report["compute_processes"]);
    }
}
