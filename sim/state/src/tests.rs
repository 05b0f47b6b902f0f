use super::*;
use crate::config::parse_seed;
use crate::temp_state::TempState;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn temp_path(name: &str) -> TempState {
    TempState::new(name)
}

fn cfg(devices: u32, memory: u64) -> SimConfig {
    SimConfig { devices, memory, context_overhead: 300 * MIB, driver_version: 12080, ..SimConfig::default() }
}

#[test]
fn creates_file_with_config_and_identity() {
    let p = temp_path("identity");
    let s = SimState::open_with(&p, &cfg(3, 16 * GIB)).unwrap();
    assert_eq!(s.device_count(), 3);
    assert_eq!(s.device_total(2), 16 * GIB);
    assert_eq!(s.device_usable(0), 16 * GIB - DRIVER_RESERVED);
    assert_eq!(s.context_overhead(), 300 * MIB);
    assert_eq!(s.driver_version(), 12080);
    assert_ne!(s.device_uuid(0), s.device_uuid(1));
    assert_eq!(s.device_uuid(1), device_uuid_bytes(s.uuid_seed(), 1));
    let u = s.device_uuid_string(0);
    assert!(u.starts_with("GPU-") && u.len() == 40, "{u}");
    assert_eq!(std::fs::metadata(&p).unwrap().len() as usize, FILE_SIZE);
    // A second open (any config) sees the same file.
    let s2 = SimState::open_with(&p, &cfg(1, GIB)).unwrap();
    assert_eq!(s2.device_count(), 3);
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex, as NVML formats a GPU's UUID.
fn is_gpu_uuid(u: &str) -> bool {
    let groups: Vec<&str> = u.strip_prefix("GPU-").unwrap_or("").split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| g.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
}

/// The UUIDs of every GPU of `s`.
fn uuids(s: &SimState) -> Vec<String> {
    (0..s.device_count()).map(|i| s.device_uuid_string(i)).collect()
}

/// Run in a child process by `each_state_has_gpu_uuids_of_its_own`: prints the GPUs' UUIDs
/// of the state file it is given.
#[test]
fn uuid_child_helper() {
    let Ok(path) = std::env::var("FGPU_SIM_UUID_CHILD") else { return };
    println!("UUIDS {}", uuids(&SimState::open(&path).unwrap()).join(","));
}

/// Real GPUs have UUIDs of their own: two simulator states (two simulated hosts) share none,
/// and every process of one state sees the same UUIDs.
#[test]
fn each_state_has_gpu_uuids_of_its_own() {
    let (a, b) = (temp_path("uuids-a"), temp_path("uuids-b"));
    let (ua, ub) = (uuids(&SimState::open_with(&a, &cfg(8, GIB)).unwrap()), uuids(&SimState::open_with(&b, &cfg(8, GIB)).unwrap()));
    assert!(ua.iter().chain(&ub).all(|u| is_gpu_uuid(u)), "{ua:?} {ub:?}");
    let mut all: Vec<&String> = ua.iter().chain(&ub).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 16, "two states share GPU UUIDs:\n{ua:?}\n{ub:?}");
    for _ in 0..2 {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::uuid_child_helper", "--nocapture", "--test-threads=1"])
            .env("FGPU_SIM_UUID_CHILD", &a)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find_map(|l| l.split_once("UUIDS ").map(|(_, u)| u)).unwrap_or_else(|| panic!("the child printed no UUIDs: {text}"));
        assert_eq!(line.split(',').collect::<Vec<_>>(), ua, "another process of the same state");
    }
}

/// `FGPU_SIM_UUID_SEED` pins the UUIDs: the same seed gives the same UUIDs in two state
/// files, seed 0 the UUIDs every state file had before the seed.
#[test]
fn a_pinned_seed_gives_known_uuids() {
    let pinned = |name: &str, seed: u64| {
        let p = temp_path(name);
        let s = SimState::open_with(&p, &SimConfig { uuid_seed: Some(seed), ..cfg(2, GIB) }).unwrap();
        assert_eq!(s.uuid_seed(), seed);
        uuids(&s)
    };
    assert_eq!(pinned("seed-0", 0), ["GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505", "GPU-f350df69-dd23-9511-d27a-0d8b0541fc1d"]);
    assert_eq!(pinned("seed-a", 0xfeed), pinned("seed-b", 0xfeed));
    assert_ne!(pinned("seed-c", 0xfeed)[0], pinned("seed-d", 0xfeee)[0]);
    assert_eq!((parse_seed("0x1234"), parse_seed(" 4660 "), parse_seed("0XfF")), (Some(0x1234), Some(4660), Some(255)));
    assert_eq!((parse_seed("-1"), parse_seed("0x"), parse_seed("seed"), parse_seed("18446744073709551616")), (None, None, None, None));
}

#[test]
fn allocation_accounting_never_exceeds_memory() {
    let p = temp_path("accounting");
    let s = SimState::open_with(&p, &cfg(2, GIB)).unwrap();
    let slot = s.register().unwrap();
    let usable = s.device_usable(0);
    assert!(s.try_alloc(slot, 0, 512 * MIB));
    assert_eq!(s.device_used(0), 512 * MIB);
    assert_eq!(s.slot_used(slot, 0), 512 * MIB);
    assert_eq!(s.device_used(1), 0);
    assert!(!s.try_alloc(slot, 0, usable - 512 * MIB + 1), "must not exceed usable memory");
    assert!(s.try_alloc(slot, 0, usable - 512 * MIB));
    assert_eq!(s.device_free(0), 0);
    assert!(!s.try_alloc(slot, 0, 1));
    assert!(!s.try_alloc(slot, 5, 1), "no such device");
    s.release(slot, 0, usable);
    assert_eq!(s.device_used(0), 0);
    assert_eq!(s.device_used_counter(0), 0);
    // Releasing more than held saturates at zero instead of wrapping.
    s.release(slot, 0, 10);
    assert_eq!(s.device_used_counter(0), 0);
    let procs = s.processes();
    let me = procs.iter().find(|p| p.slot == slot).unwrap();
    assert_eq!(me.pid, std::process::id());
    assert_eq!(me.per_device_used, vec![0, 0]);
}

#[test]
fn concurrent_allocations_are_atomic() {
    let p = temp_path("concurrent");
    let s = SimState::open_with(&p, &cfg(1, GIB)).unwrap();
    let slot = s.register().unwrap();
    let chunk = MIB;
    let ok: u64 = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4).map(|_| sc.spawn(move || (0..2000).filter(|_| s.try_alloc(slot, 0, chunk)).count() as u64)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(ok, s.device_usable(0) / chunk);
    assert_eq!(s.device_used_counter(0), ok * chunk);
}

/// Helper run in a child process by `dead_process_memory_is_reclaimed`.
#[test]
fn child_helper() {
    let Ok(path) = std::env::var("FGPU_SIM_TEST_CHILD") else { return };
    let s = SimState::open(&path).unwrap();
    let slot = s.register().unwrap();
    assert!(s.try_alloc(slot, 0, 256 * MIB));
    s.count_context(slot, 0, true);
    println!("READY {slot}");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn dead_process_memory_is_reclaimed() {
    let p = temp_path("reclaim");
    let s = SimState::open_with(&p, &cfg(1, GIB)).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::child_helper", "--nocapture", "--test-threads=1"])
        .env("FGPU_SIM_TEST_CHILD", &p)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut rd = BufReader::new(child.stdout.take().unwrap());
    while !line.contains("READY") {
        line.clear();
        assert!(rd.read_line(&mut line).unwrap() > 0, "child exited early");
    }
    assert_eq!(s.device_used(0), 256 * MIB);
    let procs = s.processes();
    let c = procs.iter().find(|p| p.pid == child.id()).expect("child listed");
    assert_eq!(c.per_device_used, vec![256 * MIB]);
    assert_eq!(c.per_device_contexts, vec![1]);
    if in_init_pid_namespace() {
        assert_eq!(c.host_pid, child.id());
        assert_eq!(s.nvml_list_pid(c), Some(child.id()), "host PIDs in the host's namespace, in every mode");
    }
    // A live process is never reclaimed.
    assert_eq!(s.reclaim_dead(), 0);
    assert_eq!(s.device_used_counter(0), 256 * MIB);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Ground truth counts live processes only, even before anyone reclaims.
    assert_eq!(s.device_used(0), 0);
    assert!(s.processes().iter().all(|p| p.pid != child.id()));
    // An allocation that needs the dead process's memory reclaims it first.
    let me = s.register().unwrap();
    assert!(s.try_alloc(me, 0, s.device_usable(0)));
    assert_eq!(s.device_used_counter(0), s.device_usable(0));
    assert_eq!(s.reclaim_dead(), 0);
}

#[test]
fn own_slot_is_never_reclaimed() {
    let p = temp_path("own");
    let s = SimState::open_with(&p, &cfg(1, GIB)).unwrap();
    let slot = s.register().unwrap();
    assert!(s.try_alloc(slot, 0, MIB));
    // Opening the same file again in this process shares the mapping and descriptor.
    let again = SimState::open(&p).unwrap();
    assert_eq!(again.reclaim_dead(), 0);
    assert_eq!(again.device_used(0), MIB);
}

#[test]
fn config_from_env_values() {
    // Only the parser: the environment itself is shared by parallel tests.
    assert_eq!(parse_size("80G"), Some(80 * GIB));
    assert_eq!(SimConfig::default().devices, 1);
    assert_eq!(SimConfig::default().memory, 80 * GIB);
    assert_eq!(SimConfig::default().context_overhead, 300 * MIB);
    assert_eq!(SimConfig::default().driver_version, 12080);
}

#[test]
fn nvml_pid_modes_parse_and_are_kept_in_the_file() {
    for mode in [NvmlPidsMode::Host, NvmlPidsMode::Caller, NvmlPidsMode::CallerNoMemory, NvmlPidsMode::None] {
        assert_eq!(NvmlPidsMode::parse(mode.name()), Some(mode));
        let p = temp_path(&format!("pids-{}", mode.name()));
        let s = SimState::open_with(&p, &SimConfig { nvml_pids: mode, ..SimConfig::default() }).unwrap();
        assert_eq!(s.nvml_pids(), mode);
    }
    assert_eq!(SimConfig::default().nvml_pids, NvmlPidsMode::Caller, "current drivers are the default");
    assert_eq!(NvmlPidsMode::parse("namespace"), None);
}
