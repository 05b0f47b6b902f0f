use super::*;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const UUID: [u8; 16] = [7; 16];

/// A ledger path in a fresh directory of its own, removed with the directory when the
/// value is dropped (a failing test included: its assertion unwinds through the drop).
struct TempLedger {
    dir: PathBuf,
    path: PathBuf,
}

impl std::ops::Deref for TempLedger {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempLedger {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempLedger {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp_path(name: &str) -> TempLedger {
    let dir = std::env::temp_dir().join(format!("fgpu-ledger-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempLedger { path: dir.join("ledger"), dir }
}

#[derive(Clone, Copy, PartialEq)]
enum Reserve {
    /// `try_reserve` / `release`: every reservation on the device counter.
    Exact,
    /// `reserve` / `unreserve`: through each process's credit.
    Credit,
}

/// Four threads, each with its own open of the ledger (OFD locks make each a separate
/// "process"), reserve and release random sizes; returns the highest device counter seen
/// (credit included).
fn race(path: &Path, device: DeviceId, cap: u64, how: Reserve) -> u64 {
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (path, peak) = (path.to_path_buf(), peak.clone());
            std::thread::spawn(move || {
                let ledger = Ledger::open_or_create(&path).unwrap();
                let me = ledger.join().unwrap();
                let take = |size| match how {
                    Reserve::Exact => ledger.try_reserve(me, device, size, cap),
                    Reserve::Credit => ledger.reserve(me, device, size, cap),
                };
                let give = |size| match how {
                    Reserve::Exact => ledger.release(me, device, size),
                    Reserve::Credit => ledger.unreserve(me, device, size),
                };
                let keep = if how == Reserve::Exact { 3 } else { 6 };
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let size = ((i * 7919 + t) % 13 + 1) * MIB;
                    if take(size).is_ok() {
                        held.push(size);
                    }
                    peak.fetch_max(ledger.device(device).used.load(Relaxed), Relaxed);
                    if held.len() > keep || i % 3 == 0 {
                        if let Some(size) = held.pop() {
                            give(size);
                        }
                    }
                }
                for size in held {
                    give(size);
                }
                assert_eq!(ledger.slot_used(me, device), 0);
                ledger.leave(me);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    peak.load(Relaxed)
}

#[test]
fn reserve_respects_cap_and_release_returns() {
    let path = temp_path("cap");
    let ledger = Ledger::open_or_create(&path).unwrap();
    let me = ledger.join().unwrap();
    let reg = ledger.register_device(UUID, 80 << 30, 100 * MIB, Some(me)).unwrap();
    assert_eq!(reg.ledger_cap, 100 * MIB);
    ledger.try_reserve(me, reg.device, 60 * MIB, 100 * MIB).unwrap();
    let refusal = ledger.try_reserve(me, reg.device, 41 * MIB, 100 * MIB).unwrap_err();
    assert_eq!(refusal, Refusal { requested: 41 * MIB, cap: 100 * MIB, used: 60 * MIB });
    ledger.try_reserve(me, reg.device, 40 * MIB, 100 * MIB).unwrap();
    assert_eq!(ledger.used(reg.device), 100 * MIB);
    ledger.release(me, reg.device, 100 * MIB);
    assert_eq!(ledger.used(reg.device), 0);
    // Releasing more than held never underflows the device counter.
    ledger.release(me, reg.device, 5 * MIB);
    assert_eq!(ledger.used(reg.device), 0);
}

#[test]
fn racing_threads_on_separate_opens_never_pass_the_cap() {
    let path = temp_path("race");
    let cap = 64 * MIB;
    let first = Ledger::open_or_create(&path).unwrap();
    let first_slot = first.join().unwrap();
    let device = first.register_device(UUID, 80 << 30, cap, Some(first_slot)).unwrap().device;
    let peak = race(&path, device, cap, Reserve::Exact);
    assert!(peak <= cap, "peak {peak} over cap {cap}");
    assert_eq!(first.used(device), 0);
}

#[test]
fn a_killed_process_is_reclaimed_and_its_slot_reused() {
    let path = temp_path("dead");
    let ledger = Ledger::open_or_create(&path).unwrap();
    let me = ledger.join().unwrap();
    let device = ledger.register_device(UUID, 80 << 30, 100 * MIB, Some(me)).unwrap().device;
    // SAFETY: the child only calls async-signal-safe-enough code on fresh objects and exits
    // with _exit; the test process is single-threaded at this point of this test.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let code = std::panic::catch_unwind(|| {
            let ledger = Ledger::open_or_create(&path).unwrap();
            let slot = ledger.join().unwrap();
            ledger.try_reserve(slot, device, 70 * MIB, 100 * MIB).unwrap();
            std::mem::forget(ledger);
            // SAFETY: raising SIGKILL on ourselves: the process dies holding its reservation.
            unsafe { libc::raise(libc::SIGKILL) };
        });
        // SAFETY: leave the forked child without running the parent's destructors.
        unsafe { libc::_exit(if code.is_ok() { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status));
    assert_eq!(ledger.used(device), 70 * MIB);
    let snapshot = ledger.snapshot(Some(me));
    let dead: Vec<_> = snapshot.processes.iter().filter(|p| !p.alive).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].pid, child as u32);
    assert_eq!(ledger.reclaim_dead(Some(me)), 1);
    assert_eq!(ledger.used(device), 0);
    ledger.try_reserve(me, device, 100 * MIB, 100 * MIB).unwrap();
}

#[test]
fn empty_ledger_repairs_leaked_counters() {
    let path = temp_path("repair");
    let ledger = Ledger::open_or_create(&path).unwrap();
    let me = ledger.join().unwrap();
    let device = ledger.register_device(UUID, 80 << 30, 100 * MIB, Some(me)).unwrap().device;
    // Simulate a process killed between the device CAS and the slot credit.
    ledger.device(device).used.fetch_add(5 * MIB, Relaxed);
    ledger.leave(me);
    assert_eq!(ledger.used(device), 5 * MIB);
    ledger.reclaim_dead(None);
    assert_eq!(ledger.used(device), 0);
}

#[test]
fn ledger_cap_is_kept_while_others_live_and_reset_when_alone() {
    let path = temp_path("capjoin");
    let a = Ledger::open_or_create(&path).unwrap();
    let a_slot = a.join().unwrap();
    assert_eq!(a.register_device(UUID, 80 << 30, 8 << 30, Some(a_slot)).unwrap().ledger_cap, 8 << 30);
    let b = Ledger::open_or_create(&path).unwrap();
    let b_slot = b.join().unwrap();
    assert_eq!(b.register_device(UUID, 80 << 30, 16 << 30, Some(b_slot)).unwrap().ledger_cap, 8 << 30);
    a.leave(a_slot);
    assert_eq!(b.register_device(UUID, 80 << 30, 16 << 30, Some(b_slot)).unwrap().ledger_cap, 16 << 30);
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let path = temp_path("bad");
    std::fs::write(&path, b"hello, this is not a ledger at all").unwrap();
    assert!(matches!(Ledger::open_or_create(&path), Err(LedgerError::Foreign { .. })));

    let good = temp_path("truncated");
    drop(Ledger::open_or_create(&good).unwrap());
    let file = OpenOptions::new().write(true).open(&good).unwrap();
    file.set_len(1000).unwrap();
    let err = Ledger::open_or_create(&good).err().unwrap();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("truncated to 1000 bytes"), "{err}");

    let other = temp_path("version");
    drop(Ledger::open_or_create(&other).unwrap());
    let file = OpenOptions::new().write(true).open(&other).unwrap();
    file.write_all_at(&7u32.to_le_bytes(), 8).unwrap();
    let err = Ledger::open_or_create(&other).err().unwrap();
    assert!(matches!(err, LedgerError::Version { found: 7, expected: VERSION, .. }), "{err}");

    // A file left empty by a creator that died is initialised, not refused.
    let empty = temp_path("empty");
    std::fs::write(&empty, b"").unwrap();
    Ledger::open_or_create(&empty).unwrap();
    assert!(matches!(Ledger::open_existing(&temp_path("none")), Err(LedgerError::Io { .. })));
}

#[test]
fn snapshot_names_processes_in_our_namespace() {
    let path = temp_path("snap");
    let ledger = Ledger::open_or_create(&path).unwrap();
    let me = ledger.join().unwrap();
    let device = ledger.register_device(UUID, 80 << 30, 100 * MIB, Some(me)).unwrap().device;
    ledger.try_reserve(me, device, 10 * MIB, 100 * MIB).unwrap();
    ledger.add_context(me, device, 4 * MIB as i64);
    let snap = ledger.snapshot(Some(me));
    assert_eq!(snap.devices.len(), 1);
    assert_eq!(snap.devices[0].uuid, UUID);
    let p = &snap.processes[0];
    assert_eq!(p.pid_here, Some(std::process::id()));
    assert!(p.alive);
    assert_eq!(p.used[device.0], 10 * MIB);
    assert_eq!(p.context[device.0], 4 * MIB);
}

#[test]
fn credit_never_passes_the_cap_and_never_blocks_an_allocation_that_fits() {
    let path = temp_path("credit");
    let cap = 256 * MIB;
    let a = Ledger::open_or_create(&path).unwrap();
    let a_slot = a.join().unwrap();
    let device = a.register_device(UUID, 80 << 30, cap, Some(a_slot)).unwrap().device;
    // A takes 1 MiB and frees it: it keeps credit, which is not counted as used.
    a.reserve(a_slot, device, MIB, cap).unwrap();
    a.unreserve(a_slot, device, MIB);
    assert!(a.device(device).used.load(Relaxed) > 0, "credit stays reserved");
    assert_eq!(a.used(device), 0, "but is not shown as used");
    // B needs all of the cap: A's idle credit is taken back rather than refusing B.
    let b = Ledger::open_or_create(&path).unwrap();
    let b_slot = b.join().unwrap();
    b.reserve(b_slot, device, cap, cap).unwrap();
    assert_eq!(b.used(device), cap);
    let refusal = a.reserve(a_slot, device, MIB, cap).unwrap_err();
    assert_eq!((refusal.requested, refusal.used), (MIB, cap));
    b.unreserve(b_slot, device, cap);
    // Racing processes through credit: the raw counter (credit included) never passes the cap.
    let peak = race(&path, device, cap, Reserve::Credit);
    assert!(peak <= cap, "peak {peak} over cap {cap}");
    a.leave(a_slot);
    b.leave(b_slot);
    assert_eq!(a.device(device).used.load(Relaxed), 0, "every byte and every credit returned");
}

#[test]
fn memory_counted_past_the_cap_leaves_no_credit_to_allocate_from() {
    let path = temp_path("force-past-cap");
    let cap = 256 * MIB;
    let ledger = Ledger::open_or_create(&path).unwrap();
    let slot = ledger.join().unwrap();
    let device = ledger.register_device(UUID, 80 << 30, cap, Some(slot)).unwrap().device;
    // An allocation leaves credit behind (reserved, not handed out).
    ledger.reserve(slot, device, MIB, cap).unwrap();
    ledger.unreserve(slot, device, MIB);
    // Memory the driver took without asking (graph memory) pushes the container past its cap:
    // the credit reserved earlier must not let the next allocation through.
    ledger.force_add(slot, device, cap);
    assert_eq!(ledger.used(device), cap);
    let refusal = ledger.reserve(slot, device, MIB, cap).unwrap_err();
    assert_eq!(refusal.used, cap, "{refusal:?}");
    ledger.release(slot, device, cap);
    ledger.reserve(slot, device, MIB, cap).unwrap();
    ledger.leave(slot);
    assert_eq!(ledger.device(device).used.load(Relaxed), 0);
}
