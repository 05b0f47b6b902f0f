//! Which ledgers to show: the one in effect here, one named on the command line, or (with
//! `--all`) every ledger some process on the machine has mapped.
//!
//! The ledger in effect is the one the shim would use here: [`Config`] decides, for both.
//!
//! `--all` needs no knowledge of where containers keep their ledgers: every capped process
//! attaches its ledger, a System V segment of exactly [`SEGMENT_SIZE`] bytes, and
//! `/proc/PID/maps` lists it (`/SYSV00000000`, the segment id as inode). The segment's header
//! names the lock file. That name is written by the ledger's processes, so it is hostile
//! input: it is resolved only inside that process's root directory (`fgpu_core::resolve`),
//! through a descriptor of its `/proc/PID` opened before anything was read of it (a PID
//! reused meanwhile is caught), and the file is only ever opened for reading. The segment
//! is looked up in that process's IPC namespace. Attachments of one segment by many
//! processes are folded by IPC namespace and id.

use crate::args::LedgerSelection;
use fgpu_core::config::{Config, LedgerOrigin, Sources};
use fgpu_core::ledger::layout::SEGMENT_SIZE;
use fgpu_core::ledger::store;
use fgpu_core::resolve::ProcessDir;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a ledger to show came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--ledger FILE`.
    Argument,
    /// `FGPU_LEDGER` in this environment.
    Env,
    /// `ledger =` in the configuration file.
    ConfigFile,
    /// Nothing set: the built-in default.
    Default,
    /// Found mapped by running processes.
    Scan,
}

impl Origin {
    pub fn as_str(&self) -> &'static str {
        match self {
            Origin::Argument => "argument",
            Origin::Env => "environment",
            Origin::ConfigFile => "config-file",
            Origin::Default => "default",
            Origin::Scan => "scan",
        }
    }
}

/// One ledger to show.
#[derive(Debug, Clone)]
pub struct Target {
    /// The path as its processes see it.
    pub path: PathBuf,
    /// Where fgpu resolves it: the path itself, or `/proc/PID/root` + the path for a ledger
    /// found mapped by a process (resolved inside that root, never through it).
    pub open_path: PathBuf,
    pub origin: Origin,
    /// PIDs (as seen here) that map the file; only for scanned ledgers.
    pub mapped_by: Vec<u32>,
    /// `ipc:NAMESPACE-INODE:shm:SEGMENT-ID`; only for scanned ledgers.
    pub identity: Option<String>,
    /// A problem found while scanning.
    pub problem: Option<String>,
    /// For a scanned ledger: the process it was found through, and its segment.
    pub found: Option<Arc<Found>>,
}

/// A ledger found mapped by a process.
#[derive(Debug)]
pub struct Found {
    /// `/proc/PID` of a process that maps the segment, opened before it was looked at.
    pub process: Arc<ProcessDir>,
    pub shmid: i32,
    /// The segment lives in another IPC namespace than this process's (that process's).
    pub other_ipc: bool,
}

impl Target {
    pub fn plain(path: PathBuf, origin: Origin) -> Target {
        Target { open_path: path.clone(), path, origin, mapped_by: Vec::new(), identity: None, problem: None, found: None }
    }
}

/// The ledger a capped process started in this environment would use, and a warning if
/// the configuration could not be read (then the default is assumed, as the shim does).
pub fn in_effect(sources: &dyn Sources) -> (Target, Option<String>) {
    match Config::from_sources(sources) {
        Ok(config) => {
            let origin = match config.ledger_origin {
                LedgerOrigin::Default => Origin::Default,
                LedgerOrigin::Env => Origin::Env,
                LedgerOrigin::File => Origin::ConfigFile,
            };
            let note = config.ledger_error.or(config.ledger_note);
            (Target::plain(config.ledger, origin), note)
        }
        Err(e) => {
            let default = match sources.default_ledger(sources.euid()) {
                Ok(d) => d.path,
                Err(_) => fgpu_core::ledger::default_path::tmp_places(sources.euid()).next().unwrap_or_default(),
            };
            (
                Target::plain(default, Origin::Default),
                Some(format!("the configuration is not valid ({e}); the shim refuses GPU memory until it is fixed; showing the default ledger")),
            )
        }
    }
}

/// What a selection resolves to, with notes for the user (on stderr, or in JSON).
pub struct Resolved {
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
}

pub fn resolve(select: &LedgerSelection) -> Resolved {
    if let Some(path) = &select.ledger {
        return Resolved { targets: vec![Target::plain(path.clone(), Origin::Argument)], notes: Vec::new() };
    }
    if select.all {
        let scan = scan(Path::new("/proc"), std::process::id());
        let mut notes = Vec::new();
        if scan.denied > 0 {
            // SAFETY: geteuid has no preconditions.
            let hint = if unsafe { libc::geteuid() } == 0 {
                "not even by root: they belong to a more privileged namespace"
            } else {
                "run as root to see every ledger"
            };
            notes.push(format!("{} process(es) could not be inspected (permission denied; {hint})", scan.denied));
        }
        return Resolved { targets: scan.targets, notes };
    }
    let (target, warning) = in_effect(&fgpu_core::config::OsSources);
    Resolved { targets: vec![target], notes: warning.into_iter().collect() }
}

/// [`resolve`] for `fgpu status` and `top`: without `--ledger` or `--all`, the ledger in
/// effect and also the ledgers this user's running processes use (each `fgpu run` has a
/// private one that the environment here does not name).
pub fn resolve_with_runs(select: &LedgerSelection) -> Resolved {
    let mut resolved = resolve(select);
    if select.ledger.is_some() || select.all {
        return resolved;
    }
    let own = scan_of(Path::new("/proc"), std::process::id(), Some(fgpu_core::sys::geteuid()));
    let in_effect = resolved.targets[0].path.clone();
    let others: Vec<Target> = own.targets.into_iter().filter(|t| t.path != in_effect).collect();
    if !others.is_empty() {
        resolved.notes.push(format!(
            "also showing {} ledger(s) this user's processes use (each `fgpu run` has its own); `fgpu status --all` shows every ledger",
            others.len()
        ));
        resolved.targets.extend(others);
    }
    resolved
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub shared: bool,
    pub dev: String,
    pub inode: u64,
    pub path: String,
    pub deleted: bool,
}

pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        shared: perms.as_bytes().get(3) == Some(&b's'),
        dev: dev.to_string(),
        inode,
        path: path.to_string(),
        deleted,
    })
}

/// Whether a mapping could be a ledger: a shared System V segment of the ledger's size.
pub fn may_be_ledger(m: &Mapping) -> bool {
    m.shared && m.end - m.start == SEGMENT_SIZE as u64 && m.path.starts_with("/SYSV")
}

pub struct Scan {
    pub targets: Vec<Target>,
    /// Processes whose maps could not be read.
    pub denied: usize,
}

struct Candidate {
    /// (the process, `map_files` name of its attachment)
    holders: Vec<(Arc<ProcessDir>, String)>,
}

/// Scans `proc_root` (normally /proc) for ledgers attached by any process but `own_pid`.
pub fn scan(proc_root: &Path, own_pid: u32) -> Scan {
    scan_of(proc_root, own_pid, None)
}

/// [`scan`], of the processes of one user only.
pub fn scan_of(proc_root: &Path, own_pid: u32, uid: Option<u32>) -> Scan {
    let own_ipc = ProcessDir::open(Path::new("/proc"), std::process::id()).and_then(|p| p.ns_inode("ipc")).unwrap_or(0);
    let mut by_segment: BTreeMap<(u64, u64), Candidate> = BTreeMap::new();
    let mut denied = 0;
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Scan { targets: Vec::new(), denied: 0 };
    };
    let mut pids: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    for pid in pids {
        if pid == own_pid {
            continue;
        }
        // Opened first: whatever is read below is this process's, even if it exits and
        // its PID is reused meanwhile.
        let Ok(process) = ProcessDir::open(proc_root, pid) else { continue };
        if uid.is_some() && process.owner_uid().ok() != uid {
            continue;
        }
        let maps = match process.open_entry("maps").and_then(std::io::read_to_string) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied += 1;
                continue;
            }
            Err(_) => continue, // exited meanwhile, or a kernel thread
        };
        let process = Arc::new(process);
        for m in maps.lines().filter_map(parse_maps_line).filter(may_be_ledger) {
            let Ok(ipc) = process.ns_inode("ipc") else {
                denied += 1;
                continue;
            };
            let entry = by_segment.entry((ipc, m.inode)).or_insert_with(|| Candidate { holders: Vec::new() });
            if !entry.holders.iter().any(|(p, _)| p.pid == pid) {
                entry.holders.push((process.clone(), format!("{:x}-{:x}", m.start, m.end)));
            }
        }
    }
    let mut targets = Vec::new();
    for ((ipc, shmid), candidate) in by_segment {
        let mapped_by: Vec<u32> = candidate.holders.iter().map(|(p, _)| p.pid).collect();
        // The segment's header names its lock file: read it through the attachment (root),
        // else by attaching it here (same IPC namespace).
        let through = candidate.holders.iter().find_map(|(dir, range)| Some((dir.clone(), header_path(dir, range)?)));
        let (dir, path) = match through {
            Some((dir, path)) => (dir, Some(path)),
            None => (candidate.holders[0].0.clone(), (ipc == own_ipc).then(|| store::segment_path(shmid as i32)).flatten()),
        };
        let Some(path) = path else {
            if ipc == own_ipc {
                continue; // not a ledger of this version
            }
            denied += 1;
            continue;
        };
        let open_path = proc_root.join(dir.pid.to_string()).join("root").join(path.strip_prefix("/").unwrap_or(&path));
        targets.push(Target {
            path,
            open_path,
            origin: Origin::Scan,
            mapped_by,
            identity: Some(format!("ipc:{ipc}:shm:{shmid}")),
            problem: None,
            found: Some(Arc::new(Found { process: dir, shmid: shmid as i32, other_ipc: ipc != own_ipc })),
        });
    }
    Scan { targets, denied }
}

/// The lock-file path in a ledger segment read through `map_files` (needs root).
fn header_path(process: &ProcessDir, range: &str) -> Option<PathBuf> {
    let mut file = process.open_entry(&format!("map_files/{range}")).ok()?;
    let mut head = vec![0u8; 512];
    file.read_exact(&mut head).ok()?;
    store::path_in_header_bytes(&head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_core::config::{ConfigError, ConfigFile};
    use std::collections::HashMap;

    #[test]
    fn maps_lines() {
        // An attachment of exactly one ledger's size.
        let end = 0x7f0a1c000000 + SEGMENT_SIZE as u64;
        let line = format!("7f0a1c000000-{end:x} rw-s 00000000 00:01 1234567                    /SYSV00000000 (deleted)");
        let m = parse_maps_line(&line).unwrap();
        assert_eq!((m.start, m.end, m.shared, m.inode), (0x7f0a1c000000, end, true, 1234567));
        assert_eq!(m.dev, "00:01");
        assert_eq!(m.path, "/SYSV00000000");
        assert!(m.deleted);
        assert!(may_be_ledger(&m));
        let file = parse_maps_line(&format!("7f0a1c000000-{end:x} rw-s 00000000 fd:01 1234567 /tmp/ledger")).unwrap();
        assert!(!may_be_ledger(&file), "a file of the same size is not a ledger");
        let private = parse_maps_line("7f0a1c000000-7f0a1c051000 rw-p 00000000 fd:01 1234567 /tmp/x").unwrap();
        assert!(!may_be_ledger(&private));
        let anon = parse_maps_line("7ffd5a1d0000-7ffd5a1f1000 rw-p 00000000 00:00 0                          [stack]").unwrap();
        assert!(!may_be_ledger(&anon));
        let other_size = parse_maps_line("7f0a1c000000-7f0a1c001000 rw-s 00000000 fd:01 1234567 /dev/shm/x").unwrap();
        assert!(!may_be_ledger(&other_size));
        assert!(parse_maps_line("garbage").is_none());
    }

    struct Fixed(HashMap<&'static str, &'static str>, Option<&'static str>);
    impl Sources for Fixed {
        fn env(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|v| v.to_string())
        }
        fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError> {
            Ok(self.1.map(|text| ConfigFile { path: "/etc/fgpu/fgpu.conf".into(), text: text.into(), trusted: true }))
        }
        fn euid(&self) -> u32 {
            1000
        }
        fn default_ledger(&self, uid: u32) -> Result<fgpu_core::config::DefaultLedger, String> {
            Ok(fgpu_core::config::DefaultLedger { path: format!("/tmp/fgpu-{uid}/ledger-ipc1").into(), note: None })
        }
    }

    #[test]
    fn ledger_in_effect() {
        let (t, w) = in_effect(&Fixed(HashMap::from([("FGPU_LEDGER", "/run/a")]), Some("ledger = /var/b")));
        assert_eq!((t.path, t.origin, w), (PathBuf::from("/run/a"), Origin::Env, None));
        // A file that sets a limit pins its ledger: FGPU_LEDGER is ignored, as by the shim.
        let (t, _) = in_effect(&Fixed(HashMap::from([("FGPU_LEDGER", "/tmp/mine")]), Some("limit = 8G\nledger = /srv/fgpu/ledger")));
        assert_eq!((t.path, t.origin), (PathBuf::from("/srv/fgpu/ledger"), Origin::ConfigFile));
        let (t, _) = in_effect(&Fixed(HashMap::new(), Some("ledger = /var/b")));
        assert_eq!((t.path, t.origin), (PathBuf::from("/var/b"), Origin::ConfigFile));
        let (t, _) = in_effect(&Fixed(HashMap::new(), None));
        assert_eq!((t.path, t.origin), (PathBuf::from("/tmp/fgpu-1000/ledger-ipc1"), Origin::Default));
        let (t, w) = in_effect(&Fixed(HashMap::from([("FGPU_LIMIT", "lots")]), None));
        assert_eq!(t.origin, Origin::Default);
        assert!(w.unwrap().contains("FGPU_LIMIT"));
    }

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
}
