//! This process's host PID, which NVML reports it by: known at once in the host's PID
//! namespace, otherwise asked of the host's `fgpu service` when the process joins its
//! ledger, and picked up without waiting when next needed (`fgpu_core::hostpid`).
//!
//! Without a service, it is matched passively ([`HostPid::match_nvml`]): at the points where
//! the process compares its NVML usage with the ledger anyway, the NVML processes that no
//! other process of the ledger claims and that hold at least what the ledger counts for this
//! one are candidates; when one candidate is left, or when only one followed every change of
//! this process's count since the last look, it is this process. No call waits for it, and
//! nothing is allocated to probe.

use fgpu_core::hostpid::{Answer, Request, DEFAULT_SOCKET, ENV_SOCKET};
use fgpu_core::log::{self, Level};
use fgpu_core::log_at;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// How long an unanswered request is waited for before it counts as failed.
const PATIENCE_NS: u64 = 2_000_000_000;

#[derive(Debug, Default)]
enum Query {
    #[default]
    NotAsked,
    Asked { request: Request, since_ns: u64 },
    Failed(String),
}

#[derive(Debug, Default)]
pub struct HostPid {
    /// 0 while unknown.
    known: AtomicU32,
    query: Mutex<Query>,
    /// The last look at NVML while matching: this process's count, and each candidate's
    /// usage.
    last_look: Mutex<Option<Look>>,
}

/// One look at NVML while matching.
#[derive(Debug)]
struct Look {
    /// What the ledger counted for this process.
    counted: u64,
    /// Each candidate's (host PID, used bytes).
    candidates: Vec<(u32, u64)>,
}

/// What a look at NVML's list told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    HostPid(u32),
    /// Several processes could be this one.
    Ambiguous,
    /// None can be yet (this process shows nothing in NVML).
    Nothing,
}

/// NVML's figure for a process can trail or lead the ledger's by this much (page rounding;
/// memory the driver takes unannounced only adds).
const MATCH_SLACK: u64 = 2 << 20;

fn socket_path() -> PathBuf {
    std::env::var_os(ENV_SOCKET).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

impl HostPid {
    /// Learns the host PID if the kernel tells it, else sends the request (no waiting).
    pub fn ask(&self) {
        let mut query = self.query.lock();
        if !matches!(*query, Query::NotAsked) {
            return;
        }
        if let Some(pid) = fgpu_core::pidns::host_pid() {
            self.known.store(pid, Ordering::Release);
            *query = Query::Failed(String::new());
            return;
        }
        *query = match Request::send(&socket_path()) {
            Ok(request) => Query::Asked { request, since_ns: log::monotonic_ns() },
            Err(why) => Query::Failed(why),
        };
    }

    /// The host PID if known by now; `on_learnt` runs once when the answer comes.
    pub fn get(&self, on_learnt: impl FnOnce(u32)) -> Option<u32> {
        let known = self.known.load(Ordering::Acquire);
        if known != 0 {
            return Some(known);
        }
        self.ask();
        let mut query = self.query.lock();
        let Query::Asked { request, since_ns } = &*query else { return None };
        let outcome = match request.poll() {
            Answer::HostPid(pid) => Ok(pid),
            Answer::Pending if log::monotonic_ns().saturating_sub(*since_ns) < PATIENCE_NS => return None,
            Answer::Pending => Err("the service did not answer".to_string()),
            Answer::Failed(why) => Err(why),
        };
        match outcome {
            Ok(pid) => {
                self.known.store(pid, Ordering::Release);
                *query = Query::Failed(String::new());
                drop(query);
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

    /// Matching without a service: `listed` is NVML's (host PID, used bytes) for the device,
    /// `counted` what the ledger counts for this process on it, `claimed` the host PIDs other
    /// processes of the ledger are known by. Records and returns the host PID once only one
    /// process can be this one.
    pub fn match_nvml(&self, listed: &[(u32, u64)], counted: u64, claimed: &[u32]) -> Match {
        if counted == 0 {
            return Match::Nothing; // nothing on the device yet: every process would fit
        }
        let unclaimed: Vec<(u32, u64)> = listed.iter().copied().filter(|(pid, _)| *pid != 0 && !claimed.contains(pid)).collect();
        let candidates: Vec<(u32, u64)> = unclaimed.iter().copied().filter(|(_, used)| used.saturating_add(MATCH_SLACK) >= counted).collect();
        // With nobody else unaccounted for on the device, the one process left is this one;
        // otherwise only a history of moving together can tell (NVML may show less than
        // the ledger counts, managed memory for one, which could rule this process out).
        let alone = unclaimed.len() == 1;
        let mut last = self.last_look.lock();
        let several = !candidates.is_empty() && unclaimed.len() > 1;
        let found = match candidates.as_slice() {
            [(pid, _)] if alone => Some(*pid),
            [] => None,
            _ => last.as_ref().and_then(|Look { counted: before, candidates: seen }| {
                // Which candidates moved with this process's count since the last look?
                let change = counted as i128 - *before as i128;
                if change.unsigned_abs() < 4 * MATCH_SLACK as u128 {
                    return None;
                }
                let mut moved = candidates.iter().filter(|(pid, used)| {
                    seen.iter().any(|(p, u)| p == pid && (*used as i128 - *u as i128 - change).unsigned_abs() <= MATCH_SLACK as u128)
                });
                match (moved.next(), moved.next()) {
                    (Some((pid, _)), None) => Some(*pid),
                    _ => None,
                }
            }),
        };
        *last = Some(Look { counted, candidates });
        match found {
            Some(pid) => {
                self.known.store(pid, Ordering::Release);
                log_at!(Level::Debug, "host PID {pid}, matched in NVML's process list");
                Match::HostPid(pid)
            }
            None if several => Match::Ambiguous,
            None => Match::Nothing,
        }
    }

    /// Why the host PID is unknown, once asking has failed (None while it may still come).
    pub fn failure(&self) -> Option<String> {
        match &*self.query.lock() {
            Query::Failed(why) if self.known.load(Ordering::Acquire) == 0 => Some(why.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_only_process_left_is_this_process() {
        let h = HostPid::default();
        // 4242 belongs to another process of the ledger.
        let listed = [(4242, 900 * MIB), (31337, 1324 * MIB)];
        assert_eq!(h.match_nvml(&listed, 1324 * MIB, &[4242]), Match::HostPid(31337));
        // Another process the ledger does not know, even one that holds less, leaves only
        // history to tell.
        let h = HostPid::default();
        let listed = [(17, 10 * MIB), (31337, 1324 * MIB)];
        assert_eq!(h.match_nvml(&listed, 1324 * MIB, &[]), Match::Ambiguous);
    }

    #[test]
    fn among_several_the_one_that_follows_this_process_is_chosen() {
        let h = HostPid::default();
        let first = [(100, 2000 * MIB), (200, 1500 * MIB)];
        assert_eq!(h.match_nvml(&first, 1000 * MIB, &[]), Match::Ambiguous, "two candidates, no history");
        // This process allocated 300 MiB; only 200 grew by that much.
        let second = [(100, 2100 * MIB), (200, 1800 * MIB)];
        assert_eq!(h.match_nvml(&second, 1300 * MIB, &[]), Match::HostPid(200));
    }

    #[test]
    fn no_change_or_an_ambiguous_one_matches_nothing() {
        let h = HostPid::default();
        let first = [(100, 2000 * MIB), (200, 1500 * MIB)];
        assert_eq!(h.match_nvml(&first, 1000 * MIB, &[]), Match::Ambiguous);
        assert_eq!(h.match_nvml(&first, 1000 * MIB, &[]), Match::Ambiguous, "nothing moved");
        let both = [(100, 2300 * MIB), (200, 1800 * MIB)];
        assert_eq!(h.match_nvml(&both, 1300 * MIB, &[]), Match::Ambiguous, "both moved with it");
        assert_eq!(h.match_nvml(&[], 1300 * MIB, &[]), Match::Nothing);
    }
}
