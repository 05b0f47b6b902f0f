//! NVML under the shim: the real `nvidia-smi`, pynvml, gpustat, nvitop, C clients that link
//! or `dlopen` NVML, and CUDA and NVML agreeing, all against the simulated driver. Every
//! reader sees the container's GPU: total = the cap, used = what the ledger's processes
//! hold (contexts included), and only the ledger's processes, with PIDs as it sees them.
//!
//! The Python and `nvidia-smi` tests need what `tests/run.sh` installs: `FGPU_TEST_PYTHON`
//! (a venv with tests/python/requirements.txt) and `FGPU_TEST_NVIDIA_SMI` (the real binary,
//! from scripts/get-nvidia-smi.sh). Without them a test says "skipped", or fails under CI.

mod filtered;

use fgpu_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the simulated driver keeps for itself on each device (`fgpu_sim_state::DRIVER_RESERVED`).
const DRIVER_RESERVED: u64 = 32 * MIB;
/// The simulator's default context size, as the test environments set it.
const CONTEXT: u64 = 300 * MIB;
/// `nvmlMemory_v2`.
const NVML_MEMORY_V2: u64 = 0x0200_0028;
const NVML_SUCCESS: i64 = 0;
const NVML_ERROR_NOT_FOUND: i64 = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: i64 = 7;

// ---- tools and clients ----

/// A tool that tests/run.sh provides through `var`; None (after saying "skipped") when it
/// is missing outside CI.
pub(super) fn tool(var: &str, what: &str) -> Option<PathBuf> {
    provided_path(var, what)
}

pub(super) fn python() -> Option<PathBuf> {
    tool("FGPU_TEST_PYTHON", "a Python venv with tests/python/requirements.txt")
}

pub(super) fn nvidia_smi() -> Option<PathBuf> {
    tool("FGPU_TEST_NVIDIA_SMI", "the real nvidia-smi from scripts/get-nvidia-smi.sh")
}

/// Root-only tests: skipped outside CI, failed in CI (which runs as root).
pub(super) fn root() -> bool {
    prerequisite(is_root(), "needs root for unshare --pid")
}

/// A script from tests/python run by the venv's interpreter.
pub(super) fn py(env: &Env, python: &Path, script: &str) -> Cmd {
    env.command(python).arg(workspace().join("tests/python").join(script)).env("PYTHONDONTWRITEBYTECODE", "1")
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Variant {
    /// `dlopen("libnvidia-ml.so.1")` + `dlsym(handle, name)`.
    Dlsym,
    /// Linked with `-lnvidia-ml` (the simulated library), plain exported symbols.
    Linked,
    /// The stand-in `libnvidia-ml.so.1` (a directory to put on `LD_LIBRARY_PATH`).
    FakeLibrary,
}

/// Builds tests/clients/nvml_client.c (once per run, again when the source changes), the
/// way `fgpu_tests::client_with` builds cuclient.
pub(crate) fn nvml_client(variant: Variant) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = release_dir().join("test-clients");
    let out = match variant {
        Variant::Dlsym => dir.join("nvml_client"),
        Variant::Linked => dir.join("nvml_client-linked"),
        Variant::FakeLibrary => dir.join("fake-nvml").join("libnvidia-ml.so.1"),
    };
    let source = workspace().join("tests/clients/nvml_client.c");
    let fresh = out.exists() && out.metadata().unwrap().modified().unwrap() >= source.metadata().unwrap().modified().unwrap();
    if !fresh {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-Wall", "-o"]).arg(&out).arg(&source);
        match variant {
            Variant::Dlsym => {}
            Variant::Linked => {
                cc.arg("-DLINKED").arg(format!("-L{}", sim_lib_dir().display())).arg("-l:libnvidia-ml.so.1");
            }
            Variant::FakeLibrary => {
                cc.args(["-DFAKE_NVML", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"]);
            }
        }
        cc.arg("-ldl");
        Cmd(cc).success();
    }
    match variant {
        Variant::FakeLibrary => out.parent().unwrap().to_path_buf(),
        _ => out,
    }
}

/// The C NVML client in `env` with `ops`.
pub(super) fn nvml(env: &Env, variant: Variant, ops: &[&str]) -> Cmd {
    env.command(nvml_client(variant)).args(ops)
}

// ---- reading the answers ----

pub(super) fn num(run: &Run, prefix: &str, key: &str) -> u64 {
    run.field(prefix, key).parse().unwrap_or_else(|_| panic!("{key} of {prefix:?} is not a number\n{run}"))
}

/// `procs=PID:BYTES,...` of a client line, sorted.
pub(super) fn procs_field(line: &str) -> Vec<(u32, u64)> {
    let text = field(line, "procs").unwrap_or_default();
    let mut out: Vec<(u32, u64)> = text
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (pid, bytes) = e.split_once(':').unwrap();
            (pid.parse().unwrap(), bytes.parse().unwrap())
        })
        .collect();
    out.sort();
    out
}

/// `pids=PID,...` of a client line, sorted.
pub(super) fn pids_field(line: &str) -> Vec<u32> {
    let mut out: Vec<u32> = field(line, "pids").unwrap_or_default().split(',').filter(|e| !e.is_empty()).map(|e| e.parse().unwrap()).collect();
    out.sort();
    out
}

pub(super) fn json(run: &Run) -> Value {
    let line = run.stdout().lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON output\n{run}")).to_string();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad JSON ({e})\n{run}"))
}

/// `[[pid, bytes], ...]` from JSON, sorted.
pub(super) fn json_procs(value: &Value) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = value
        .as_array()
        .unwrap_or_else(|| panic!("not a process list: {value}"))
        .iter()
        .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_u64().unwrap()))
        .collect();
    out.sort();
    out
}

pub(super) fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The ledger's processes holding memory on the simulated device `sim_index`, as this test
/// process sees their PIDs, with the bytes the ledger counts for them; and the device's used.
pub(super) fn ledger_view(env: &Env, sim_index: usize) -> (Vec<(u32, u64)>, u64) {
    let uuid = env.sim().device_uuid(sim_index);
    let snapshot = env.ledger().snapshot(None);
    let Some(device) = snapshot.devices.iter().find(|d| d.uuid.bytes == uuid) else { return (Vec::new(), 0) };
    let id = device.id.0;
    let mut procs: Vec<(u32, u64)> = snapshot
        .processes
        .iter()
        .filter(|p| p.alive && p.used[id] > 0)
        .map(|p| (p.pid_here.expect("ledger process visible from the test"), p.used[id]))
        .collect();
    procs.sort();
    (procs, device.used)
}

/// Every PID below `pid` (children files of /proc), depth first.
pub(super) fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    for task in tasks {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            out.push(child);
            out.extend(descendants(child));
        }
    }
    out
}

pub(super) fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

/// Collapses runs of spaces, so table cells compare regardless of padding.
pub(super) fn squeeze(text: &str) -> String {
    text.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// `memory.total, memory.used, memory.free` in MiB from nvidia-smi's CSV query.
pub(super) fn smi_csv(env: &Env, smi: &Path, shim: bool) -> (u64, u64, u64) {
    let mut cmd = env.command(smi).args(["--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]);
    if shim {
        cmd = cmd.shim().limit("8G");
    }
    let run = cmd.success();
    let values: Vec<u64> = run.stdout().trim().split(',').map(|v| v.trim().parse().unwrap_or_else(|_| panic!("bad CSV\n{run}"))).collect();
    assert_eq!(values.len(), 3, "{run}");
    (values[0], values[1], values[2])
}

// ---- tests ----

/// The seed's acceptance test: `nvidia-smi` in a capped container reads `0MiB / 8192MiB`,
/// then the container's usage, in agreement with `cuMemGetInfo` in the same container.
#[test]
fn nvidia_smi_shows_the_cap_and_the_containers_usage() {
    let Some(smi) = nvidia_smi() else { return };
    let env = Env::new("nvml-smi");

    // Nothing holds memory yet: the container's GPU is empty and 8 GiB large.
    let idle = env.command(&smi).shim().limit("8G").success();
    assert!(squeeze(&idle.stdout()).contains("| 0MiB / 8192MiB |"), "idle table under the shim\n{idle}");
    let bare = env.command(&smi).success();
    assert!(squeeze(&bare.stdout()).contains("| 0MiB / 81920MiB |"), "without the shim nvidia-smi shows the whole card\n{bare}");

    // Another container on the same card holds 2 GiB: it must not show here.
    let mut other = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("4G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    other.wait_for("holding");
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    holder.wait_for("holding");
    let (_, ledger_used) = ledger_view(&env, 0);
    assert_eq!(ledger_used, GIB + CONTEXT, "the ledger holds the allocation and the context");

    let table = env.command(&smi).shim().limit("8G").success();
    assert!(squeeze(&table.stdout()).contains("| 1324MiB / 8192MiB |"), "default table with 1 GiB + 300 MiB context held\n{table}");
    assert_eq!(smi_csv(&env, &smi, true), (8192, 1324, 8192 - 1324), "CSV query under the shim");
    assert_eq!(smi_csv(&env, &smi, false), (81920, 1324 + 2348, 81920 - 32 - 1324 - 2348), "the card as the driver sees it");
    let detail = env.command(&smi).args(["-q", "-d", "MEMORY"]).shim().limit("8G").success();
    let detail_text = squeeze(&detail.stdout());
    for expected in ["Total : 8192 MiB", "Reserved : 0 MiB", "Used : 1324 MiB", "Free : 6868 MiB"] {
        assert!(detail_text.contains(expected), "nvidia-smi -q -d MEMORY lacks {expected:?}\n{detail}");
    }

    // CUDA and NVML agree at the same moment: a second process of the container reads
    // cuMemGetInfo (its own context now counts too), nvidia-smi reads NVML.
    let mut cuda = env.client(&["init", "primary", "info", "hold"]).shim().limit("8G").spawn();
    cuda.wait_for("holding");
    let info = cuda.lines.iter().find(|l| l.starts_with("info")).expect("info line").clone();
    assert_eq!(field(&info, "rc").as_deref(), Some("0"), "{info}");
    let cuda_total: u64 = field(&info, "total").unwrap().parse().unwrap();
    let cuda_used = cuda_total - field(&info, "free").unwrap().parse::<u64>().unwrap();
    let (total, used, free) = smi_csv(&env, &smi, true);
    assert_eq!(total * MIB, cuda_total, "nvidia-smi and cuMemGetInfo give the same total");
    assert!(used * MIB <= cuda_used + DRIVER_RESERVED && cuda_used <= used * MIB + DRIVER_RESERVED, "used: nvidia-smi {used} MiB, CUDA {cuda_used} bytes");
    assert_eq!((used, free), (1324 + 300, 8192 - 1624), "both container processes, contexts included");
    let table = env.command(&smi).shim().limit("8G").success();
    assert!(squeeze(&table.stdout()).contains("| 1624MiB / 8192MiB |"), "{table}");
    cuda.finish();
    holder.finish();
    other.finish();
}

/// pynvml (ctypes, `dlsym` on a handle): memory v1 and v2, compute lists v1/v2/v3 with the
/// size query, and nothing of another container on the same card.
#[test]
fn pynvml_sees_the_cap_the_usage_and_only_the_containers_processes() {
    let Some(python) = python() else { return };
    let env = Env::new("nvml-pynvml");
    let other_ledger = env.dir.join("other-ledger");
    let mut a1 = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    a1.wait_for("holding");
    let mut a2 = env.client(&["init", "primary", "alloc", "512M", "hold"]).shim().limit("8G").spawn();
    a2.wait_for("holding");
    let mut b = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("4G").env("FGPU_LEDGER", &other_ledger).spawn();
    b.wait_for("holding");
    let (a1_pid, a2_pid, b_pid) = (a1.pid(), a2.pid(), b.pid());

    let (expected, used) = ledger_view(&env, 0);
    assert_eq!(expected, vec![(a1_pid, GIB + CONTEXT), (a2_pid, 512 * MIB + CONTEXT)], "ledger");
    assert_eq!(used, GIB + 512 * MIB + 2 * CONTEXT);

    let run = py(&env, &python, "nvml_probe.py").shim().limit("8G").success();
    let out = json(&run);
    let dev = &out["devices"][0];
    let cap = 8 * GIB;
    assert_eq!((u(&dev["mem_v1"]["total"]), u(&dev["mem_v1"]["used"]), u(&dev["mem_v1"]["free"])), (cap, used, cap - used), "v1\n{run}");
    let m2 = &dev["mem_v2"];
    assert_eq!(u(&m2["version"]), NVML_MEMORY_V2, "{run}");
    assert_eq!((u(&m2["total"]), u(&m2["reserved"]), u(&m2["used"]), u(&m2["free"])), (cap, 0, used, cap - used), "v2\n{run}");
    for call in ["compute", "compute_v2", "compute_v3"] {
        assert_eq!(json_procs(&dev["pynvml"][call]), expected, "pynvml {call}\n{run}");
    }
    for version in ["v1", "v2", "v3"] {
        let raw = &dev["raw"]["compute"][version];
        assert_eq!(raw["null_rc"].as_i64(), Some(NVML_ERROR_INSUFFICIENT_SIZE), "{version} size query with NULL\n{run}");
        assert_eq!(u(&raw["null_count"]), 2, "{version} size query answers the container's count\n{run}");
        assert_eq!(raw["short_rc"].as_i64(), Some(NVML_ERROR_INSUFFICIENT_SIZE), "{version} buffer one short\n{run}");
        assert_eq!(u(&raw["short_count"]), 2, "{version}\n{run}");
        assert_eq!(raw["rc"].as_i64(), Some(NVML_SUCCESS), "{version}\n{run}");
        assert_eq!(json_procs(&raw["procs"]), expected, "raw {version} layout\n{run}");
        if version != "v1" {
            assert_eq!(raw["instances_ok"].as_bool(), Some(true), "{version} instance ids\n{run}");
        }
        for kind in ["graphics", "mps"] {
            let raw = &dev["raw"][kind][version];
            assert_eq!((raw["null_rc"].as_i64(), u(&raw["null_count"])), (Some(NVML_SUCCESS), 0), "{kind} {version}\n{run}");
        }
    }
    assert!(!run.stdout().contains(&format!("[{b_pid},")), "another container's process leaked\n{run}");

    // The other container sees only itself, under its own cap.
    let run = py(&env, &python, "nvml_probe.py").shim().limit("4G").env("FGPU_LEDGER", &other_ledger).success();
    let dev = &json(&run)["devices"][0];
    assert_eq!((u(&dev["mem_v1"]["total"]), u(&dev["mem_v1"]["used"])), (4 * GIB, 2 * GIB + CONTEXT), "{run}");
    assert_eq!(json_procs(&dev["pynvml"]["compute"]), vec![(b_pid, 2 * GIB + CONTEXT)], "{run}");

    // Without the shim the same probe sees the whole card: the test tells the two apart.
    let run = py(&env, &python, "nvml_probe.py").success();
    let dev = &json(&run)["devices"][0];
    assert_eq!(u(&dev["mem_v1"]["total"]), 80 * GIB, "{run}");
    assert_eq!(json_procs(&dev["pynvml"]["compute"]).len(), 3, "{run}");
    for p in [&mut a1, &mut a2, &mut b] {
        p.finish();
    }
}

/// gpustat (--json) and nvitop (`nvitop -1` and its Python API) show the container.
///
/// One process of the container only: nvitop picks its `_v3` entry layout from the symbols
/// the library exports, and the simulator's set (`nvmlDeviceGetConfComputeMemSizeInfo`
/// without `nvmlDeviceGetRunningProcessDetailList`) is that of drivers 535.43-535.86, whose
/// `_v3` entries were 32 bytes; nvitop then misreads every entry after the first, with or
/// without the shim.
#[test]
fn gpustat_and_nvitop_show_the_cap_the_usage_and_only_the_containers_processes() {
    let Some(python) = python() else { return };
    let env = Env::new("nvml-tools");
    let mut mine = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    mine.wait_for("holding");
    let mut theirs = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("4G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    theirs.wait_for("holding");
    let (mine_pid, theirs_pid) = (mine.pid(), theirs.pid());
    assert_eq!(ledger_view(&env, 0), (vec![(mine_pid, 1324 * MIB)], 1324 * MIB));

    let run = env.command(&python).args(["-m", "gpustat", "--json"]).shim().limit("8G").success();
    let out: Value = serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("gpustat JSON: {e}\n{run}"));
    let gpu = &out["gpus"][0];
    assert_eq!((u(&gpu["memory.total"]), u(&gpu["memory.used"])), (8192, 1324), "gpustat\n{run}");
    let listed: Vec<(u64, u64)> = gpu["processes"].as_array().unwrap().iter().map(|p| (u(&p["pid"]), u(&p["gpu_memory_usage"]))).collect();
    assert_eq!(listed, vec![(mine_pid as u64, 1324)], "gpustat processes\n{run}");

    let run = py(&env, &python, "nvitop_probe.py").shim().limit("8G").success();
    let dev = &json(&run)["devices"][0];
    assert_eq!((u(&dev["memory_total"]), u(&dev["memory_used"]), u(&dev["memory_free"])), (8 * GIB, 1324 * MIB, 8 * GIB - 1324 * MIB), "nvitop API\n{run}");
    assert_eq!(json_procs(&dev["processes"]), vec![(mine_pid, 1324 * MIB)], "nvitop API processes\n{run}");

    let run = env.command(&python).args(["-m", "nvitop", "-1"]).env("COLUMNS", "120").shim().limit("8G").success();
    let text = run.stdout();
    assert!(squeeze(&text).contains("1324MiB / 8192MiB"), "nvitop -1 memory\n{run}");
    // Process rows: "│   0   12345 C    root  1324MiB ...".
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split(|c: char| c == '│' || c.is_whitespace()).filter(|w| !w.is_empty()).map(String::from).collect::<Vec<_>>())
        .filter(|t| t.len() > 4 && t[0] == "0" && t[2] == "C" && t[1].parse::<u32>().is_ok())
        .collect();
    let pids: Vec<u32> = rows.iter().map(|t| t[1].parse().unwrap()).collect();
    assert_eq!(pids, vec![mine_pid], "nvitop -1 process rows\n{run}");
    assert!(rows[0].iter().any(|w| w == "1324MiB"), "{run}");
    assert!(!text.contains(&format!(" {theirs_pid} ")), "{run}");
    mine.finish();
    theirs.finish();
}

/// A C program that links -lnvidia-ml and one that dlopens it: same cap, same lists, NVML's
/// size rules (too-small buffers untouched), version check of `_v2` left to the driver.
#[test]
fn c_clients_linked_and_dlopened_see_the_container() {
    let env = Env::new("nvml-c");
    let mut a1 = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    a1.wait_for("holding");
    let mut a2 = env.client(&["init", "primary", "alloc", "512M", "hold"]).shim().limit("8G").spawn();
    a2.wait_for("holding");
    let mut b = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("4G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    b.wait_for("holding");
    let (expected, used) = ledger_view(&env, 0);
    assert_eq!(expected.len(), 2);
    let cap = 8 * GIB;
    let mut ops: Vec<&str> = vec!["count", "mem", "mem2", "mem2bad"];
    for v in ["1", "2", "3"] {
        ops.extend(["list", "compute", v, "small", "compute", v, "1", "small", "compute", v, "0"]);
    }
    for variant in [Variant::Dlsym, Variant::Linked] {
        let run = nvml(&env, variant, &ops).shim().limit("8G").success();
        assert_eq!(num(&run, "count", "n"), 1, "{run}");
        assert_eq!((num(&run, "mem ", "total"), num(&run, "mem ", "used"), num(&run, "mem ", "free")), (cap, used, cap - used), "v1\n{run}");
        assert_eq!(run.rc("mem2 "), 0, "{run}");
        assert_eq!(num(&run, "mem2 ", "version"), NVML_MEMORY_V2, "{run}");
        let m2 = (num(&run, "mem2 ", "total"), num(&run, "mem2 ", "reserved"), num(&run, "mem2 ", "used"), num(&run, "mem2 ", "free"));
        assert_eq!(m2, (cap, 0, used, cap - used), "v2\n{run}");
        assert_eq!(run.rc("mem2bad"), 25, "a wrong version is the driver's NVML_ERROR_ARGUMENT_VERSION_MISMATCH\n{run}");
        for v in ["1", "2", "3"] {
            let line = run.line(&format!("list compute {v} "));
            assert_eq!(field(&line, "query_rc").as_deref(), Some("7"), "{line}");
            assert_eq!(field(&line, "query_count").as_deref(), Some("2"), "{line}");
            assert_eq!(field(&line, "rc").as_deref(), Some("0"), "{line}");
            assert_eq!(procs_field(&line), expected, "{line}");
            if v != "1" {
                assert_eq!(field(&line, "instances").as_deref(), Some("ok"), "{line}");
            }
            for small in run.lines(&format!("small compute {v} ")) {
                assert_eq!(field(&small, "rc").as_deref(), Some("7"), "{small}");
                assert_eq!(field(&small, "count").as_deref(), Some("2"), "{small}");
                assert_eq!(field(&small, "overrun").as_deref(), Some("0"), "nothing written past a short buffer: {small}");
            }
        }
        assert!(!run.stdout().contains(&format!("{}:", b.pid())), "{run}");
    }
    // Without the shim: the whole card, all three processes.
    let run = nvml(&env, Variant::Linked, &["mem", "list", "compute", "3"]).success();
    assert_eq!(num(&run, "mem ", "total"), 80 * GIB, "{run}");
    assert_eq!(procs_field(&run.line("list compute 3")).len(), 3, "{run}");
    for p in [&mut a1, &mut a2, &mut b] {
        p.finish();
    }
}

/// CUDA allocates in one process, NVML reads in another process of the same container and
/// in a process of another container; and CUDA and NVML in one Python process agree.
#[test]
fn cuda_in_one_process_nvml_in_another_and_in_another_container() {
    let env = Env::new("nvml-cross");
    let other_ledger = env.dir.join("other-ledger");
    let reader =
        |ledger: &Path, limit: &str| nvml(&env, Variant::Dlsym, &["mem", "list", "compute", "2"]).shim().limit(limit).env("FGPU_LEDGER", ledger).success();

    let before = reader(&env.ledger, "8G");
    assert_eq!((num(&before, "mem ", "used"), num(&before, "mem ", "free")), (0, 8 * GIB), "{before}");
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit("8G").spawn();
    holder.wait_for("holding");

    let same = reader(&env.ledger, "8G");
    assert_eq!((num(&same, "mem ", "total"), num(&same, "mem ", "used")), (8 * GIB, GIB + CONTEXT), "{same}");
    assert_eq!(procs_field(&same.line("list compute 2")), vec![(holder.pid(), GIB + CONTEXT)], "{same}");
    let other = reader(&other_ledger, "4G");
    assert_eq!((num(&other, "mem ", "total"), num(&other, "mem ", "used"), num(&other, "mem ", "free")), (4 * GIB, 0, 4 * GIB), "{other}");
    assert_eq!(field(&other.line("list compute 2"), "count").as_deref(), Some("0"), "another container sees none of ours\n{other}");

    // The other container starts a Python process (cuda-bindings + pynvml in one process).
    if let Some(python) = python() {
        let mut theirs = py(&env, &python, "cuda_nvml.py").args(["--alloc", "512M", "--hold"]).shim().limit("4G").env("FGPU_LEDGER", &other_ledger).spawn();
        theirs.wait_for("holding");
        let run = theirs.finish();
        let out = json(&run);
        let (cuda_total, cuda_free) = (u(&out["cuda"]["total"]), u(&out["cuda"]["free"]));
        let (nvml_total, nvml_used, nvml_free) = (u(&out["nvml"]["total"]), u(&out["nvml"]["used"]), u(&out["nvml"]["free"]));
        assert_eq!((cuda_total, nvml_total), (4 * GIB, 4 * GIB), "{run}");
        assert_eq!(cuda_total - cuda_free, nvml_used, "CUDA and NVML agree in one process\n{run}");
        assert_eq!((nvml_used, nvml_free), (512 * MIB + CONTEXT, 4 * GIB - 512 * MIB - CONTEXT), "{run}");
        assert_eq!(json_procs(&out["nvml"]["procs"]), vec![(u(&out["pid"]) as u32, 512 * MIB + CONTEXT)], "only itself\n{run}");
    }
    let mut theirs = env.client(&["init", "primary", "alloc", "256M", "hold"]).shim().limit("4G").env("FGPU_LEDGER", &other_ledger).spawn();
    theirs.wait_for("holding");
    let same = reader(&env.ledger, "8G");
    assert_eq!(num(&same, "mem ", "used"), GIB + CONTEXT, "{same}");
    assert_eq!(procs_field(&same.line("list compute 2")), vec![(holder.pid(), GIB + CONTEXT)], "{same}");
    let other = reader(&other_ledger, "4G");
    assert_eq!(num(&other, "mem ", "used"), 256 * MIB + CONTEXT, "{other}");
    assert_eq!(procs_field(&other.line("list compute 2")), vec![(theirs.pid(), 256 * MIB + CONTEXT)], "{other}");
    holder.finish();
    theirs.finish();
}

/// Two GPUs, per-device caps by UUID, and a holder whose CUDA ordinal 0 is the second GPU
/// (CUDA_VISIBLE_DEVICES=1): NVML's index 1 shows it, index 0 does not.
#[test]
fn per_device_caps_and_usage_follow_the_uuid() {
    let env = Env::new("nvml-devices").devices(2);
    env.client(&["init"]).success();
    let second = env.sim().device_uuid_string(1);
    let limit = format!("{}=2G,*=8G", &second[..12]);
    let mut holder = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit(&limit).env("CUDA_VISIBLE_DEVICES", "1").spawn();
    holder.wait_for("holding");
    let ops = ["device", "0", "mem", "list", "compute", "3", "device", "1", "mem2", "list", "compute", "1"];
    let run = nvml(&env, Variant::Dlsym, &ops).shim().limit(&limit).success();
    assert_eq!((num(&run, "mem ", "total"), num(&run, "mem ", "used")), (8 * GIB, 0), "GPU 0\n{run}");
    assert_eq!(field(&run.line("list compute 3"), "count").as_deref(), Some("0"), "{run}");
    assert_eq!((num(&run, "mem2 ", "total"), num(&run, "mem2 ", "used")), (2 * GIB, GIB + CONTEXT), "GPU 1\n{run}");
    assert_eq!(procs_field(&run.line("list compute 1")), vec![(holder.pid(), GIB + CONTEXT)], "{run}");
    assert_eq!(ledger_view(&env, 1).0, vec![(holder.pid(), GIB + CONTEXT)]);
    holder.finish();

    // A device the limit does not name is not capped: its memory is the driver's answer,
    // but its process list still shows only this ledger's processes.
    let env = Env::new("nvml-uncapped").devices(2);
    let limit = format!("{}=2G", &second[..12]);
    let mut mine = env.client(&["init", "primary", "alloc", "1G", "hold"]).shim().limit(&limit).spawn();
    mine.wait_for("holding");
    let mut theirs = env.client(&["init", "primary", "alloc", "2G", "hold"]).shim().limit("4G").env("FGPU_LEDGER", env.dir.join("other-ledger")).spawn();
    theirs.wait_for("holding");
    let run = nvml(&env, Variant::Dlsym, &["mem", "list", "compute", "3"]).shim().limit(&limit).success();
    assert_eq!(num(&run, "mem ", "total"), 80 * GIB, "uncapped: the driver's memory figures\n{run}");
    assert_eq!(num(&run, "mem ", "used"), 3 * GIB + 2 * CONTEXT + DRIVER_RESERVED, "{run}");
    assert_eq!(procs_field(&run.line("list compute 3")), vec![(mine.pid(), GIB + CONTEXT)], "never another container's process\n{run}");
    mine.finish();
    theirs.finish();
}
