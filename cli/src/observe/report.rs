//! What `status`, `top` and `exporter` show: a report per ledger, built from two snapshots
//! (before and after reclaiming dead processes), as JSON and as text.
//!
//! The JSON shape is a stable interface (documented in docs/cli.md): fields are only ever
//! added; `schema` changes if one is removed or changes meaning.

use crate::observe::ledgers::Target;
use fgpu_core::ledger::compute::ComputeView;
use fgpu_core::ledger::{DeviceId, Ledger, LedgerError, ProcessView, Snapshot, Trust};
use serde::Serialize;
use std::os::fd::AsFd;

/// 2: `state` gained `unverified` and `timeout`; processes gained `host_pid_vouched`.
pub const SCHEMA: u32 = 2;

/// How long `status` and a scrape spend in all on the ledgers; one not read by then (a
/// lock file on a hung file system, say) is shown as [`LedgerState::Timeout`].
pub const READ_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub schema: u32,
    pub ledgers: Vec<LedgerReport>,
    /// Each GPU the driver lists and what is committed on it (`placement.rs`): `fgpu
    /// status` without `--ledger`; empty when the driver cannot be asked.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub gpus: Vec<GpuRoom>,
    /// Warnings about how the ledgers were found (also printed on stderr in text mode).
    pub notes: Vec<String>,
}

/// One GPU's memory and what is committed on it (worked out in `placement.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuRoom {
    /// NVML's index.
    pub index: u32,
    pub uuid: String,
    pub total_bytes: u64,
    /// The caps (at most the GPU's memory) of the caller's own live ledgers on it
    /// ([`LedgerReport::own`]).
    pub committed_bytes: u64,
    /// The caller's own live ledgers with a cap on it.
    pub ledgers: usize,
    /// Used on it (as the driver says) beyond what those ledgers hold: other users' and
    /// containers' jobs included.
    pub used_outside_bytes: u64,
    /// What is left: total less committed less used outside.
    pub left_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerState {
    /// Read.
    Ok,
    /// No capped process uses this ledger now (no lock file, or no live shared memory: a
    /// ledger goes away with its last process).
    Missing,
    /// The ledger exists but cannot be used (an untrusted or replaced file, no permission).
    Error,
    /// Read, but it does not pass the rule that lets a tool act on it (its file and shared
    /// memory are not what fgpu makes: `error` says how): shown as its processes wrote it,
    /// dead processes not dropped.
    Unverified,
    /// Not read within the time a look at all ledgers may take.
    Timeout,
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerReport {
    pub path: String,
    /// argument, environment, config-file, default or scan.
    pub source: &'static str,
    /// The path fgpu opened (through /proc/PID/root for other mount namespaces).
    pub open_path: String,
    /// For scanned ledgers: PIDs (as seen here) that map it.
    pub mapped_by: Vec<u32>,
    /// For scanned ledgers: `ipc:NAMESPACE-INODE:shm:SEGMENT-ID`.
    pub id: Option<String>,
    pub state: LedgerState,
    pub error: Option<String>,
    pub devices: Vec<DeviceReport>,
    pub processes: Vec<ProcessReport>,
    /// Processes found dead and reclaimed by this look at the ledger.
    pub reclaimed: Vec<ProcessReport>,
    /// Processes that died while the driver may still hold their memory: what they held
    /// stays counted (in `used_bytes`) until it is freed.
    pub dying: Vec<ProcessReport>,
    /// Processes found dead and left as they are: a ledger found by scanning (`--all`, or
    /// a run of this user's) is only read, and its own processes drop them.
    pub dead: Vec<ProcessReport>,
    /// The ledger is the caller's own: verified, its file and shared memory made and owned
    /// by the user who looks, in this IPC namespace. Only such a ledger's caps count as
    /// committed in placement (`placement.rs`): any other's were written by other users'
    /// processes, which can write anything there.
    #[serde(skip)]
    pub own: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceReport {
    /// Index of the device in this ledger (not a CUDA or NVML index).
    pub index: usize,
    pub uuid: String,
    pub cap_bytes: u64,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    /// Physical memory of the device.
    pub total_bytes: u64,
    /// Allocations refused because of the cap, since the ledger was created.
    pub refusals: u64,
    /// Live processes holding memory on this device.
    pub processes: usize,
    /// The ledger's compute share of this GPU's time (0..1), null when it has none.
    pub compute_share: Option<f64>,
    /// The share of the GPU's time the ledger's kernels took over the last measured window
    /// (2 s, as measured by its processes through NVML or their events), null when nobody
    /// measured lately.
    pub compute_used: Option<f64>,
    /// GPU time the ledger's kernels took in all, as measured (seconds).
    pub compute_seconds: f64,
    /// Time launches of the ledger's processes waited for the share, all threads (seconds).
    pub compute_wait_seconds: f64,
}

impl DeviceReport {
    /// Adds what the ledger holds of the device's compute share.
    pub fn with_compute(mut self, view: &ComputeView) -> DeviceReport {
        let ppm = fgpu_core::compute::PPM as f64;
        self.compute_share = (view.share_ppm != 0).then(|| view.share_ppm as f64 / ppm);
        self.compute_used = view.recent_ppm.map(|u| u as f64 / ppm);
        self.compute_seconds = view.used_ns as f64 / 1e9;
        self.compute_wait_seconds = view.waited_ns as f64 / 1e9;
        self
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessReport {
    /// PID as seen from where fgpu runs; null if the process is not visible here.
    pub pid: Option<u32>,
    /// PID in the process's own PID namespace.
    pub pid_in_namespace: u32,
    /// PID in the host PID namespace, null while unknown.
    pub host_pid: Option<u32>,
    /// True when the kernel vouches for `host_pid` (fgpu runs in the host's PID namespace
    /// and that process holds the slot's lock); false when it is what the ledger states.
    pub host_pid_vouched: bool,
    pub name: String,
    pub started_unix_ms: u64,
    /// Bytes held on all devices, contexts included.
    pub used_bytes: u64,
    /// The part of used_bytes that is CUDA context memory.
    pub context_bytes: u64,
    pub devices: Vec<ProcessDevice>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessDevice {
    pub index: usize,
    pub used_bytes: u64,
    pub context_bytes: u64,
}

fn process_report(p: &ProcessView) -> ProcessReport {
    let devices: Vec<ProcessDevice> = p
        .used
        .iter()
        .zip(p.context.iter())
        .enumerate()
        .filter(|(_, (u, c))| **u > 0 || **c > 0)
        .map(|(index, (u, c))| ProcessDevice { index, used_bytes: *u, context_bytes: *c })
        .collect();
    ProcessReport {
        pid: p.pid_here,
        pid_in_namespace: p.pid,
        host_pid: p.host_pid,
        host_pid_vouched: p.host_pid_vouched,
        name: p.name.clone(),
        started_unix_ms: p.started_unix_ms,
        used_bytes: devices.iter().map(|d| d.used_bytes).sum(),
        context_bytes: devices.iter().map(|d| d.context_bytes).sum(),
        devices,
    }
}

impl LedgerReport {
    pub(crate) fn empty(target: &Target, state: LedgerState, error: Option<String>) -> LedgerReport {
        LedgerReport {
            path: target.path.display().to_string(),
            source: target.origin.as_str(),
            open_path: target.open_path.display().to_string(),
            mapped_by: target.mapped_by.clone(),
            id: target.identity.clone(),
            state,
            error,
            devices: Vec::new(),
            processes: Vec::new(),
            reclaimed: Vec::new(),
            dying: Vec::new(),
            dead: Vec::new(),
            own: false,
        }
    }

    /// Builds the report from a snapshot taken before reclaiming and one taken after.
    pub fn from_snapshots(target: &Target, before: &Snapshot, after: &Snapshot) -> LedgerReport {
        let mut report = LedgerReport::empty(target, LedgerState::Ok, None);
        let live: Vec<&ProcessView> = after.processes.iter().filter(|p| p.alive).collect();
        // Dead before and gone after: dropped by this look (one kept as dying is not).
        report.reclaimed = before
            .processes
            .iter()
            .filter(|p| !p.alive)
            .filter(|p| !after.processes.iter().any(|l| l.slot == p.slot && l.pid == p.pid && l.started_unix_ms == p.started_unix_ms))
            .map(process_report)
            .collect();
        report.processes = live.iter().map(|p| process_report(p)).collect();
        report.dying = after.processes.iter().filter(|p| p.dying).map(process_report).collect();
        report.dead = after.processes.iter().filter(|p| !p.alive && !p.dying).map(process_report).collect();
        report.processes.sort_by_key(|p| (p.devices.first().map(|d| d.index), std::cmp::Reverse(p.used_bytes), p.pid_in_namespace));
        report.devices = after
            .devices
            .iter()
            .map(|d| DeviceReport {
                index: d.id.0,
                uuid: d.uuid_string(),
                cap_bytes: d.cap,
                used_bytes: d.used,
                peak_bytes: d.peak,
                total_bytes: d.total_memory,
                refusals: d.refusals,
                processes: live.iter().filter(|p| p.used.get(d.id.0).copied().unwrap_or(0) > 0).count(),
                compute_share: None,
                compute_used: None,
                compute_seconds: 0.0,
                compute_wait_seconds: 0.0,
            })
            .collect();
        report
    }
}

/// Opens a ledger, reclaims dead processes if it may, and reports. Never creates, changes
/// or waits on a file.
pub fn read(target: &Target) -> LedgerReport {
    if let Some(problem) = &target.problem {
        return LedgerReport::empty(target, LedgerState::Error, Some(problem.clone()));
    }
    match open(target) {
        Ok(ledger) => {
            // A ledger found by scanning is another user's or another job's: read, never
            // changed. One named here (argument, environment, configuration, default) is
            // the caller's, and its dead processes are dropped once the driver lets their
            // memory go.
            let before = ledger.snapshot(None);
            if target.found.is_none() {
                ledger.set_still_held(Box::new(crate::driver::lists::may_still_hold));
                ledger.reclaim_dead(None);
            }
            let after = ledger.snapshot(None);
            let mut report = LedgerReport::from_snapshots(target, &before, &after);
            let now = fgpu_core::log::monotonic_ns();
            report.devices = report
                .devices
                .into_iter()
                .map(|d| {
                    let view = ledger.compute_view(DeviceId(d.index), now);
                    d.with_compute(&view)
                })
                .collect();
            // Whether the path still names the file the ledger's processes lock is asked
            // only of a ledger named here, in this process's own file system. A scanned
            // ledger's path was written by its processes, and means something only inside
            // their root, where `open` just resolved it: asked here, the answer would tell
            // them whether a path of their choosing exists in this one.
            if target.found.is_none() {
                report.error = ledger.file_problem();
            }
            if let Trust::Unverified(why) = ledger.trust() {
                report.state = LedgerState::Unverified;
                report.error = Some(format!("not verified, shown as its processes wrote it and left alone: {why}"));
            }
            report.own = is_own(target, &ledger);
            report
        }
        Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => LedgerReport::empty(target, LedgerState::Missing, None),
        Err(LedgerError::NotInUse { .. }) => LedgerReport::empty(target, LedgerState::Missing, None),
        Err(e) => LedgerReport::empty(target, LedgerState::Error, Some(e.to_string())),
    }
}

/// Whether `ledger` is the caller's own (see [`LedgerReport::own`]): what the kernel says
/// of its file and segment, never what the segment's bytes say.
fn is_own(target: &Target, ledger: &Ledger) -> bool {
    let here = target.found.as_ref().is_none_or(|f| !f.other_ipc);
    if !here || !matches!(ledger.trust(), Trust::Verified) {
        return false;
    }
    let me = fgpu_core::sys::geteuid();
    let file_owner = fgpu_core::sys::fstat(ledger.lock_file()).map(|st| st.st_uid).ok();
    // The segment is looked up by id in this IPC namespace, which is the ledger's (`here`).
    let segment = fgpu_core::sys::shm_stat(ledger.shmid()).map(|ds| (ds.shm_perm.cuid, ds.shm_perm.uid));
    file_owner == Some(me) && segment == Some((me, me))
}

/// Opens a target as an observer: a scanned one inside the root, and from the IPC
/// namespace, of the process it was found through.
fn open(target: &Target) -> Result<Ledger, LedgerError> {
    let Some(found) = &target.found else { return Ledger::open_existing(&target.open_path) };
    let path = &target.path;
    let gone = |op: &'static str| move |source: std::io::Error| LedgerError::Io { path: path.clone(), op, source };
    let root = found.process.root().map_err(gone("reach the root directory of the process that maps it"))?;
    // A path that leads nowhere inside the root of the process that maps the ledger is
    // not a missing ledger (that process runs): it is one that cannot be trusted.
    let (file, _) = fgpu_core::resolve::open_in_root(root.as_fd(), path).map_err(|e| LedgerError::Untrusted {
        path: path.clone(),
        why: format!("cannot be opened inside the root of PID {}, which maps it: {e}", found.process.pid),
    })?;
    let ns =
        if found.other_ipc { Some(found.process.open_entry("ns/ipc").map_err(gone("reach the IPC namespace of the process that maps it"))?) } else { None };
    if !found.process.alive() {
        return Err(LedgerError::NotInUse { path: path.clone() });
    }
    Ledger::observe_file(file, path, Some(found.shmid), ns.as_ref())
}

/// Reads every target, in parallel, within [`READ_BUDGET`] of the start of the look (the
/// scan that found them included): a ledger not read by then is reported as
/// [`LedgerState::Timeout`] (its read goes on in the background and is dropped; a target
/// whose earlier read is still running is not read again meanwhile).
pub fn collect(resolved: crate::observe::ledgers::Resolved) -> StatusReport {
    collect_with(resolved, read, READ_BUDGET)
}

fn collect_with(resolved: crate::observe::ledgers::Resolved, read: fn(&Target) -> LedgerReport, budget: std::time::Duration) -> StatusReport {
    use std::collections::HashSet;
    use std::sync::{mpsc, Mutex};
    static RUNNING: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = |t: &Target| t.identity.clone().unwrap_or_else(|| t.open_path.display().to_string());
    let deadline = resolved.started + budget;
    let (tx, rx) = mpsc::channel();
    let mut ledgers: Vec<Option<LedgerReport>> = vec![None; resolved.targets.len()];
    for (index, target) in resolved.targets.iter().enumerate() {
        let k = key(target);
        {
            let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            if !running.get_or_insert_with(HashSet::new).insert(k.clone()) {
                continue; // an earlier read of it is still stuck
            }
        }
        let (tx, owned) = (tx.clone(), target.clone());
        let spawned = std::thread::Builder::new().name("fgpu-read".into()).spawn(move || {
            let report = read(&owned);
            if let Some(set) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                set.remove(&k);
            }
            let _ = tx.send((index, report));
        });
        if spawned.is_err() {
            ledgers[index] = Some(read(target));
            if let Some(set) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                set.remove(&key(target));
            }
        }
    }
    drop(tx);
    while ledgers.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((index, report)) => ledgers[index] = Some(report),
            Err(_) => break,
        }
    }
    let ledgers = ledgers
        .into_iter()
        .zip(&resolved.targets)
        .map(|(report, target)| {
            report.unwrap_or_else(|| {
                LedgerReport::empty(
                    target,
                    LedgerState::Timeout,
                    Some(format!("not read within {:.1} s (its file or shared memory did not answer)", budget.as_secs_f64())),
                )
            })
        })
        .collect();
    StatusReport { schema: SCHEMA, ledgers, notes: resolved.notes, gpus: Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::fixtures::{process_view, snapshot, GIB};
    use crate::observe::ledgers::Origin;
    use crate::observe::text::render_text;

    #[test]
    fn dead_processes_are_reported_as_reclaimed_not_as_holding() {
        let target = Target::plain("/l".into(), Origin::Env);
        let before = snapshot(vec![process_view(0, 10, true, 3 * GIB, GIB / 4), process_view(1, 11, false, 2 * GIB, 0)], 5 * GIB);
        let after = snapshot(vec![process_view(0, 10, true, 3 * GIB, GIB / 4)], 3 * GIB);
        let r = LedgerReport::from_snapshots(&target, &before, &after);
        assert_eq!(r.processes.len(), 1);
        assert_eq!(r.processes[0].pid, Some(10));
        assert_eq!(r.processes[0].used_bytes, 3 * GIB);
        assert_eq!(r.processes[0].context_bytes, GIB / 4);
        assert_eq!(r.reclaimed.len(), 1);
        assert_eq!((r.reclaimed[0].pid, r.reclaimed[0].used_bytes), (Some(11), 2 * GIB));
        assert_eq!(r.devices[0].used_bytes, 3 * GIB);
        assert_eq!(r.devices[0].processes, 1);
        assert_eq!(r.devices[0].uuid, "GPU-abababab-abab-abab-abab-abababababab");
        let text = render_text(&StatusReport { schema: 1, ledgers: vec![r.clone()], notes: vec![], gpus: vec![] }, 100);
        assert!(text.contains("Reclaimed: PID 11 (p11)"), "{text}");
        assert!(text.contains("3 GiB of 8 GiB cap (38%)"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["source"], "environment");
        assert_eq!(json["state"], "ok");
        assert_eq!(json["devices"][0]["cap_bytes"], 8 * GIB);
        assert_eq!(json["processes"][0]["host_pid"], 1010);
    }

    #[test]
    fn a_slot_reused_by_a_new_process_is_not_reclaimed_twice() {
        let target = Target::plain("/l".into(), Origin::Env);
        let before = snapshot(vec![process_view(0, 10, false, GIB, 0)], GIB);
        let after = snapshot(vec![process_view(0, 10, true, GIB, 0)], GIB);
        let r = LedgerReport::from_snapshots(&target, &before, &after);
        assert!(r.reclaimed.is_empty());
        assert_eq!(r.processes.len(), 1);
    }

    #[test]
    fn a_ledger_not_read_in_time_is_shown_as_such_and_the_others_are_not_held_up() {
        fn slow_or_fast(target: &Target) -> LedgerReport {
            if target.path.ends_with("slow") {
                std::thread::sleep(std::time::Duration::from_secs(3));
            }
            LedgerReport::empty(target, LedgerState::Missing, None)
        }
        let targets = ["/a/slow", "/b/fast", "/c/fast"].iter().map(|p| Target::plain(p.into(), Origin::Argument)).collect();
        let started = std::time::Instant::now();
        let report = collect_with(
            crate::observe::ledgers::Resolved { targets, notes: vec![], started: std::time::Instant::now() },
            slow_or_fast,
            std::time::Duration::from_millis(300),
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "waited for the slow one: {:?}", started.elapsed());
        let states: Vec<LedgerState> = report.ledgers.iter().map(|l| l.state).collect();
        assert_eq!(states, [LedgerState::Timeout, LedgerState::Missing, LedgerState::Missing]);
        assert!(report.ledgers[0].error.as_deref().unwrap().contains("not read within 0.3 s"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["ledgers"][0]["state"], "timeout");
        // Still stuck: not read again (no pile of threads on a hung file system).
        let again = collect_with(
            crate::observe::ledgers::Resolved {
                targets: vec![Target::plain("/a/slow".into(), Origin::Argument)],
                notes: vec![],
                started: std::time::Instant::now(),
            },
            slow_or_fast,
            std::time::Duration::from_millis(100),
        );
        assert_eq!(again.ledgers[0].state, LedgerState::Timeout);
    }

    #[test]
    fn missing_and_broken_ledgers() {
        let dir = std::env::temp_dir().join(format!("fgpu-cli-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = read(&Target::plain(dir.join("nothing"), Origin::Argument));
        assert_eq!(missing.state, LedgerState::Missing);
        // A file that names no live ledger: nobody uses it.
        std::fs::write(dir.join("foreign"), b"not a ledger at all, really").unwrap();
        let foreign = read(&Target::plain(dir.join("foreign"), Origin::Argument));
        assert_eq!(foreign.state, LedgerState::Missing);
        // A link is never followed.
        std::os::unix::fs::symlink(dir.join("foreign"), dir.join("link")).unwrap();
        let link = read(&Target::plain(dir.join("link"), Origin::Argument));
        assert_eq!(link.state, LedgerState::Error);
        assert!(link.error.as_deref().unwrap().contains("symbolic link"), "{:?}", link.error);
        let text = render_text(&StatusReport { schema: 1, ledgers: vec![missing, foreign, link], notes: vec![], gpus: vec![] }, 80);
        assert!(text.contains("Not in use") && text.contains("Cannot be read"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
