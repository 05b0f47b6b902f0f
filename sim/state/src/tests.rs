use super::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A state file's path in the temporary directory, removed (with its `.mig-config`) when the
/// test ends, pass or fail; the mappings made of it outlive the unlink.
struct TempState(PathBuf);

impl Drop for TempState {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(mig_config_capability_path(&self.0));
    }
}

impl AsRef<Path> for TempState {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempState {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

fn temp_path(name: &str) -> TempState {
    let p = std::env::temp_dir().join(format!("fgpu-sim-test-{}-{}", std::process::id(), name));
    let _ = std::fs::remove_file(&p);
    TempState(p)
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
    assert_eq!(s.device_uuid(1), device_uuid_bytes(1));
    let u = s.device_uuid_string(0);
    assert!(u.starts_with("GPU-") && u.len() == 40, "{u}");
    assert_eq!(std::fs::metadata(&p).unwrap().len() as usize, FILE_SIZE);
    // A second open (any config) sees the same file.
    let s2 = SimState::open_with(&p, &cfg(1, GIB)).unwrap();
    assert_eq!(s2.device_count(), 3);
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
