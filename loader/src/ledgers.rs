//! Which ledgers to show: the one in effect here, one named on the command line, or (with
//! `--all`) every ledger some process on the machine has mapped.
//!
//! `--all` needs no knowledge of where containers keep their ledgers: every capped process
//! maps its ledger, a shared file mapping of exactly [`FILE_SIZE`] bytes, and
//! `/proc/PID/maps` lists it. The file is opened through `/proc/PID/root/PATH`, the path as
//! seen in that process's mount namespace, and the header decides whether it is a ledger.
//! Mappings of one file by many processes are folded by device and inode.

use crate::cli::LedgerSelection;
use fgpu_core::config::{Config, Sources, DEFAULT_LEDGER, ENV_LEDGER};
use fgpu_core::ledger::layout::{FILE_SIZE, MAGIC};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The path as its processes see it.
    pub path: PathBuf,
    /// The path fgpu opens (differs for ledgers in other mount namespaces).
    pub open_path: PathBuf,
    pub origin: Origin,
    /// PIDs (as seen here) that map the file; only for scanned ledgers.
    pub mapped_by: Vec<u32>,
    /// `major:minor:inode` of the file; only for scanned ledgers.
    pub identity: Option<String>,
    /// A problem found while scanning (the file was deleted, could not be opened).
    pub problem: Option<String>,
}

impl Target {
    pub fn plain(path: PathBuf, origin: Origin) -> Target {
        Target { open_path: path.clone(), path, origin, mapped_by: Vec::new(), identity: None, problem: None }
    }
}

/// The ledger a capped process started in this environment would use, and a warning if
/// the configuration could not be read (then the default is assumed, as the shim does).
pub fn in_effect(sources: &dyn Sources) -> (Target, Option<String>) {
    if let Some(value) = sources.env(ENV_LEDGER).filter(|v| !v.is_empty()) {
        return (Target::plain(PathBuf::from(value), Origin::Env), None);
    }
    match Config::from_sources(sources) {
        Ok(config) if config.ledger != Path::new(DEFAULT_LEDGER) => (Target::plain(config.ledger, Origin::ConfigFile), None),
        Ok(_) => (Target::plain(PathBuf::from(DEFAULT_LEDGER), Origin::Default), None),
        Err(e) => (Target::plain(PathBuf::from(DEFAULT_LEDGER), Origin::Default), Some(format!("the configuration is not valid ({e}); showing the default ledger"))),
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

/// Whether a mapping could be a ledger: a shared mapping of a file, of the ledger's size.
pub fn may_be_ledger(m: &Mapping) -> bool {
    m.shared && m.inode != 0 && m.end - m.start == FILE_SIZE as u64 && m.path.starts_with('/')
}

pub struct Scan {
    pub targets: Vec<Target>,
    /// Processes whose maps could not be read.
    pub denied: usize,
}

struct Candidate {
    path: String,
    deleted: bool,
    holders: Vec<(u32, String)>, // (pid, map_files name)
}

/// Scans `proc_root` (normally /proc) for ledgers mapped by any process but `own_pid`.
pub fn scan(proc_root: &Path, own_pid: u32) -> Scan {
    let mut by_file: BTreeMap<(String, u64), Candidate> = BTreeMap::new();
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
        let maps = match std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied += 1;
                continue;
            }
            Err(_) => continue, // exited meanwhile, or a kernel thread
        };
        for m in maps.lines().filter_map(parse_maps_line).filter(may_be_ledger) {
            let entry = by_file
                .entry((m.dev.clone(), m.inode))
                .or_insert_with(|| Candidate { path: m.path.clone(), deleted: m.deleted, holders: Vec::new() });
            if !entry.holders.iter().any(|(p, _)| *p == pid) {
                entry.holders.push((pid, format!("{:x}-{:x}", m.start, m.end)));
            }
        }
    }
    let mut targets = Vec::new();
    for ((dev, inode), candidate) in by_file {
        let identity = Some(format!("{dev}:{inode}"));
        let mapped_by: Vec<u32> = candidate.holders.iter().map(|(p, _)| *p).collect();
        // Is it a ledger at all? Read the magic through the mapping itself (root), else the path.
        let mut verdict: Option<bool> = None;
        let mut open_path = None;
        for (pid, range) in &candidate.holders {
            let pid_dir = proc_root.join(pid.to_string());
            if verdict.is_none() {
                verdict = has_magic(&pid_dir.join("map_files").join(range));
            }
            if open_path.is_none() && !candidate.deleted {
                let path = pid_dir.join("root").join(candidate.path.trim_start_matches('/'));
                if let Some(is_ledger) = has_magic(&path) {
                    verdict.get_or_insert(is_ledger);
                    open_path = Some(path);
                }
            }
            if verdict.is_some() && (open_path.is_some() || candidate.deleted) {
                break;
            }
        }
        if verdict == Some(false) {
            continue;
        }
        let problem = if candidate.deleted {
            Some("the file was deleted while processes still use it; it cannot be opened by path".to_string())
        } else if open_path.is_none() {
            Some("cannot open it through /proc/PID/root (run as root)".to_string())
        } else {
            None
        };
        targets.push(Target {
            path: PathBuf::from(&candidate.path),
            open_path: open_path.unwrap_or_else(|| PathBuf::from(&candidate.path)),
            origin: Origin::Scan,
            mapped_by,
            identity,
            problem,
        });
    }
    Scan { targets, denied }
}

/// `Some(true)` if the file starts with the ledger magic, `None` if it cannot be read.
fn has_magic(path: &Path) -> Option<bool> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut magic = [0u8; 8];
    file.read_exact(&mut magic).ok()?;
    Some(u64::from_le_bytes(magic) == MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_core::config::{ConfigError, ConfigFile};
    use std::collections::HashMap;

    #[test]
    fn maps_lines() {
        // A mapping of exactly one ledger's size.
        let end = 0x7f0a1c000000 + fgpu_core::ledger::layout::FILE_SIZE as u64;
        let line = format!("7f0a1c000000-{end:x} rw-s 00000000 fd:01 1234567                    /tmp/my ledger (deleted)");
        let m = parse_maps_line(&line).unwrap();
        assert_eq!((m.start, m.end, m.shared, m.inode), (0x7f0a1c000000, end, true, 1234567));
        assert_eq!(m.dev, "fd:01");
        assert_eq!(m.path, "/tmp/my ledger");
        assert!(m.deleted);
        assert!(may_be_ledger(&m));
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
    }

    #[test]
    fn ledger_in_effect() {
        let (t, w) = in_effect(&Fixed(HashMap::from([("FGPU_LEDGER", "/run/a")]), Some("ledger = /var/b")));
        assert_eq!((t.path, t.origin, w), (PathBuf::from("/run/a"), Origin::Env, None));
        let (t, _) = in_effect(&Fixed(HashMap::new(), Some("ledger = /var/b")));
        assert_eq!((t.path, t.origin), (PathBuf::from("/var/b"), Origin::ConfigFile));
        let (t, _) = in_effect(&Fixed(HashMap::new(), None));
        assert_eq!((t.path, t.origin), (PathBuf::from(DEFAULT_LEDGER), Origin::Default));
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
        // A foreign file of the same size, shared-mapped: must be ignored.
        let foreign = dir.join("foreign");
        std::fs::write(&foreign, vec![1u8; FILE_SIZE]).unwrap();
        let foreign_file = std::fs::OpenOptions::new().read(true).write(true).open(&foreign).unwrap();
        // SAFETY: maps a file we just created, shared, of exactly FILE_SIZE bytes.
        let map = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), FILE_SIZE, libc::PROT_READ, libc::MAP_SHARED, foreign_file.as_raw_fd(), 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        // Pretend to be someone else so our own process is scanned.
        let found = scan(Path::new("/proc"), 0);
        let ours: Vec<_> = found.targets.iter().filter(|t| t.path == path).collect();
        assert_eq!(ours.len(), 1, "{:?}", found.targets);
        assert!(ours[0].mapped_by.contains(&std::process::id()));
        assert!(ours[0].problem.is_none());
        assert!(!found.targets.iter().any(|t| t.path == foreign));
        // Our own PID is skipped when named.
        assert!(!scan(Path::new("/proc"), std::process::id()).targets.iter().any(|t| t.path == path));
        // SAFETY: unmaps what we mapped above.
        unsafe { libc::munmap(map, FILE_SIZE) };
        drop(ledger);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
