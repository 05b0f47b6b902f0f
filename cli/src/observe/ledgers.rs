//! Which ledgers to show: the one in effect here, one named on the command line, or (with
//! `--all`) every ledger some process on the machine has mapped.
//!
//! The ledger in effect is the one the shim would use here: [`Config`] decides, for both.
//!
//! `--all` needs no knowledge of where containers keep their ledgers: every capped process
//! attaches its ledger, a System V segment of exactly [`SEGMENT_SIZE`] bytes, and
//! `/proc/PID/maps` lists it (`/SYSV00000000` on the kernel's shmem device, the segment id as
//! inode), which is all the scan reads of it ([`scan_of`]). The segment's header names the
//! lock file. That name is written by the ledger's processes, so it is hostile
//! input: it is resolved only inside that process's root directory (`fgpu_core::resolve`),
//! through a descriptor of its `/proc/PID` opened before anything was read of it (a PID
//! reused meanwhile is caught), and the file is only ever opened for reading. The segment
//! is looked up in that process's IPC namespace. Attachments of one segment by many
//! processes are folded by IPC namespace and id.
use super::args::LedgerSelection;
use super::scan::scan_of;
pub use super::scan::SCAN_BUDGET;
pub use super::target::{Found, Origin, Target};
use fgpu_core::config::{Config, LedgerOrigin, Sources};
use std::path::Path;
use std::time::Instant;

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
    /// When the look began: finding the ledgers (a scan) and reading them share one budget
    /// from here ([`crate::observe::report::READ_BUDGET`]).
    pub started: Instant,
}

pub fn resolve(select: &LedgerSelection) -> Resolved {
    let started = Instant::now();
    if let Some(path) = &select.ledger {
        return Resolved { targets: vec![Target::plain(path.clone(), Origin::Argument)], notes: Vec::new(), started };
    }
    if select.all {
        let scan = scan_of(Path::new("/proc"), std::process::id(), None, started + SCAN_BUDGET);
        let mut notes = scan.notes();
        if scan.denied > 0 {
            let hint =
                if fgpu_core::sys::geteuid() == 0 { "not even by root: they belong to a more privileged namespace" } else { "run as root to see every ledger" };
            notes.push(format!("{} process(es) could not be inspected (permission denied; {hint})", scan.denied));
        }
        return Resolved { targets: scan.targets, notes, started };
    }
    let (target, warning) = in_effect(&fgpu_core::config::OsSources);
    Resolved { targets: vec![target], notes: warning.into_iter().collect(), started }
}

/// [`resolve`] for `fgpu status` and `top`: without `--ledger` or `--all`, the ledger in
/// effect and also the ledgers this user's running processes use (each `fgpu run` has a
/// private one that the environment here does not name).
pub fn resolve_with_runs(select: &LedgerSelection) -> Resolved {
    let mut resolved = resolve(select);
    if select.ledger.is_some() || select.all {
        return resolved;
    }
    let own = scan_of(Path::new("/proc"), std::process::id(), Some(fgpu_core::sys::geteuid()), resolved.started + SCAN_BUDGET);
    resolved.notes.extend(own.notes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_core::config::{ConfigError, ConfigFile};
    use std::collections::HashMap;
    use std::path::PathBuf;

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
        fn default_ledger(&self, uid: u32) -> Result<fgpu_core::config::DefaultLedger, fgpu_core::config::NoPlaceLeft> {
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
}
