use super::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

mod mig;

const MIB: u64 = 1 << 20;
const UUID: DeviceUuid = DeviceUuid { kind: crate::uuid::UuidKind::Gpu, bytes: [7; 16] };

/// A private directory for one test's ledger, removed when the test ends (pass or fail).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("fgpu-ledger-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn ledger(&self) -> PathBuf {
        self.0.join("ledger")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A ledger, a joined slot and a registered device.
fn member(path: &Path, cap: u64) -> (Ledger, SlotId, DeviceId) {
    let ledger = Ledger::open_or_create(path).unwrap();
    let slot = ledger.join().unwrap();
    let device = ledger.register_device(UUID, 80 << 30, cap, Some(slot)).unwrap().device;
    (ledger, slot, device)
}

/// Runs `body` in a forked child that is then killed with SIGKILL, as a process dying while
/// holding what `body` reserved; `body` gets a fresh open of the ledger.
fn in_killed_child(path: &Path, body: impl FnOnce(&Ledger, SlotId)) -> libc::pid_t {
    // SAFETY: fork(2). Tests of this binary run on several threads, so the child must not
    // take locks another thread may hold: it only opens the ledger (open, fcntl, shmat and
    // atomics, plus allocations that glibc's malloc makes fork-safe), then kills itself with
    // SIGKILL, never returning into the test harness.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let ledger = Ledger::open_or_create(path).unwrap();
            let slot = ledger.join().unwrap();
            body(&ledger, slot);
            std::mem::forget(ledger);
        }))
        .is_ok();
        if ok {
            // SAFETY: kill(2) of ourselves: the process dies holding what it reserved.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        // SAFETY: leaves the forked child without running the parent's destructors.
        unsafe { libc::_exit(1) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "child status {status:#x}");
    child
}

#[test]
fn reserve_respects_cap_and_release_returns() {
    let dir = TempDir::new("cap");
    let (ledger, me, device) = member(&dir.ledger(), 100 * MIB);
    ledger.reserve(me, device, 60 * MIB, 100 * MIB).unwrap();
    let refusal = ledger.reserve(me, device, 41 * MIB, 100 * MIB).unwrap_err();
    assert_eq!(refusal, Refusal { requested: 41 * MIB, cap: 100 * MIB, used: 60 * MIB, lock_timeout: false });
    ledger.reserve(me, device, 40 * MIB, 100 * MIB).unwrap();
    assert_eq!(ledger.used(device), 100 * MIB);
    assert_eq!(ledger.holding(me, device).reserved, 100 * MIB, "no credit left at the cap");
    ledger.release(me, device, 100 * MIB);
    assert_eq!(ledger.used(device), 0);
    // Releasing more than held never underflows.
    ledger.release(me, device, 5 * MIB);
    assert_eq!(ledger.used(device), 0);
    assert!(ledger.holding(me, device).reserved <= 2 * CREDIT_CHUNK, "credit beyond two chunks went back");
}

/// The sum of all reservations (credit included) at one instant: read under the device's
/// refill lock, while nobody can raise a reservation (only lower one), so the sum is at
/// most the total when the lock was taken. A sum read without it can come out high: one
/// slot read before it gave credit back, another after it refilled with that room.
fn reserved_total_at_once(ledger: &Ledger, device: DeviceId) -> u64 {
    let _threads = ledger.refill[device.0].lock().unwrap();
    lock::ofd_lock_timed(ledger.fd(), refill_lock(device.0)).unwrap();
    let total = ledger.reserved_total(device);
    lock::ofd_unlock(ledger.fd(), refill_lock(device.0));
    total
}

/// Four threads, each with its own open of the ledger (OFD locks make each a separate
/// "process"), reserve and release random sizes, and after each step read the sum of all
/// reservations (credit included) at one instant. Returns the highest sum seen.
fn race(path: &Path, device: DeviceId, cap: u64) -> u64 {
    let peak = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (path, peak) = (path.to_path_buf(), peak.clone());
            std::thread::spawn(move || {
                let ledger = Ledger::open_or_create(&path).unwrap();
                let me = ledger.join().unwrap();
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let size = ((i * 7919 + t) % 13 + 1) * MIB;
                    if ledger.reserve(me, device, size, cap).is_ok() {
                        held.push(size);
                    }
                    peak.fetch_max(reserved_total_at_once(&ledger, device), Relaxed);
                    if held.len() > 6 || i % 3 == 0 {
                        if let Some(size) = held.pop() {
                            ledger.release(me, device, size);
                        }
                    }
                }
                for size in held {
                    ledger.release(me, device, size);
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
fn racing_processes_never_pass_the_cap_and_give_everything_back() {
    let dir = TempDir::new("race");
    let cap = 64 * MIB;
    let (first, _, device) = member(&dir.ledger(), cap);
    let peak = race(&dir.ledger(), device, cap);
    assert!(peak <= cap, "peak {peak} over cap {cap}");
    assert!(peak > cap / 2, "the race never came near the cap ({peak}): it tested nothing");
    assert_eq!(first.used(device), 0);
    assert_eq!(first.reserved_total(device), 0, "every byte and every credit returned");
}

#[test]
fn usage_never_reads_low_while_others_reserve_and_release() {
    // The reproduction of the bug report: 100 MiB held, one thread moving 20 MiB in and out
    // (through refills and give-backs), another reading. Every read must show >= 100 MiB.
    let dir = TempDir::new("low-reads");
    let cap = 1 << 30;
    let (ledger, me, device) = member(&dir.ledger(), cap);
    ledger.reserve(me, device, 100 * MIB, cap).unwrap();
    let ledger = Arc::new(ledger);
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (ledger, stop) = (ledger.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Relaxed) {
                // 20 MiB > credit: every reserve refills, every release gives back.
                ledger.reserve(me, device, 20 * MIB, cap).unwrap();
                ledger.release(me, device, 20 * MIB);
                ledger.reserve(me, device, 40 * MIB, cap).unwrap();
                ledger.release(me, device, 40 * MIB);
                rounds += 1;
            }
            rounds
        })
    };
    let other = Ledger::open_or_create(&dir.ledger()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let (mut low_used, mut low_slot, mut reads) = (u64::MAX, u64::MAX, 0u64);
    while std::time::Instant::now() < deadline {
        low_used = low_used.min(other.used(device));
        low_slot = low_slot.min(other.slot_used(me, device));
        reads += 1;
    }
    stop.store(true, Relaxed);
    let rounds = mover.join().unwrap();
    assert!(rounds > 100, "the mover made only {rounds} rounds");
    assert!(low_used >= 100 * MIB, "used() read {low_used} < 100 MiB in {reads} reads");
    assert!(low_slot >= 100 * MIB, "slot_used() read {low_slot} < 100 MiB in {reads} reads");
}

#[test]
fn a_killed_process_leaves_exactly_what_the_survivors_hold() {
    let dir = TempDir::new("dead");
    let cap = 100 * MIB;
    let (ledger, me, device) = member(&dir.ledger(), cap);
    ledger.reserve(me, device, 10 * MIB, cap).unwrap();
    let child = in_killed_child(&dir.ledger(), |child, slot| {
        child.reserve(slot, device, 70 * MIB, cap).unwrap();
    });
    let snapshot = ledger.snapshot(Some(me));
    let dead: Vec<_> = snapshot.processes.iter().filter(|p| !p.alive).collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].pid, child as u32);
    assert_eq!(ledger.used(device), 80 * MIB, "counted until found dead");
    // The survivor's next refusal finds the dead process and drops it: the whole rest of the
    // cap is granted, to the byte, and not one byte more.
    let rest = cap - 10 * MIB;
    ledger.reserve(me, device, rest, cap).unwrap();
    assert_eq!(ledger.used(device), cap);
    assert!(ledger.reserve(me, device, 1, cap).is_err());
    assert_eq!(ledger.snapshot(Some(me)).processes.len(), 1);
}

#[test]
fn a_process_killed_holding_credit_or_mid_refill_leaves_nothing_behind() {
    let dir = TempDir::new("dead-credit");
    let cap = 512 * MIB;
    let (ledger, me, device) = member(&dir.ledger(), cap);
    ledger.reserve(me, device, 3 * MIB, cap).unwrap();
    for _ in 0..3 {
        in_killed_child(&dir.ledger(), |child, slot| {
            // Allocations served from credit, one refill, a give-back, then death with both
            // credit and holdings in the slot.
            for _ in 0..40 {
                child.reserve(slot, device, MIB, cap).unwrap();
            }
            child.release(slot, device, 20 * MIB);
            child.reserve(slot, device, 100 * MIB, cap).unwrap();
        });
    }
    assert_eq!(ledger.reclaim_dead(Some(me)), 3);
    assert_eq!(ledger.used(device), 3 * MIB);
    assert_eq!(ledger.reserved_total(device), ledger.holding(me, device).reserved, "only the survivor's word is left");
}

#[test]
fn ledger_cap_is_kept_while_others_live_and_reset_when_alone() {
    let dir = TempDir::new("capjoin");
    let (a, a_slot, _) = member(&dir.ledger(), 8 << 30);
    let b = Ledger::open_or_create(&dir.ledger()).unwrap();
    let b_slot = b.join().unwrap();
    assert_eq!(b.register_device(UUID, 80 << 30, 16 << 30, Some(b_slot)).unwrap().ledger_cap, 8 << 30);
    a.leave(a_slot);
    assert_eq!(b.register_device(UUID, 80 << 30, 16 << 30, Some(b_slot)).unwrap().ledger_cap, 16 << 30);
}

#[test]
fn the_lock_file_can_be_truncated_or_garbled_without_harm() {
    let dir = TempDir::new("garble");
    let cap = 100 * MIB;
    let (a, a_slot, device) = member(&dir.ledger(), cap);
    a.reserve(a_slot, device, 60 * MIB, cap).unwrap();
    let shmid = a.shmid();
    // Truncated: the segment cannot shrink, so the holder keeps working.
    std::fs::OpenOptions::new().write(true).open(dir.ledger()).unwrap().set_len(0).unwrap();
    a.reserve(a_slot, device, MIB, cap).unwrap();
    // Garbage over the hint: a newcomer searches and finds the same ledger.
    std::fs::write(dir.ledger(), vec![0xa5u8; 4096]).unwrap();
    let b = Ledger::open_or_create(&dir.ledger()).unwrap();
    assert_eq!(b.shmid(), shmid);
    let b_slot = b.join().unwrap();
    let refusal = b.reserve(b_slot, device, 40 * MIB, cap).unwrap_err();
    assert_eq!(refusal.used, 61 * MIB);
    b.reserve(b_slot, device, 39 * MIB, cap).unwrap();
    // The hint was rewritten: a third process is sent straight to it.
    let mut head = [0u8; HINT_SIZE];
    std::fs::File::open(dir.ledger()).unwrap().read_at(&mut head, 0).unwrap();
    assert_eq!(Hint::from_bytes(&head).map(|h| h.shmid), Some(shmid));
}

#[test]
fn a_deleted_or_replaced_lock_file_never_starts_a_second_ledger() {
    let dir = TempDir::new("replaced");
    let cap = 100 * MIB;
    let (a, a_slot, device) = member(&dir.ledger(), cap);
    a.reserve(a_slot, device, 60 * MIB, cap).unwrap();
    for how in ["delete", "replace"] {
        std::fs::remove_file(dir.ledger()).unwrap();
        if how == "replace" {
            std::fs::write(dir.ledger(), b"someone else's file").unwrap();
        }
        // A newcomer reaches the old file through the holder's /proc/PID/fd (same user) and
        // joins the same ledger: the 60 MiB still count.
        let b = Ledger::open_or_create(&dir.ledger()).unwrap();
        assert_eq!(b.shmid(), a.shmid(), "{how}: a second ledger was started");
        assert!(b.adopted_from().is_some(), "{how}");
        let b_slot = b.join().unwrap();
        assert!(b.reserve(b_slot, device, 41 * MIB, cap).is_err(), "{how}: the cap was doubled");
        b.reserve(b_slot, device, 40 * MIB, cap).unwrap();
        assert!(a.file_problem().is_some(), "{how}: the holder does not see the problem");
        // Liveness still works across the two: b's slot is alive for a.
        assert_eq!(a.reclaim_dead(Some(a_slot)), 0, "{how}");
        b.leave(b_slot);
    }
}

#[test]
fn snapshot_names_processes_and_device_totals_add_up() {
    let dir = TempDir::new("snap");
    let (ledger, me, device) = member(&dir.ledger(), 100 * MIB);
    ledger.reserve(me, device, 10 * MIB, 100 * MIB).unwrap();
    ledger.add_context(me, device, 4 * MIB as i64);
    let other = Ledger::open_or_create(&dir.ledger()).unwrap();
    let other_slot = other.join().unwrap();
    other.reserve(other_slot, device, 7 * MIB, 100 * MIB).unwrap();
    let snap = ledger.snapshot(Some(me));
    assert_eq!(snap.devices.len(), 1);
    assert_eq!(snap.devices[0].uuid, UUID);
    assert_eq!(snap.devices[0].used, 17 * MIB);
    assert_eq!(snap.devices[0].used, snap.processes.iter().map(|p| p.used[device.0]).sum::<u64>());
    let p = snap.processes.iter().find(|p| p.slot == me).unwrap();
    assert_eq!(p.pid_here, Some(std::process::id()));
    assert!(p.alive);
    assert_eq!(p.used[device.0], 10 * MIB);
    assert_eq!(p.context[device.0], 4 * MIB);
}

#[test]
fn credit_never_blocks_an_allocation_that_fits() {
    let dir = TempDir::new("credit");
    let cap = 256 * MIB;
    let (a, a_slot, device) = member(&dir.ledger(), cap);
    // A takes 1 MiB and frees it: it keeps credit, which is not counted as used.
    a.reserve(a_slot, device, MIB, cap).unwrap();
    a.release(a_slot, device, MIB);
    assert!(a.reserved_total(device) > 0, "credit stays reserved");
    assert_eq!(a.used(device), 0, "but is not shown as used");
    // B needs all of the cap: A's idle credit is taken back rather than refusing B.
    let b = Ledger::open_or_create(&dir.ledger()).unwrap();
    let b_slot = b.join().unwrap();
    b.reserve(b_slot, device, cap, cap).unwrap();
    assert_eq!(b.used(device), cap);
    let refusal = a.reserve(a_slot, device, MIB, cap).unwrap_err();
    assert_eq!((refusal.requested, refusal.used), (MIB, cap));
    b.release(b_slot, device, cap);
    a.leave(a_slot);
    b.leave(b_slot);
    assert_eq!(a.reserved_total(device), 0, "every byte and every credit returned");
}

#[test]
fn memory_counted_past_the_cap_leaves_no_credit_to_allocate_from() {
    let dir = TempDir::new("force-past-cap");
    let cap = 256 * MIB;
    let (ledger, slot, device) = member(&dir.ledger(), cap);
    // An allocation leaves credit behind (reserved, not handed out).
    ledger.reserve(slot, device, MIB, cap).unwrap();
    ledger.release(slot, device, MIB);
    // Memory the driver took without asking (graph memory) pushes the container past its cap:
    // the credit reserved earlier must not let the next allocation through.
    ledger.force_add(slot, device, cap);
    assert_eq!(ledger.used(device), cap);
    let refusal = ledger.reserve(slot, device, MIB, cap).unwrap_err();
    assert_eq!(refusal.used, cap, "{refusal:?}");
    ledger.release(slot, device, cap);
    ledger.reserve(slot, device, MIB, cap).unwrap();
    ledger.leave(slot);
    assert_eq!(ledger.reserved_total(device), 0);
}

#[test]
fn the_segment_goes_away_with_its_last_process() {
    let dir = TempDir::new("lifetime");
    let (ledger, slot, device) = member(&dir.ledger(), 100 * MIB);
    ledger.reserve(slot, device, 50 * MIB, 100 * MIB).unwrap();
    let shmid = ledger.shmid();
    assert!(Ledger::open_existing(&dir.ledger()).is_ok());
    drop(ledger);
    // SAFETY: all-zero bytes are a valid shmid_ds; IPC_STAT only writes into it.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: models shmctl(2) IPC_STAT; fails once the kernel removed the segment.
    assert_eq!(unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) }, -1, "segment {shmid} outlived its processes");
    assert!(matches!(Ledger::open_existing(&dir.ledger()), Err(LedgerError::NotInUse { .. })));
    // A new ledger starts empty.
    let (fresh, _, device) = member(&dir.ledger(), 100 * MIB);
    assert_eq!(fresh.used(device), 0);
}

#[test]
fn a_per_user_ledger_refuses_a_directory_or_file_of_another_user() {
    let dir = TempDir::new("per-user");
    let own = dir.0.join("mine");
    let path = own.join("ledger");
    let ledger = Ledger::open(&path, Sharing::User).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    drop(ledger);
    // A directory open to others is refused.
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = Ledger::open(&path, Sharing::User).err().unwrap();
    assert!(err.to_string().contains("must be 0700"), "{err}");
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A link in place of the file is never followed.
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
    let err = Ledger::open(&path, Sharing::User).err().unwrap();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    std::fs::remove_file(&path).unwrap();
    if store::euid() == 0 {
        // Another user's directory: somebody who made /tmp/fgpu-UID first to share it.
        std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
        let err = Ledger::open(&path, Sharing::User).err().unwrap();
        assert!(err.to_string().contains("belongs to uid 65534"), "{err}");
    }
}

#[test]
fn a_file_an_older_fgpu_still_uses_is_refused() {
    let dir = TempDir::new("older");
    // Format 2 kept its data in the file; a live process of it holds a slot lock there.
    let mut v2 = vec![0u8; 4096];
    v2[..8].copy_from_slice(&MAGIC.to_le_bytes());
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(dir.ledger(), &v2).unwrap();
    let holder = std::fs::OpenOptions::new().read(true).write(true).open(dir.ledger()).unwrap();
    assert!(lock::ofd_lock(holder.as_fd(), LOCK_BASE + 16 + 2 * 5, false).unwrap());
    let err = Ledger::open_or_create(&dir.ledger()).err().unwrap();
    assert!(matches!(err, LedgerError::Version { found: 2, expected: VERSION, .. }), "{err}");
    // Once no process of it is left, the file is taken over.
    drop(holder);
    Ledger::open_or_create(&dir.ledger()).unwrap();
}

#[test]
#[ignore]
fn time_reserve_release_pairs() {
    let dir = TempDir::new("timing");
    let (ledger, me, device) = member(&dir.ledger(), 8 << 30);
    for _ in 0..3 {
        let n = 5_000_000u64;
        let t = std::time::Instant::now();
        for _ in 0..n {
            ledger.reserve(me, device, MIB, 8 << 30).unwrap();
            ledger.release(me, device, MIB);
        }
        eprintln!("pair {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    }
}

#[test]
fn a_lock_over_every_slot_does_not_keep_a_process_out() {
    let dir = TempDir::new("slots-locked");
    let (ledger, me, device) = member(&dir.ledger(), 100 * MIB);
    // Someone who can open the file locks every other slot's byte with one lock.
    let hostile = std::fs::OpenOptions::new().read(true).write(true).open(dir.ledger()).unwrap();
    let mut lock: libc::flock = unsafe_zeroed_flock();
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = alive_lock(1);
    lock.l_len = 0; // to the end of the file
                    // SAFETY: models fcntl(2) F_OFD_SETLK with a valid flock on an open file.
    assert_eq!(unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&hostile), libc::F_OFD_SETLK, &mut lock) }, 0);
    // A newcomer still gets a slot, whose liveness is its process's, and it counts.
    let newcomer = Ledger::open_or_create(&dir.ledger()).unwrap();
    let slot = newcomer.join().unwrap();
    assert!(newcomer.by_process(slot));
    let dev = newcomer.register_device(UUID, 80 << 30, 100 * MIB, Some(slot)).unwrap().device;
    newcomer.reserve(slot, dev, 60 * MIB, 100 * MIB).unwrap();
    assert!(ledger.reserve(me, device, 41 * MIB, 100 * MIB).is_err(), "the newcomer's 60 MiB count against the cap");
    assert!(ledger.snapshot(Some(me)).processes.iter().all(|p| p.alive));
    assert_eq!(ledger.reclaim_dead(Some(me)), 0, "a live process-liveness slot is not reclaimed");
    // It leaves: its slot and bytes go back.
    newcomer.leave(slot);
    ledger.reserve(me, device, 41 * MIB, 100 * MIB).unwrap();
    // A process-liveness slot whose process died is dropped: one claimed for a process
    // that exits at once.
    let slot = newcomer.join().unwrap();
    newcomer.reserve(slot, dev, 20 * MIB, 100 * MIB).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    newcomer.slot(slot).pid.store(child.id(), Relaxed);
    assert_eq!(ledger.reclaim_dead(Some(me)), 1, "its process is gone");
    assert_eq!(ledger.used(device), 41 * MIB);
    drop(hostile);
}

#[test]
fn a_slot_left_half_claimed_is_taken_over_once_stale() {
    let dir = TempDir::new("stuck-claim");
    let (ledger, _me, _device) = member(&dir.ledger(), 100 * MIB);
    let id = SlotId(5);
    assert!(ledger.start_claim(id, SLOT_FREE));
    assert!(!ledger.take_stuck_claim(id), "a fresh claim is somebody's, in progress");
    ledger.slot(id).claiming_since_s.store(0, Relaxed);
    assert!(ledger.take_stuck_claim(id), "one left for longer is a dead claimer's");
    assert!(!ledger.take_stuck_claim(id), "and only one process takes it over");
}

fn unsafe_zeroed_flock() -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}
