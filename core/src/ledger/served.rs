//! A served ledger: its data in a sealed memory file (`memfd.rs`) that a keeper
//! (`keeper.rs`; fgpu-kubelet-plugin keeps one per claim) hands to each process over a Unix
//! socket (`SCM_RIGHTS`), beside its lock file. Processes of different IPC namespaces (the
//! pods of one Kubernetes claim) share it, which a System V segment cannot give: a segment
//! lives in one IPC namespace.
//!
//! What stays as in any ledger: the lock file at the ledger's path holds the locks, so
//! liveness is the kernel's (a slot's lock drops with its process), and every process maps
//! the same bytes. What changes: the data is found through the keeper's socket, never
//! through a hint in the lock file.
//!
//! **The protocol.** A process connects to the socket; the keeper answers at once, one line
//! and no request: `FGPU-LEDGER 1 ok` with the memory file's descriptor attached, or
//! `FGPU-LEDGER 1 refused WHY`, then closes. The keeper also writes a record beside the
//! socket (`ledger.id` beside `ledger.sock`: the ledger's identity and the memory file's
//! inode), which names the one ledger in force: a process takes a memory file only if its
//! header has that identity and names the lock file it opened.
//!
//! **A member** ([`Store::open_served`]), with the ledger's init lock held: takes a read
//! lock on [`MAPPED_LOCK`] (kept as long as it lives: "this memory file is in use"), asks
//! the keeper, checks what it is handed (`memfd::check`: sealed, its size; the header; the
//! record), maps it. A keeper that does not answer (it is restarting) or answers "refused"
//! is asked again for up to [`FETCH_WAIT`], the read lock let go in between; then the
//! process refuses GPU memory with one line, as for any ledger it cannot use (fail closed).
//! The keeper decides to make a new ledger only under the same init lock, and only when no
//! read lock is held on [`MAPPED_LOCK`]: a restarted keeper never hands out a fresh ledger
//! while processes use the old one (`keeper.rs`).

use super::error::LedgerError;
use super::layout::*;
use super::lock;
use super::lock_file::{identity, io_err};
use super::memfd;
use super::segment::{header_at, header_ok};
use super::store::{check_cpu, Backing, Store, Trust};
use super::verify::{file_facts, verify, SegmentFacts};
use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// The keeper's socket, in a claim's configuration directory (`/etc/fgpu/ledger.sock`).
pub const SOCKET_NAME: &str = "ledger.sock";
/// How long a member asks a keeper that does not answer, or refuses, before it gives up.
pub const FETCH_WAIT: Duration = Duration::from_secs(5);
/// How long one answer may take.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The first words of every answer.
pub(super) const GREETING: &str = "FGPU-LEDGER 1";

/// The record beside a keeper's socket (`ledger.sock` → `ledger.id`).
pub fn record_path(socket: &Path) -> PathBuf {
    socket.with_extension("id")
}

/// What a keeper records of the ledger it keeps: the ledger's identity (its header's
/// `ledger_id`) and the inode of its memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub id: [u64; 2],
    pub ino: u64,
}

impl Record {
    pub fn text(&self) -> String {
        format!("{:016x}{:016x} {}\n", self.id[0], self.id[1], self.ino)
    }

    pub fn parse(text: &str) -> Option<Record> {
        let (id, ino) = text.trim().split_once(' ')?;
        if id.len() != 32 {
            return None;
        }
        let id = [u64::from_str_radix(&id[..16], 16).ok()?, u64::from_str_radix(&id[16..], 16).ok()?];
        Some(Record { id, ino: ino.trim().parse().ok()? })
    }

    pub fn read(path: &Path) -> Option<Record> {
        Record::parse(&std::fs::read_to_string(path).ok()?)
    }
}

/// A keeper's answer.
pub enum Fetched {
    Ledger(File),
    Refused(String),
}

/// Asks the keeper at `socket` once for the ledger's memory file. An error is the socket's
/// (no keeper listens: `ENOENT`, `ECONNREFUSED`; it is busy: `EAGAIN`; no answer in time).
pub fn fetch(socket: &Path) -> io::Result<Fetched> {
    let conn = sys::unix_connect_nonblocking(socket)?;
    let deadline = Instant::now() + ANSWER_WAIT;
    let (mut text, mut received) = (Vec::new(), None);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no answer within {} s", ANSWER_WAIT.as_secs())));
        }
        if !sys::poll_readable(conn.as_fd(), left)? {
            continue;
        }
        let mut buf = [0u8; 512];
        match sys::recv_with_fd(conn.as_fd(), &mut buf) {
            Ok((0, _)) => break,
            Ok((n, fd)) => {
                text.extend_from_slice(&buf[..n]);
                if received.is_none() {
                    received = fd;
                }
                if text.contains(&b'\n') || text.len() > 4096 {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let line = String::from_utf8_lossy(text.split(|b| *b == b'\n').next().unwrap_or_default()).into_owned();
    let printable = |s: &str| s.chars().map(|c| if c.is_control() { '?' } else { c }).take(400).collect::<String>();
    match line.strip_prefix(GREETING).map(str::trim_start) {
        Some("ok") => match received {
            Some(fd) => Ok(Fetched::Ledger(File::from(fd))),
            None => Err(io::Error::new(io::ErrorKind::InvalidData, "the keeper said ok but passed no memory file")),
        },
        Some(rest) if rest.starts_with("refused") => Ok(Fetched::Refused(printable(rest.trim_start_matches("refused").trim()))),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a ledger keeper's answer: {:?}", printable(&line)))),
    }
}

/// Why one attempt failed: worth asking again (the keeper restarts, recovers, or a stale one
/// answered), or not (what it handed out cannot be used).
enum Attempt {
    Again(String),
    Final(LedgerError),
}

fn unserved(path: &Path, socket: &Path, why: String) -> LedgerError {
    LedgerError::Unserved { path: path.to_path_buf(), socket: socket.to_path_buf(), why }
}

/// The lock file of a served ledger, for a member: it must exist (its keeper makes it) and be
/// a regular file, opened read-write (locks are taken for writing), never through a link.
fn open_member_file(path: &Path) -> Result<File, LedgerError> {
    let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(
        |e| match e.raw_os_error() {
            Some(libc::ELOOP) => LedgerError::Untrusted { path: path.to_path_buf(), why: "is a symbolic link; a ledger is never opened through one".into() },
            _ => io_err(path, "open")(e),
        },
    )?;
    if !file.metadata().map_err(io_err(path, "stat"))?.file_type().is_file() {
        return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: "is not a regular file".into() });
    }
    Ok(file)
}

/// What the kernel says of a memory file, with what its header says, for [`verify`].
fn memfd_facts(memfd: &File, header: &Header) -> SegmentFacts {
    let (uid, mode) = memfd.metadata().map(|m| (m.uid(), m.mode() & 0o777)).unwrap_or((u32::MAX, 0));
    SegmentFacts {
        cuid: uid,
        uid,
        mode,
        lock_dev: header.lock_dev.load(Relaxed),
        lock_ino: header.lock_ino.load(Relaxed),
        sharing: header.sharing.load(Relaxed),
    }
}

/// Unmaps a mapping of a memory file that goes unused.
fn unmap(base: NonNull<u8>) {
    // SAFETY: `base` came from memfd::map in this module and nothing refers into it.
    unsafe { memfd::unmap(base) };
}

/// One member's attempt: ask the keeper, check what it hands out, map it.
fn member_attempt(file: &File, path: &Path, socket: &Path) -> Result<(File, NonNull<u8>), Attempt> {
    let memfd = match fetch(socket) {
        Ok(Fetched::Ledger(memfd)) => memfd,
        Ok(Fetched::Refused(why)) => return Err(Attempt::Again(format!("its keeper refused: {why}"))),
        Err(e) => return Err(Attempt::Again(format!("its keeper does not answer: {e}"))),
    };
    memfd::check(&memfd).map_err(|why| {
        Attempt::Final(LedgerError::Untrusted { path: path.to_path_buf(), why: format!("its keeper handed out a file that is not a ledger: {why}") })
    })?;
    let base = memfd::map(&memfd, true).map_err(|e| Attempt::Final(io_err(path, "map its memory file")(e)))?;
    let header = header_at(base);
    let fail = |e: Attempt| {
        unmap(base);
        Err(e)
    };
    if !header_ok(header) {
        return fail(Attempt::Final(unserved(path, socket, "its keeper handed out a memory file that holds no ledger of this version".into())));
    }
    let me = identity(file).map_err(|e| Attempt::Final(io_err(path, "stat")(e)))?;
    if (header.lock_dev.load(Relaxed), header.lock_ino.load(Relaxed)) != me {
        return fail(Attempt::Final(unserved(
            path,
            socket,
            "its keeper keeps the ledger of another file: this one was replaced while the ledger is in use; accounting cannot be trusted, so GPU memory is refused".into(),
        )));
    }
    let id = [header.ledger_id[0].load(Relaxed), header.ledger_id[1].load(Relaxed)];
    match Record::read(&record_path(socket)) {
        Some(record) if record.id == id => Ok((memfd, base)),
        Some(_) => fail(Attempt::Again("a keeper handed out another ledger than the one in force (a keeper being replaced)".into())),
        None => fail(Attempt::Again(format!("its keeper's record {} cannot be read", record_path(socket).display()))),
    }
}

impl Store {
    /// Opens the served ledger at `path` as one of its processes: its lock file (which its
    /// keeper made), and the memory file the keeper at `socket` hands out. Waits up to
    /// [`FETCH_WAIT`] for a keeper that does not answer yet.
    pub fn open_served(path: &Path, socket: &Path) -> Result<Store, LedgerError> {
        check_cpu(path)?;
        let file = open_member_file(path)?;
        let deadline = Instant::now() + FETCH_WAIT;
        loop {
            lock::ofd_lock_timed(file.as_fd(), INIT_LOCK).map_err(io_err(path, "lock"))?;
            let attempt = match lock::ofd_read_lock(file.as_fd(), MAPPED_LOCK) {
                Ok(true) => {
                    // Beside it a classic lock, whose holder /proc/locks names: a restarted
                    // keeper finds the memory file through this process.
                    let _ = lock::posix_read_lock(file.as_fd(), MAPPED_LOCK);
                    member_attempt(&file, path, socket)
                }
                Ok(false) => Err(Attempt::Again("another process holds a write lock where members mark the ledger in use".into())),
                Err(e) => Err(Attempt::Final(io_err(path, "lock")(e))),
            };
            lock::ofd_unlock(file.as_fd(), INIT_LOCK);
            match attempt {
                Ok((memfd, base)) => {
                    crate::crash_point!("ledger.served.mapped");
                    return Ok(Store { file, base, backing: Backing::Served { memfd }, path: path.to_path_buf(), adopted_from: None, trust: Trust::Member });
                }
                Err(failed) => {
                    lock::ofd_unlock(file.as_fd(), MAPPED_LOCK);
                    lock::posix_unlock(file.as_fd(), MAPPED_LOCK);
                    match failed {
                        Attempt::Again(_) if Instant::now() + RETRY_PAUSE < deadline => std::thread::sleep(RETRY_PAUSE),
                        Attempt::Again(why) => return Err(unserved(path, socket, format!("{why} (asked for {} s)", FETCH_WAIT.as_secs()))),
                        Attempt::Final(e) => return Err(e),
                    }
                }
            }
        }
    }

    /// Opens the served ledger at `path` (the caller's own file system) to look at it: the
    /// keeper at `socket` is asked once. Creates, locks and waits for nothing.
    pub fn observe_served(path: &Path, socket: &Path) -> Result<Store, LedgerError> {
        check_cpu(path)?;
        let file = crate::resolve::open_plain(path).map_err(io_err(path, "open"))?;
        match fetch(socket) {
            Ok(Fetched::Ledger(memfd)) => Store::observe_memfd(file, path, memfd),
            Ok(Fetched::Refused(why)) => Err(unserved(path, socket, format!("its keeper refused: {why}"))),
            Err(e) => Err(unserved(path, socket, format!("its keeper does not answer: {e}"))),
        }
    }

    /// Looks at a served ledger: its lock file, opened read-only by the caller (`path` is how
    /// its processes name it), and its memory file, taken from one of them or from its keeper.
    /// Attached read-only unless it passes [`verify`] (a shared ledger whose file is 0666,
    /// recorded in the memory file), as a segment would be.
    pub fn observe_memfd(file: File, path: &Path, memfd: File) -> Result<Store, LedgerError> {
        check_cpu(path)?;
        memfd::check(&memfd).map_err(|why| LedgerError::Untrusted { path: path.to_path_buf(), why: why.to_string() })?;
        let read_only = memfd::map(&memfd, false).map_err(io_err(path, "map its memory file"))?;
        let header = header_at(read_only);
        if !header_ok(header) {
            unmap(read_only);
            return Err(LedgerError::Untrusted { path: path.to_path_buf(), why: "its memory file holds no ledger of this version".into() });
        }
        let trust = match verify(&file_facts(&file), &memfd_facts(&memfd, header)) {
            Ok(()) => Trust::Verified,
            Err(why) => Trust::Unverified(why.to_string()),
        };
        let base = match trust {
            Trust::Verified => match memfd::map(&memfd, true) {
                Ok(writable) => {
                    unmap(read_only);
                    writable
                }
                Err(_) => read_only,
            },
            _ => read_only,
        };
        let trust = if matches!(trust, Trust::Verified) && base == read_only {
            Trust::Unverified("its memory file cannot be written by this user".into())
        } else {
            trust
        };
        Ok(Store { file, base, backing: Backing::Served { memfd }, path: path.to_path_buf(), adopted_from: None, trust })
    }
}

/// The path a served ledger's memory file records (for `fgpu status --all`), if it holds a
/// ledger of this version.
pub fn recorded_path(memfd: &File) -> Option<PathBuf> {
    memfd::check(memfd).ok()?;
    let base = memfd::map(memfd, false).ok()?;
    let header = header_at(base);
    let path = header_ok(header).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(&super::segment::header_path(header))));
    unmap(base);
    path
}
