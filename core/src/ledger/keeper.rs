//! The keeper of a served ledger (`served.rs`): it makes the ledger's lock file and its
//! sealed memory file, writes the record of the ledger in force beside its socket, and hands
//! the memory file to every process that connects ([`serve`]). fgpu-kubelet-plugin keeps one
//! per prepared claim; the claim's pods reach the socket through the claim's configuration
//! directory, which only they mount.
//!
//! **Who holds the ledger, and across what.** The memory file lives while anyone holds a
//! descriptor or a mapping of it: the keeper, and every member (each keeps its descriptor
//! open for as long as it runs). The keeper's process can die at any time (the plugin's
//! container restarts, and all its processes die with it; an upgrade replaces it): the
//! members keep the ledger, and go on capping each other. What must never happen is that a
//! new keeper hands the claim's next processes a fresh, empty ledger beside the one in use.
//! So a keeper decides, with the ledger's init lock held (members take it while they are
//! handed the file):
//!
//! - **No read lock on [`MAPPED_LOCK`]**: no process uses the ledger (a member takes that
//!   lock before it is handed the file and holds it until it dies; the kernel drops it
//!   then). A new ledger is made, and recorded.
//! - **Such a lock is held**: the ledger in use is recovered from one of its members. Which
//!   processes hold locks on the lock file, `/proc/locks` says with their PIDs (each member
//!   holds a classic lock there too). The memory file is taken from one of them with
//!   `pidfd_getfd(2)` (no file is opened: `memfd.rs`), and kept only if it is what the record
//!   names (its inode, the ledger's identity in its header) and records this lock file. The
//!   record is the keeper's own file (root's, in a directory the pods mount read-only), so a
//!   process cannot pass a memory file of its own for the ledger.
//! - **Held, but no member can be reached** (the keeper does not see the host's PID
//!   namespace, or the record is gone): the keeper refuses every process that asks, with the
//!   reason, and tries again every [`RETRY`] (between two processes' questions: a member
//!   holds the init lock while it asks, and lets go of its read lock before it asks
//!   again); once the members have exited, a new ledger is made. Fail closed: the new processes are refused GPU memory
//!   meanwhile, never given a cap of their own.

use super::layout::*;
use super::lock;
use super::lock_file::identity;
use super::memfd;
use super::segment::{header_at, header_ok};
use super::served::{record_path, Record, GREETING};
use super::store::{init_header, Sharing};
use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a keeper that cannot reach the ledger in use tries again.
pub const RETRY: Duration = Duration::from_millis(500);
/// How long a keeper's thread sleeps when nothing happens (a stop wakes it at once).
const IDLE: Duration = Duration::from_secs(1);

/// Where a keeper's files are.
#[derive(Debug, Clone)]
pub struct KeeperPaths {
    /// The lock file, as the keeper reaches it (the claim's ledger directory on the host).
    pub lock: PathBuf,
    /// The ledger's path as its processes name it (recorded in the header; observers show it).
    pub recorded: PathBuf,
    /// The socket, as the keeper reaches it; the record goes beside it.
    pub socket: PathBuf,
    /// Goes into the memory file's name (`fgpu-ledger:LABEL`).
    pub label: String,
}

/// Why a keeper cannot take over the ledger its processes use.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("processes use the ledger, but the record of it ({}) cannot be read, so its memory file cannot be told from another", .0.display())]
    NoRecord(PathBuf),
    #[error("processes use the ledger, but its lock file cannot be looked at: {0}")]
    LockFile(io::Error),
    #[error("processes use the ledger, and none of them can be seen from here (the keeper must run in the host's PID namespace to take the ledger over from them); new processes are refused GPU memory until they exit")]
    NoneSeen,
    #[error("{processes} process(es) use the ledger, and its memory file could be taken from none of them ({last}); new processes are refused GPU memory until they exit")]
    NotTaken { processes: usize, last: String },
}

/// What a keeper found when it settled which ledger it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// No process used a ledger: a new one was made.
    Created,
    /// Processes use a ledger: it was taken from this one (PID as the keeper sees it).
    Recovered { from: u32 },
    /// Processes use a ledger that cannot be reached: every process is refused, with this.
    Waiting(String),
}

enum State {
    Ready(File),
    Waiting(String),
}

/// The keeper of one served ledger.
pub struct Keeper {
    paths: KeeperPaths,
    lock: File,
    state: Mutex<State>,
    /// How many processes it handed the ledger, and refused.
    pub handed: AtomicU64,
    pub refused: AtomicU64,
}

impl Keeper {
    /// Opens (or makes) the ledger's lock file and settles which ledger is kept: the one in
    /// use, or a new one.
    pub fn open(paths: KeeperPaths) -> io::Result<(Keeper, Settled)> {
        let lock = open_or_create_lock(&paths.lock)?;
        let keeper = Keeper { paths, lock, state: Mutex::new(State::Waiting("not settled yet".into())), handed: AtomicU64::new(0), refused: AtomicU64::new(0) };
        lock::ofd_lock_timed(keeper.lock.as_fd(), INIT_LOCK)?;
        let settled = keeper.settle_locked();
        lock::ofd_unlock(keeper.lock.as_fd(), INIT_LOCK);
        Ok((keeper, settled))
    }

    pub fn paths(&self) -> &KeeperPaths {
        &self.paths
    }

    /// Why the keeper refuses processes, if it does.
    pub fn waiting(&self) -> Option<String> {
        match &*self.state() {
            State::Ready(_) => None,
            State::Waiting(why) => Some(why.clone()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With the init lock held: a new ledger if none is in use, else the one in use.
    fn settle_locked(&self) -> Settled {
        let in_use = lock::ofd_any_held(self.lock.as_fd(), MAPPED_LOCK, 1).unwrap_or(true);
        let (state, settled) = if in_use {
            match self.recover() {
                Ok((memfd, pid)) => (State::Ready(memfd), Settled::Recovered { from: pid }),
                Err(e) => (State::Waiting(e.to_string()), Settled::Waiting(e.to_string())),
            }
        } else {
            match self.create() {
                Ok(memfd) => (State::Ready(memfd), Settled::Created),
                Err(e) => {
                    let why = format!("cannot make the ledger's memory file: {e}");
                    (State::Waiting(why.clone()), Settled::Waiting(why))
                }
            }
        };
        *self.state() = state;
        settled
    }

    /// A new ledger: its memory file, its header (this lock file, the recorded path), and
    /// the record, written before any process can be handed it.
    fn create(&self) -> io::Result<File> {
        let memfd = memfd::create(&self.paths.label)?;
        let base = memfd::map(&memfd, true)?;
        let header = header_at(base);
        init_header(header, &self.paths.recorded, Sharing::Shared, identity(&self.lock)?, 0, 0);
        let id = [header.ledger_id[0].load(Ordering::Relaxed), header.ledger_id[1].load(Ordering::Relaxed)];
        // SAFETY: mapped above; `header` is not used past this point.
        unsafe { memfd::unmap(base) };
        write_record(&self.paths.socket, &Record { id, ino: memfd.metadata()?.ino() })?;
        Ok(memfd)
    }

    /// The memory file of the ledger in use, taken from one of the processes that hold
    /// locks on its lock file, and the PID it was taken from.
    fn recover(&self) -> Result<(File, u32), Unreachable> {
        let record_file = record_path(&self.paths.socket);
        let record = Record::read(&record_file).ok_or(Unreachable::NoRecord(record_file))?;
        let me = identity(&self.lock).map_err(Unreachable::LockFile)?;
        let holders = posix_lock_holders(&self.lock);
        if holders.is_empty() {
            return Err(Unreachable::NoneSeen);
        }
        let mut last = String::new();
        for pid in &holders {
            match memfd::take_from_process(Path::new("/proc"), *pid, Some(record.ino), &|f| holds(f, &record, me)) {
                Ok(Some(memfd)) => return Ok((memfd, *pid)),
                Ok(None) => last = format!("PID {pid} holds no memory file of it"),
                Err(e) => last = format!("PID {pid}: {e}"),
            }
        }
        Err(Unreachable::NotTaken { processes: holders.len(), last })
    }

    /// A keeper waiting for the ledger in use tries again (its serving thread calls this
    /// every [`RETRY`]). It never waits for the init lock: members hold it while they ask.
    pub fn retry(&self) {
        if self.waiting().is_some() && matches!(lock::ofd_lock(self.lock.as_fd(), INIT_LOCK, false), Ok(true)) {
            self.settle_locked();
            lock::ofd_unlock(self.lock.as_fd(), INIT_LOCK);
        }
    }

    /// Answers one process: the memory file, or why not.
    pub fn answer(&self, conn: &UnixStream) {
        let state = self.state();
        let sent = match &*state {
            State::Ready(memfd) => {
                self.handed.fetch_add(1, Ordering::Relaxed);
                sys::send_with_fd(conn.as_fd(), format!("{GREETING} ok\n").as_bytes(), Some(memfd.as_fd()))
            }
            State::Waiting(why) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                sys::send_with_fd(conn.as_fd(), format!("{GREETING} refused {}\n", why.replace('\n', " ")).as_bytes(), None)
            }
        };
        // A process that hung up already is no one's loss.
        let _ = sent;
    }
}

/// Whether a memory file holds the ledger `record` names, of the lock file `me`.
fn holds(memfd: &File, record: &Record, me: (u64, u64)) -> bool {
    let Ok(base) = memfd::map(memfd, false) else { return false };
    let header = header_at(base);
    let ours = header_ok(header)
        && [header.ledger_id[0].load(Ordering::Relaxed), header.ledger_id[1].load(Ordering::Relaxed)] == record.id
        && (header.lock_dev.load(Ordering::Relaxed), header.lock_ino.load(Ordering::Relaxed)) == me;
    // SAFETY: mapped above; `header` is not used past this point.
    unsafe { memfd::unmap(base) };
    ours
}

/// The ledger's lock file, made by the keeper (0666: the claim's pods may run as any user,
/// and every process of a ledger locks it for writing). One of another owner is refused.
fn open_or_create_lock(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    if meta.uid() != sys::geteuid() {
        return Err(io::Error::other(format!("{} belongs to uid {}, not to the keeper", path.display(), meta.uid())));
    }
    if meta.mode() & 0o7777 != 0o666 {
        file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    }
    Ok(file)
}

/// Writes the record beside the socket, atomically (a new file renamed into place), 0644.
fn write_record(socket: &Path, record: &Record) -> io::Result<()> {
    let path = record_path(socket);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(&temporary)?;
    std::io::Write::write_all(&mut file, record.text().as_bytes())?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.sync_all()?;
    std::fs::rename(&temporary, &path)
}

/// The PIDs (in this process's PID namespace) of the processes that hold classic locks on
/// `file`, from `/proc/locks` (a process of another PID namespace is not listed).
fn posix_lock_holders(file: &File) -> Vec<u32> {
    let Ok(meta) = file.metadata() else { return Vec::new() };
    let dev = meta.dev();
    let (major, minor) = (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff), (dev & 0xff) | ((dev >> 12) & !0xff));
    let want = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let mut pids: Vec<u32> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "N: POSIX ADVISORY READ PID MAJ:MIN:INO START END"; a waiter's line has "->".
            (fields.get(1) == Some(&"POSIX") && fields.get(5) == Some(&want.as_str())).then(|| fields.get(4)?.parse().ok()).flatten()
        })
        .filter(|pid| *pid > 0)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A keeper answering on its socket, on a thread of its own, until dropped.
pub struct Serving {
    keeper: Arc<Keeper>,
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Serving {
    pub fn keeper(&self) -> &Keeper {
        &self.keeper
    }
}

/// Serves `keeper` on its socket: bound under a hidden name, made 0666 (the claim's pods may
/// run as any user; the directory is what keeps others out), then renamed into place, so the
/// path never names a socket with another mode, and a socket a keeper before left is
/// replaced at once.
pub fn serve(keeper: Keeper) -> io::Result<Serving> {
    let socket = keeper.paths.socket.clone();
    // No longer than `ledger.sock` (a PID is at most 7 hex digits): whenever the socket's
    // own path fits in `sun_path`, so does this one (under kubelet's plugin directory the
    // claim's socket takes 99 of its 107 bytes).
    let hidden = socket.with_file_name(format!(".s{:x}", std::process::id()));
    let _ = std::fs::remove_file(&hidden);
    let listener = UnixListener::bind(&hidden)?;
    // Accepted only once poll says a process connected; one that hung up meanwhile must
    // not block the thread.
    listener.set_nonblocking(true)?;
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o666))?;
    std::fs::rename(&hidden, &socket)?;
    let keeper = Arc::new(keeper);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (keeper, stop, listener) = (keeper.clone(), stop.clone(), listener.try_clone()?);
        std::thread::Builder::new().name("fgpu-keeper".into()).spawn(move || {
            let mut tried = Instant::now();
            loop {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                // Woken by a process that connects, by `Drop` (shutdown), or to try again.
                let ready = sys::poll_readable(listener.as_fd(), if keeper.waiting().is_some() { RETRY } else { IDLE }).unwrap_or(false);
                if ready {
                    match listener.accept() {
                        Ok((conn, _)) => keeper.answer(&conn),
                        Err(_) if stop.load(Ordering::Acquire) => return,
                        // Out of descriptors, say: answer the next one a moment later.
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                if tried.elapsed() >= RETRY {
                    tried = Instant::now();
                    keeper.retry();
                }
            }
        })?
    };
    Ok(Serving { keeper, listener, stop, thread: Some(thread) })
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        sys::shutdown(self.listener.as_fd());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
#[path = "served_tests.rs"]
mod tests;
