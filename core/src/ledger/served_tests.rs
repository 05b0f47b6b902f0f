//! Served ledgers in one process: a keeper and members over its socket; what a restarted
//! keeper hands out; what members refuse.

use super::*;
use crate::ledger::served::{fetch, record_path, Fetched, Record};
use crate::ledger::{Ledger, LedgerError, Trust};

const MIB: u64 = 1 << 20;
const UUID: crate::uuid::DeviceUuid = crate::uuid::DeviceUuid { kind: crate::uuid::UuidKind::Gpu, bytes: [9; 16] };

/// A private directory for one test, removed when it ends (pass or fail).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("fgpu-served-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn paths(&self) -> KeeperPaths {
        KeeperPaths { lock: self.0.join("ledger"), recorded: PathBuf::from("/run/fgpu/ledger"), socket: self.0.join("ledger.sock"), label: "test".into() }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(dir: &TempDir) -> (Serving, Settled) {
    let (keeper, settled) = Keeper::open(dir.paths()).unwrap();
    (serve(keeper).unwrap(), settled)
}

fn member(dir: &TempDir) -> Ledger {
    let p = dir.paths();
    Ledger::open_served(&p.lock, &p.socket).unwrap()
}

fn id_of(ledger: &Ledger) -> [u64; 2] {
    let h = ledger.header();
    [h.ledger_id[0].load(Ordering::Relaxed), h.ledger_id[1].load(Ordering::Relaxed)]
}

#[test]
fn members_of_a_served_ledger_share_one_cap() {
    let dir = TempDir::new("share");
    let (serving, settled) = start(&dir);
    assert_eq!(settled, Settled::Created);
    let (a, b) = (member(&dir), member(&dir));
    assert!(a.shmid() < 0 && a.memfd_fd().is_some(), "a served ledger has no segment");
    let (sa, sb) = (a.join().unwrap(), b.join().unwrap());
    let da = a.register_device(UUID, 80 << 30, 8192 * MIB, Some(sa)).unwrap().device;
    let db = b.register_device(UUID, 80 << 30, 8192 * MIB, Some(sb)).unwrap().device;
    a.reserve(sa, da, 5120 * MIB, 8192 * MIB).unwrap();
    // 3 GiB are left for b, and not a byte more.
    let refusal = b.reserve(sb, db, 3072 * MIB + 1, 8192 * MIB).unwrap_err();
    assert_eq!((refusal.cap, refusal.used), (8192 * MIB, 5120 * MIB));
    b.reserve(sb, db, 3072 * MIB, 8192 * MIB).unwrap();
    assert_eq!(a.used(da), 8192 * MIB);
    // What the keeper recorded is the ledger its members map, and what observers see.
    let record = Record::read(&record_path(&dir.paths().socket)).unwrap();
    assert_eq!(record.id, id_of(&a));
    let seen = Ledger::observe_served(&dir.paths().lock, &dir.paths().socket).unwrap();
    assert_eq!(seen.snapshot(None).devices[0].used, 8192 * MIB);
    assert_eq!(seen.trust(), &Trust::Verified, "a keeper's ledger: file 0666, shared");
    assert_eq!(serving.keeper().handed.load(Ordering::Relaxed), 3);
    b.leave(sb);
    a.leave(sa);
}

/// A keeper restarted while a process uses the ledger, which it cannot take the ledger over
/// from: here the member is in the keeper's own process, whose close of its lock file drops
/// the member's classic locks (the kernel's rule), so `/proc/locks` names no one. It
/// refuses rather than make a second ledger, and makes one once the member is gone. (Taking
/// the ledger over from members in other processes: `tests/integration/dra_shared.rs`.)
#[test]
fn a_restarted_keeper_refuses_while_an_unreachable_ledger_is_in_use_and_starts_anew_after() {
    let dir = TempDir::new("restart");
    let (serving, _) = start(&dir);
    let a = member(&dir);
    let sa = a.join().unwrap();
    let da = a.register_device(UUID, 80 << 30, 8192 * MIB, Some(sa)).unwrap().device;
    a.reserve(sa, da, 5120 * MIB, 8192 * MIB).unwrap();
    let first = id_of(&a);
    drop(serving);
    let (serving, settled) = start(&dir);
    assert!(matches!(&settled, Settled::Waiting(why) if why.contains("none of them can be seen")), "{settled:?}");
    let p = dir.paths();
    assert!(matches!(fetch(&p.socket).unwrap(), Fetched::Refused(_)), "a second ledger beside the one in use");
    a.leave(sa);
    drop(a);
    // Asked again until the keeper's next try (every RETRY) finds the ledger unused: a
    // member asks for FETCH_WAIT; on a loaded machine the keeper's look may take longer, so
    // the test asks again (what it shows is that a new ledger comes, not how soon).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let b = loop {
        match Ledger::open_served(&p.lock, &p.socket) {
            Ok(ledger) => break ledger,
            Err(e) if std::time::Instant::now() < deadline => eprintln!("asked again: {e}"),
            Err(e) => panic!("no new ledger within 60 s: {e}"),
        }
    };
    assert_ne!(id_of(&b), first, "a new ledger once no process uses the old one");
    assert_eq!(Record::read(&record_path(&p.socket)).unwrap().id, id_of(&b), "the record names the new ledger");
    assert!(serving.keeper().waiting().is_none());
    drop(b);
    // Restarted with no process using it: a new ledger at once.
    drop(serving);
    let (_serving, settled) = start(&dir);
    assert_eq!(settled, Settled::Created);
}

#[test]
fn a_keeper_that_cannot_reach_the_ledger_in_use_refuses_until_it_can() {
    let dir = TempDir::new("waiting");
    let (serving, _) = start(&dir);
    let a = member(&dir);
    drop(serving);
    // The record is gone: the ledger in use cannot be told from another memory file.
    std::fs::remove_file(record_path(&dir.paths().socket)).unwrap();
    let (serving, settled) = start(&dir);
    assert!(matches!(&settled, Settled::Waiting(why) if why.contains("record")), "{settled:?}");
    match fetch(&dir.paths().socket).unwrap() {
        Fetched::Refused(why) => assert!(why.contains("record"), "{why}"),
        Fetched::Ledger(_) => panic!("a keeper that cannot reach the ledger in use handed out one"),
    }
    assert_eq!(serving.keeper().refused.load(Ordering::Relaxed), 1);
    // The member exits: its read lock drops, and the keeper makes a new ledger at its next try.
    drop(a);
    let deadline = std::time::Instant::now() + 10 * RETRY;
    while serving.keeper().waiting().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(RETRY / 10);
    }
    assert!(matches!(fetch(&dir.paths().socket).unwrap(), Fetched::Ledger(_)), "{:?}", serving.keeper().waiting());
}

#[test]
fn truncating_or_replacing_the_files_neither_faults_nor_lifts_the_cap() {
    let dir = TempDir::new("tamper");
    let (_serving, _) = start(&dir);
    let a = member(&dir);
    let sa = a.join().unwrap();
    let da = a.register_device(UUID, 80 << 30, 1024 * MIB, Some(sa)).unwrap().device;
    a.reserve(sa, da, 1000 * MIB, 1024 * MIB).unwrap();
    // The memory file, through a member's own descriptor: neither shrunk nor grown.
    let memfd = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{}", a.memfd_fd().unwrap())).unwrap();
    assert!(memfd.set_len(0).is_err() && memfd.set_len(1 << 30).is_err());
    // The lock file, truncated: nothing changes (it holds only locks).
    std::fs::OpenOptions::new().write(true).truncate(true).open(&dir.paths().lock).unwrap();
    assert!(a.reserve(sa, da, 25 * MIB, 1024 * MIB).is_err(), "the cap still holds");
    assert_eq!(a.used(da), 1000 * MIB, "every byte still readable");
    // The lock file replaced by another: a newcomer is refused, never handed a ledger of
    // its own.
    std::fs::remove_file(&dir.paths().lock).unwrap();
    std::fs::write(&dir.paths().lock, b"").unwrap();
    std::fs::set_permissions(&dir.paths().lock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let p = dir.paths();
    match Ledger::open_served(&p.lock, &p.socket) {
        Err(LedgerError::Unserved { why, .. }) => assert!(why.contains("replaced"), "{why}"),
        other => panic!("a newcomer after the lock file was replaced: {:?}", other.map(|l| l.path().to_path_buf())),
    }
    a.leave(sa);
}

/// A keeper killed after making a memory file and before recording it (or before any
/// process asked): no process holds that file, so the next keeper makes another, records
/// it, and hands out that one, whatever record the dead keeper left.
#[test]
fn a_keeper_killed_before_recording_its_ledger_is_followed_by_a_fresh_one() {
    let dir = TempDir::new("unrecorded");
    let (serving, settled) = start(&dir);
    assert_eq!(settled, Settled::Created);
    let first = Record::read(&record_path(&dir.paths().socket)).unwrap();
    drop(serving);
    // What the dead keeper left: a record of a ledger no process holds.
    std::fs::write(record_path(&dir.paths().socket), Record { id: [1, 2], ino: 3 }.text()).unwrap();
    let (_serving, settled) = start(&dir);
    assert_eq!(settled, Settled::Created, "no process used a ledger");
    let record = Record::read(&record_path(&dir.paths().socket)).unwrap();
    assert!(record != first && record.id != [1, 2], "a new record: {record:?}");
    let a = member(&dir);
    assert_eq!(id_of(&a), record.id, "the member maps the recorded ledger");
}
