//! This process's host PID, which NVML reports it by: known at once in the host's PID
//! namespace, otherwise asked of the host's `fgpu service` when the process joins its
//! ledger, and picked up without waiting when next needed (`fgpu_core::hostpid`).

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
}

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

    /// Why the host PID is unknown, once asking has failed (None while it may still come).
    pub fn failure(&self) -> Option<String> {
        match &*self.query.lock() {
            Query::Failed(why) if self.known.load(Ordering::Acquire) == 0 => Some(why.clone()),
            _ => None,
        }
    }
}
