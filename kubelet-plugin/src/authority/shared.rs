//! What the relay's parts share: the authority put in place of one h2 refuses, why a relay
//! ended, and each socket's [`Notice`].

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The authority put in place of one the server cannot parse.
pub const REPLACEMENT: &str = "localhost";

/// Why a relay ended before both ends closed their connections.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the client does not speak HTTP/2 (no connection preface)")]
    NoPreface,
    /// The preface could not be passed on to the server.
    #[error("the server: {0}")]
    Server(#[source] io::Error),
    #[error("reading from the client: {kind:?} {what}")]
    ClientRead { kind: io::ErrorKind, what: String },
    #[error("relaying a frame: {0}")]
    Send(#[from] h2::SendError),
    /// One direction's task panicked or was cancelled.
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Whether h2 (through `http`) accepts this `:authority`.
pub fn acceptable(authority: &str) -> bool {
    authority.parse::<http::uri::Authority>().is_ok()
}

/// What a socket's relays share: the first authority one had to replace (said once), and
/// how many are still running.
pub struct Notice {
    socket: String,
    said: AtomicBool,
    live: std::sync::atomic::AtomicUsize,
}

/// Counts one relay as running until dropped.
pub(super) struct Running(Arc<Notice>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Notice {
    /// Counts one more relay of the socket as running, until the guard is dropped.
    pub(super) fn running(self: &Arc<Self>) -> Running {
        self.live.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    pub fn new(socket: &std::path::Path) -> Arc<Notice> {
        Arc::new(Notice { socket: socket.display().to_string(), said: AtomicBool::new(false), live: Default::default() })
    }

    /// Waits until every relay of the socket has ended, at most `within`: once the server
    /// has stopped, that is when its last answers have reached the clients (the process
    /// must not exit before). False when some still run.
    pub async fn drained(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.live.load(Ordering::Acquire) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }

    pub(super) fn replaced(&self, authority: &str) {
        if !self.said.swap(true, Ordering::Relaxed) {
            crate::log(&format!(
                "{}: the client sends :authority {authority:?}, which h2 refuses (grpc-go's form of a socket path); it is served as {REPLACEMENT:?} (logged once)",
                self.socket
            ));
        }
    }
}
