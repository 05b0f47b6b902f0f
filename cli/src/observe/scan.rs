//! `--all`'s scan: every ledger some process on the machine has mapped, told from
//! `/proc/PID/maps` alone (see `ledgers.rs` for why this reads nothing a tenant controls
//! but through the process's own root).

use super::target::{Found, Origin, Target};
use fgpu_core::ledger::layout::SEGMENT_SIZE;
use fgpu_core::ledger::store;
use fgpu_core::resolve::ProcessDir;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a scan of the machine's processes may take, of [`crate::observe::report::READ_BUDGET`]:
/// the rest is for reading the ledgers found.
pub const SCAN_BUDGET: Duration = Duration::from_millis(1500);

pub struct Scan {
    pub targets: Vec<Target>,
    /// Processes whose maps could not be read.
    pub denied: usize,
    /// Processes whose maps did not answer within the scan's time.
    pub late: usize,
}

impl Scan {
    pub fn notes(&self) -> Vec<String> {
        let late = self.late;
        (late > 0)
            .then(|| {
                format!(
                    "{late} process(es) could not be inspected in time (reading their memory maps did not finish within {:.1} s): ledgers only they map are not shown",
                    SCAN_BUDGET.as_secs_f64()
                )
            })
            .into_iter()
            .collect()
    }
}

/// Scans `proc_root` (normally /proc) for ledgers attached by any process but `own_pid`,
/// within [`SCAN_BUDGET`].
#[cfg(test)]
pub fn scan(proc_root: &Path, own_pid: u32) -> Scan {
    scan_of(proc_root, own_pid, None, Instant::now() + SCAN_BUDGET)
}

/// [`scan`], of the processes of one user only (`uid`), finished by `deadline`.
///
/// Nothing of a file a process maps is touched: a ledger's attachment is told from its line
/// in `/proc/PID/maps` alone (`fgpu_core::ledger::maps`), and the lock-file path is read
/// from the segment itself, attached by its id in that process's IPC namespace. Reading a
/// process's maps can still wait: the kernel takes that process's memory-map lock, which a
/// tenant can keep held (a thread blocked in a fault on a file of a FUSE mount it serves,
/// with another waiting to change its mappings). So the maps are read by worker threads and
/// the scan stops at `deadline`; a process not read by then is counted in [`Scan::late`],
/// and one whose read is still stuck is not read again until that read ends.
pub fn scan_of(proc_root: &Path, own_pid: u32, uid: Option<u32>, deadline: Instant) -> Scan {
    let own_ipc = ProcessDir::open(Path::new("/proc"), std::process::id()).and_then(|p| p.ns_inode("ipc")).unwrap_or(0);
    let Some(device) = fgpu_core::ledger::maps::shm_device() else {
        return Scan { targets: Vec::new(), denied: 0, late: 0 };
    };
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Scan { targets: Vec::new(), denied: 0, late: 0 };
    };
    let mut pids: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|pid| *pid != own_pid).collect();
    pids.sort_unstable();
    let (looks, late) = look_at_all(proc_root, pids, uid, device, deadline);
    let mut denied = 0;
    let mut by_segment: BTreeMap<(u64, i32), Vec<Arc<ProcessDir>>> = BTreeMap::new();
    for look in looks {
        match look {
            Look::Mapped { process, ipc: Some(ipc), shmids } => {
                for shmid in shmids {
                    let holders = by_segment.entry((ipc, shmid)).or_default();
                    if !holders.iter().any(|p| p.pid == process.pid) {
                        holders.push(process.clone());
                    }
                }
            }
            Look::Mapped { ipc: None, .. } | Look::Denied => denied += 1,
            Look::Nothing => {}
        }
    }
    let mut targets = Vec::new();
    for ((ipc, shmid), holders) in by_segment {
        let mapped_by: Vec<u32> = holders.iter().map(|p| p.pid).collect();
        // The segment's header names its lock file: read from the segment, attached here
        // by its id (in the holder's IPC namespace, entered by a thread of its own).
        let other_ipc = ipc != own_ipc;
        let Some(path) = holders.iter().find_map(|dir| recorded_path(dir, shmid, other_ipc)) else {
            if !other_ipc {
                continue; // not a ledger of this version
            }
            denied += 1;
            continue;
        };
        let dir = holders[0].clone();
        let open_path = proc_root.join(dir.pid.to_string()).join("root").join(path.strip_prefix("/").unwrap_or(&path));
        targets.push(Target {
            path,
            open_path,
            origin: Origin::Scan,
            mapped_by,
            identity: Some(format!("ipc:{ipc}:shm:{shmid}")),
            problem: None,
            found: Some(Arc::new(Found { process: dir, shmid, other_ipc })),
        });
    }
    Scan { targets, denied, late }
}

/// The lock-file path recorded in segment `shmid`, attached in the IPC namespace of the
/// process `dir` (its own when `other_ipc` is false; entering another needs root).
fn recorded_path(dir: &ProcessDir, shmid: i32, other_ipc: bool) -> Option<PathBuf> {
    if !other_ipc {
        return store::segment_path(shmid);
    }
    let ns = dir.open_entry("ns/ipc").ok()?;
    store::in_ipc_namespace(&ns, || store::segment_path(shmid)).ok().flatten()
}

/// What one process's maps showed.
enum Look {
    /// It attaches ledger-sized System V segments (`shmids`), in IPC namespace `ipc` (None:
    /// that namespace could not be told).
    Mapped { process: Arc<ProcessDir>, ipc: Option<u64>, shmids: Vec<i32> },
    /// Its maps may not be read by this user.
    Denied,
    /// Gone, another user's (when scanning one user's), or no segment of a ledger's size.
    Nothing,
}

/// Reads the maps of one process. The only call here that can wait is the read of the
/// maps itself; nothing of the files it maps is touched.
fn look_at(proc_root: &Path, pid: u32, uid: Option<u32>, device: &str) -> Look {
    // Opened first: whatever is read below is this process's, even if it exits and its PID
    // is reused meanwhile.
    let Ok(process) = ProcessDir::open(proc_root, pid) else { return Look::Nothing };
    if uid.is_some() && process.owner_uid().ok() != uid {
        return Look::Nothing;
    }
    let maps = match process.open_entry("maps").and_then(std::io::read_to_string) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Look::Denied,
        Err(_) => return Look::Nothing, // exited meanwhile, or a kernel thread
    };
    let mut shmids: Vec<i32> = maps
        .lines()
        .filter_map(|line| fgpu_core::ledger::maps::attachment(line, device))
        .filter(|a| a.shared && a.end.checked_sub(a.start) == Some(SEGMENT_SIZE as u64))
        .map(|a| a.shmid)
        .collect();
    if shmids.is_empty() {
        return Look::Nothing;
    }
    shmids.sort_unstable();
    shmids.dedup();
    let ipc = process.ns_inode("ipc").ok();
    Look::Mapped { process: Arc::new(process), ipc, shmids }
}

/// How many threads read maps at first, and at most (one more is started each time no
/// read has finished for [`STALL`] while processes wait).
const WORKERS: (usize, usize) = (2, 32);
const STALL: Duration = Duration::from_millis(20);

/// Processes (proc root, PID) whose maps read has not returned, from this scan or an
/// earlier one (the exporter scans again and again): not read again until it returns.
static STUCK: Mutex<Option<HashSet<(PathBuf, u32)>>> = Mutex::new(None);

fn stuck() -> std::sync::MutexGuard<'static, Option<HashSet<(PathBuf, u32)>>> {
    STUCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`look_at`] for every PID, by worker threads, until `deadline`: the looks that came
/// back, and how many did not.
fn look_at_all(proc_root: &Path, pids: Vec<u32>, uid: Option<u32>, device: &'static str, deadline: Instant) -> (Vec<Look>, usize) {
    let total = pids.len();
    let queue = Arc::new(Mutex::new(VecDeque::from(pids)));
    let root = Arc::new(proc_root.to_path_buf());
    let (tx, rx) = mpsc::channel::<Option<Look>>();
    let spawn = |queue: &Arc<Mutex<VecDeque<u32>>>| {
        let (queue, root, tx) = (queue.clone(), root.clone(), tx.clone());
        std::thread::Builder::new()
            .name("fgpu-maps".into())
            .spawn(move || loop {
                if Instant::now() >= deadline {
                    return;
                }
                let Some(pid) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else { return };
                let key = ((*root).clone(), pid);
                // A read of this process that never returned: not again (it counts as late).
                if !stuck().get_or_insert_with(HashSet::new).insert(key.clone()) {
                    let _ = tx.send(None);
                    continue;
                }
                let look = look_at(&root, pid, uid, device);
                if let Some(set) = stuck().as_mut() {
                    set.remove(&key);
                }
                let _ = tx.send(Some(look));
            })
            .is_ok()
    };
    let mut workers = (0..WORKERS.0.min(total)).filter(|_| spawn(&queue)).count();
    let (mut looks, mut answered) = (Vec::new(), 0);
    let mut progress = Instant::now();
    while answered < total && workers > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match rx.recv_timeout((deadline - now).min(STALL)) {
            Ok(look) => {
                answered += 1;
                looks.extend(look);
                progress = Instant::now();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let waiting = !queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
                if waiting && progress.elapsed() >= STALL && workers < WORKERS.1 && spawn(&queue) {
                    workers += 1;
                    progress = Instant::now();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break, // not while `tx` lives
        }
    }
    let late = total - looks.len();
    (looks, late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_a_ledger_mapped_by_another_process_once() {
        use fgpu_core::ledger::Ledger;
        let dir = std::env::temp_dir().join(format!("fgpu-cli-scan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        let ledger = Ledger::open_or_create(&path).unwrap();
        // Pretend to be someone else so our own process is scanned.
        let found = scan(Path::new("/proc"), 0);
        let ours: Vec<_> = found.targets.iter().filter(|t| t.path == path).collect();
        assert_eq!(ours.len(), 1, "{:?}", found.targets);
        assert!(ours[0].mapped_by.contains(&std::process::id()));
        assert!(ours[0].problem.is_none());
        assert!(!ours[0].found.as_ref().unwrap().other_ipc);
        // Our own PID is skipped when named.
        assert!(!scan(Path::new("/proc"), std::process::id()).targets.iter().any(|t| t.path == path));
        drop(ledger);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn mkfifo(path: &Path) {
        fgpu_core::sys::files::mkfifo(path, 0o600).unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
    }

    /// Lets a read blocked on opening `fifo` go on (and see its end), so no thread of the
    /// test stays stuck.
    fn release(fifo: &Path) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo);
    }

    /// F1 of the second security review: a tenant maps a file of its own, of a ledger's
    /// size, under a path that starts with `/SYSV` on a FUSE mount that never answers, and
    /// root's `status --all` (and every scrape) hung on it. A fake /proc stands for it: the
    /// tenant's `map_files` entry is a FIFO, whose open blocks as that FUSE open does; its
    /// file claims the real ledger's id as its inode (to relabel or hide that ledger); and
    /// another process's maps never answer at all.
    #[test]
    fn a_tenant_can_neither_stall_the_scan_nor_pass_its_file_for_a_ledger() {
        use fgpu_core::ledger::Ledger;
        let dir = std::env::temp_dir().join(format!("fgpu-cli-scan-stall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        let ledger = Ledger::open_or_create(&path).unwrap();
        let shmid = ledger.shmid();
        let device = fgpu_core::ledger::maps::shm_device().expect("the shmem device");
        let other_device = if device == "00:99" { "00:98" } else { "00:99" };
        let fake = dir.join("proc");
        let size = SEGMENT_SIZE as u64;
        let ranges = [(0x7f00_0000_0000u64, "/SYSVfs/x"), (0x7f10_0000_0000, "/SYSV00000000 (deleted)")];
        let mut fifos = Vec::new();
        // 4242 maps the ledger (the true line a member shows) and its own file; 4444 maps
        // only its own file, claiming the ledger's id; 4343's maps never answer.
        for (pid, lines) in [(4242u32, &ranges[..]), (4444, &ranges[..1])] {
            let p = fake.join(pid.to_string());
            std::fs::create_dir_all(p.join("map_files")).unwrap();
            std::os::unix::fs::symlink("/proc/self/ns", p.join("ns")).unwrap();
            std::os::unix::fs::symlink("/", p.join("root")).unwrap();
            let mut maps = String::new();
            for (start, name) in lines {
                let dev = if name.starts_with("/SYSVfs") { other_device } else { device };
                maps += &format!("{start:x}-{:x} rw-s 00000000 {dev} {shmid}                    {name}\n", start + size);
                let fifo = p.join("map_files").join(format!("{start:x}-{:x}", start + size));
                mkfifo(&fifo);
                fifos.push(fifo);
            }
            std::fs::write(p.join("maps"), maps).unwrap();
        }
        let silent = fake.join("4343");
        std::fs::create_dir_all(&silent).unwrap();
        mkfifo(&silent.join("maps"));
        fifos.push(silent.join("maps"));

        let (tx, rx) = std::sync::mpsc::channel();
        let root = fake.clone();
        let started = Instant::now();
        std::thread::spawn(move || tx.send(scan(&root, std::process::id())).unwrap());
        let limit = SCAN_BUDGET + Duration::from_secs(3);
        let found = rx.recv_timeout(limit);
        let took = started.elapsed();
        fifos.iter().for_each(|f| release(f));
        let found = found.unwrap_or_else(|_| panic!("the scan of a fake /proc did not return within {limit:?}: it waited on a file or the maps of a tenant"));
        assert!(took <= SCAN_BUDGET + Duration::from_millis(500), "the scan took {took:?}, past its budget of {SCAN_BUDGET:?}");
        let own_ipc = ProcessDir::open(Path::new("/proc"), std::process::id()).unwrap().ns_inode("ipc").unwrap();
        let seen: Vec<_> = found.targets.iter().map(|t| (t.identity.clone().unwrap(), t.path.clone(), t.mapped_by.clone())).collect();
        assert_eq!(
            seen,
            [(format!("ipc:{own_ipc}:shm:{shmid}"), path.clone(), vec![4242])],
            "only the true attachment, through the process that really maps it"
        );
        assert_eq!(found.late, 1, "the process whose maps never answered is counted");
        assert!(found.notes()[0].contains("1 process(es) could not be inspected in time"), "{:?}", found.notes());
        drop(ledger);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
