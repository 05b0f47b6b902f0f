//! Which PID NVML knows this process by, and which PIDs NVML gives at all
//! (`fgpu_core::nvmlpids`).
//!
//! In the host's PID namespace every driver gives host PIDs, and `getpid()` is one. In a
//! nested namespace (a container without `--pid=host`) it depends on the driver: current
//! drivers give PIDs as this namespace sees them, so `getpid()` again; older ones give host
//! PIDs; some give a container's processes without a memory figure, or not at all. The
//! behaviour is found out from NVML's own lists ([`NvmlPid::observe`]), never assumed:
//! the process's own `getpid()` listed with the memory it holds, or under host PIDs an entry
//! that only this process can be (the movement check where two could).
//!
//! The host PID itself, needed under host PIDs, is known at once in the host's namespace,
//! otherwise asked of the host's `fgpu service` when the process joins its ledger and
//! picked up without waiting when next needed (`fgpu_core::hostpid`); a connect the
//! service's backlog turns away is tried again later, with a bounded backoff, never with a
//! wait. Without a service it is matched in NVML's list as above. No call waits for it, and
//! nothing is allocated to probe.

use fgpu_core::hostpid::{Answer, Request, DEFAULT_SOCKET, ENV_SOCKET};
use fgpu_core::log::{self, Level};
use fgpu_core::log_at;
use fgpu_core::nvmlpids::{Identifier, Look, NvmlPids, Verdict};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// How long an unanswered request is waited for before it counts as failed.
const PATIENCE_NS: u64 = 2_000_000_000;
/// A connect turned away (the service's backlog full) is tried again after this, doubling
/// each time up to [`RETRY_MAX_NS`], at most [`RETRIES`] times.
const RETRY_FIRST_NS: u64 = 20_000_000;
const RETRY_MAX_NS: u64 = 1_000_000_000;
const RETRIES: u32 = 10;

#[derive(Debug, Default)]
enum Query {
    #[default]
    NotAsked,
    Asked {
        request: Request,
        since_ns: u64,
    },
    /// Turned away `tries` times; ask again at `at_ns`.
    Retry {
        at_ns: u64,
        tries: u32,
    },
    Failed(String),
}

/// Which PID NVML knows this process by: the PIDs NVML gives ([`NvmlPids`], found out),
/// and this process's host PID (from the kernel, the host's `fgpu service`, or a match in
/// NVML's list).
#[derive(Debug, Default)]
pub struct NvmlPid {
    /// 0 while unknown.
    known: AtomicU32,
    query: Mutex<Query>,
    /// [`NvmlPids`] as found out so far.
    behaviour: AtomicU8,
    identifier: Mutex<Identifier>,
}

fn socket_path() -> PathBuf {
    std::env::var_os(ENV_SOCKET).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

fn getpid() -> u32 {
    std::process::id()
}

/// The delay before try number `tries` (1-based) of a connect that was turned away.
fn backoff_ns(tries: u32) -> u64 {
    RETRY_FIRST_NS.saturating_mul(1u64 << tries.saturating_sub(1).min(20)).min(RETRY_MAX_NS)
}

impl NvmlPid {
    /// Learns the host PID if the kernel tells it, else sends the request (no waiting).
    pub fn ask(&self) {
        let mut query = self.query.lock();
        if !matches!(*query, Query::NotAsked) {
            return;
        }
        if fgpu_core::pidns::in_host_pidns() {
            self.behaviour.store(NvmlPids::HostNamespace as u8, Ordering::Release);
        }
        if let Some(pid) = fgpu_core::pidns::host_pid() {
            self.known.store(pid, Ordering::Release);
            *query = Query::Failed(String::new());
            return;
        }
        *query = Self::send(0);
    }

    /// A request, or when the service's backlog turns the connect away, a later try.
    fn send(tries: u32) -> Query {
        match Request::send(&socket_path()) {
            Ok(request) => Query::Asked { request, since_ns: log::monotonic_ns() },
            Err(e) if e.retry && tries < RETRIES => {
                log_at!(Level::Debug, "{e}; asking the host's fgpu service again later");
                Query::Retry { at_ns: log::monotonic_ns() + backoff_ns(tries + 1), tries: tries + 1 }
            }
            Err(e) => {
                log_at!(Level::Debug, "the host's fgpu service is not used: {e}");
                Query::Failed(e.message)
            }
        }
    }

    /// The host PID if known by now; `on_learnt` runs once when the service's answer comes.
    pub fn host(&self, on_learnt: impl FnOnce(u32)) -> Option<u32> {
        let known = self.known.load(Ordering::Acquire);
        if known != 0 {
            return Some(known);
        }
        self.ask();
        let mut query = self.query.lock();
        if let Query::Retry { at_ns, tries } = &*query {
            if log::monotonic_ns() < *at_ns {
                return None;
            }
            *query = Self::send(*tries);
        }
        let outcome = match &*query {
            Query::Asked { request, since_ns } => match request.poll() {
                Answer::HostPid(pid) => Ok(pid),
                Answer::Pending if log::monotonic_ns().saturating_sub(*since_ns) < PATIENCE_NS => return None,
                Answer::Pending => Err("the service did not answer".to_string()),
                Answer::Failed(why) => Err(why),
            },
            _ => return None,
        };
        match outcome {
            Ok(pid) => {
                let matched = self.known.swap(pid, Ordering::AcqRel);
                *query = Query::Failed(String::new());
                drop(query);
                if matched != 0 && matched != pid {
                    log_at!(Level::Debug, "the host's fgpu service says host PID {pid}, not {matched} as matched in NVML's list; the service is right");
                }
                log_at!(Level::Debug, "host PID {pid}, from the host's fgpu service");
                on_learnt(pid);
                Some(pid)
            }
            Err(why) => {
                *query = Query::Failed(why);
                None
            }
        }
    }

    /// The host PID, if known, without asking anything.
    pub fn host_known(&self) -> Option<u32> {
        Some(self.known.load(Ordering::Acquire)).filter(|p| *p != 0)
    }

    /// Which PIDs NVML gives, as found out so far.
    pub fn behaviour(&self) -> NvmlPids {
        match NvmlPids::from_u8(self.behaviour.load(Ordering::Acquire)) {
            NvmlPids::Unknown if fgpu_core::pidns::in_host_pidns() => {
                // Never changes for a process: looked up once.
                self.behaviour.store(NvmlPids::HostNamespace as u8, Ordering::Release);
                NvmlPids::HostNamespace
            }
            b => b,
        }
    }

    /// The PID NVML's process lists and utilisation samples name this process by, if it is
    /// known by now (under [`NvmlPids::Absent`] the lists never name it; its samples keep
    /// the raw host PID).
    pub fn listed(&self) -> Option<u32> {
        match self.behaviour() {
            NvmlPids::HostNamespace | NvmlPids::Caller | NvmlPids::CallerNoMemory => Some(getpid()),
            NvmlPids::Host | NvmlPids::Absent => self.host_known(),
            NvmlPids::Unknown => None,
        }
    }

    /// The PID NVML's compute list gives this process's memory under, if the list has a
    /// figure for it and it is known which entry is this process.
    pub fn memory_pid(&self) -> Option<u32> {
        match self.behaviour() {
            NvmlPids::HostNamespace | NvmlPids::Caller => Some(getpid()),
            NvmlPids::Host => self.host_known(),
            _ => None,
        }
    }

    /// Whether a look at NVML's list can still tell something (the behaviour, under host
    /// PIDs which entry is this process, or whether a process NVML did not list shows now).
    pub fn needs_a_look(&self) -> bool {
        match self.behaviour() {
            NvmlPids::Unknown | NvmlPids::Absent => true,
            NvmlPids::Host => self.host_known().is_none(),
            _ => false,
        }
    }

    /// One look at NVML's list for a device (a nested namespace only): records what it
    /// tells. Under host PIDs, `on_matched` runs once with this process's host PID when only
    /// one entry can be it.
    pub fn observe(&self, look: &Look, on_matched: impl FnOnce(u32)) -> Verdict {
        let verdict = self.identifier.lock().look(look);
        if verdict.behaviour != NvmlPids::Unknown {
            let before = self.behaviour.swap(verdict.behaviour as u8, Ordering::AcqRel);
            if before != verdict.behaviour as u8 {
                log_at!(Level::Debug, "NVML gives this PID namespace {} PIDs (found out from its process list)", verdict.behaviour.label());
            }
        }
        if let (NvmlPids::Host, Some(pid)) = (verdict.behaviour, verdict.host_pid) {
            if self.known.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                log_at!(Level::Debug, "host PID {pid}, matched in NVML's process list");
                on_matched(pid);
            }
        }
        verdict
    }

    /// Why the host PID is unknown, once asking has failed (None while it may still come).
    pub fn failure(&self) -> Option<String> {
        match &*self.query.lock() {
            Query::Failed(why) if self.known.load(Ordering::Acquire) == 0 => Some(why.clone()),
            _ => None,
        }
    }

    /// Why the host PID is unknown, or that the service may still answer.
    pub fn service_state(&self) -> String {
        match &*self.query.lock() {
            Query::Failed(why) if !why.is_empty() => why.clone(),
            Query::Asked { .. } => "the host's fgpu service has not answered yet".into(),
            Query::Retry { .. } => "the host's fgpu service is busy; asking again".into(),
            _ => "no service was asked".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_core::nvmlpids::{Entry, Own};
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_backoff_grows_and_is_bounded() {
        assert_eq!(backoff_ns(1), RETRY_FIRST_NS);
        assert_eq!(backoff_ns(2), 2 * RETRY_FIRST_NS);
        assert!((1..=RETRIES).all(|t| backoff_ns(t) <= RETRY_MAX_NS));
        assert_eq!(backoff_ns(RETRIES), RETRY_MAX_NS);
        let total: u64 = (1..=RETRIES).map(backoff_ns).sum();
        assert!(total < 10_000_000_000, "given up within 10 s: {total}");
    }

    #[test]
    fn a_match_under_host_pids_is_recorded_once() {
        if fgpu_core::pidns::in_host_pidns() {
            // Here every behaviour gives getpid(); nothing is looked at.
            assert_eq!(NvmlPid::default().listed(), Some(getpid()));
            return;
        }
        let h = NvmlPid::default();
        let own = |mib| Some(Own { here: 7, host: None, counted: mib * MIB });
        let mut learnt = Vec::new();
        h.observe(&Look { at_ns: 0, own: own(300), others: &[], entries: &[Entry::new(40123, 300 * MIB)] }, |p| learnt.push(p));
        assert_eq!((h.behaviour(), h.listed()), (NvmlPids::Host, None), "host PIDs, which one not told yet");
        let v = h.observe(&Look { at_ns: 1, own: own(400), others: &[], entries: &[Entry::new(40123, 400 * MIB)] }, |p| learnt.push(p));
        assert_eq!(v.host_pid, Some(40123));
        assert_eq!((h.behaviour(), h.listed(), h.memory_pid()), (NvmlPids::Host, Some(40123), Some(40123)));
        h.observe(&Look { at_ns: 2, own: own(500), others: &[], entries: &[Entry::new(40123, 500 * MIB)] }, |p| learnt.push(p));
        assert_eq!(learnt, [40123]);
    }

    #[test]
    fn caller_namespace_pids_name_this_process_by_getpid() {
        if fgpu_core::pidns::in_host_pidns() {
            return;
        }
        let h = NvmlPid::default();
        let own = Some(Own { here: getpid(), host: None, counted: 300 * MIB });
        h.observe(&Look { at_ns: 0, own, others: &[], entries: &[Entry::new(getpid(), 300 * MIB)] }, |_| panic!("no host PID"));
        assert_eq!((h.behaviour(), h.listed(), h.memory_pid()), (NvmlPids::Caller, Some(getpid()), Some(getpid())));
        let h = NvmlPid::default();
        h.observe(&Look { at_ns: 0, own, others: &[], entries: &[Entry::new(getpid(), 0)] }, |_| panic!("no host PID"));
        assert_eq!((h.behaviour(), h.listed(), h.memory_pid()), (NvmlPids::CallerNoMemory, Some(getpid()), None));
    }
}
