//! Host PIDs for processes in their own PID namespace (containers without `--pid=host`).
//!
//! NVML reports host PIDs; a process in a container cannot know its own, and no kernel
//! interface tells it. So a small service runs on the host (`fgpu service`) on a Unix
//! socket that containers mount: when a process connects, the kernel tells the service the
//! peer's PID translated into the service's PID namespace (`SO_PEERCRED`), which is the
//! host's, and the service writes it back.
//!
//! The request costs no wait: it is sent (a non-blocking connect) when the process first
//! joins its ledger, and the answer is picked up, without blocking, the next time something
//! needs it. A connect the service's full backlog turns away (`EAGAIN`) says so
//! ([`SendError::retry`]), and the shim asks again later. A process trusts only a service
//! it cannot see, run by the host's root: `SO_PEERCRED` gives the service's PID as 0 from
//! inside the container's PID namespace (any process of the container, even in a nested
//! namespace, is visible there), and its user as 0, which means the host's root only in the
//! initial user namespace. In any other user namespace (a rootless container) an ordinary
//! user outside can show as 0, so there no service is trusted.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The directory `fgpu service` listens in; containers mount it read-only at the same path.
pub const SERVICE_DIR: &str = "/run/fgpu-service";
/// Where `fgpu service` listens, and where the shim looks unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/fgpu-service/host.sock";
/// Names another socket (for tests and unusual layouts; the peer checks still apply).
pub const ENV_SOCKET: &str = "FGPU_HOST_SOCKET";

const MAGIC: &[u8; 8] = b"FGPUPID1";
const REPLY: usize = 12;

/// The service's answer: `MAGIC` then the host PID, little-endian.
pub fn encode_reply(pid: u32) -> [u8; REPLY] {
    let mut out = [0u8; REPLY];
    out[..8].copy_from_slice(MAGIC);
    out[8..].copy_from_slice(&pid.to_le_bytes());
    out
}

pub fn decode_reply(bytes: &[u8]) -> Option<u32> {
    (bytes.len() == REPLY && &bytes[..8] == MAGIC).then(|| u32::from_le_bytes(bytes[8..].try_into().unwrap())).filter(|p| *p > 0)
}

/// The credentials of a connected Unix socket's peer (`SO_PEERCRED`): PID as the caller's
/// PID namespace sees it (0 when it cannot), and user.
pub fn peer_credentials(fd: &impl AsFd) -> io::Result<(u32, u32)> {
    crate::sys::peer_credentials(fd.as_fd())
}

/// A question sent to the service, whose answer is read later without waiting.
#[derive(Debug)]
pub struct Request {
    socket: OwnedFd,
}

/// Where a [`Request`] stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Pending,
    HostPid(u32),
    /// No usable service: the reason, for one line of diagnostics.
    Failed(String),
}

/// Why no request could be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    /// For one line of diagnostics.
    pub message: String,
    /// The service is there but could not take the connection now (its backlog is full):
    /// asking again later may succeed.
    pub retry: bool,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<SendError> for String {
    fn from(e: SendError) -> String {
        e.message
    }
}

impl Request {
    /// Connects to the service at `path` without blocking. `Err` says why there is none.
    pub fn send(path: &Path) -> Result<Request, SendError> {
        Self::send_trusting(path, crate::pidns::in_initial_userns(), crate::pidns::in_host_pidns())
    }

    /// [`Request::send`] with the caller's namespaces given: whether its user namespace is the
    /// initial one (where uid 0 is the host's root) and its PID namespace the host's.
    fn send_trusting(path: &Path, initial_userns: bool, host_pidns: bool) -> Result<Request, SendError> {
        let fail = |message: String| SendError { message, retry: false };
        let socket = crate::sys::unix_connect_nonblocking(path).map_err(|e| SendError {
            message: format!("{}: {e}", path.display()),
            retry: matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)),
        })?;
        let (pid, uid) = peer_credentials(&socket).map_err(|e| fail(format!("{}: {e}", path.display())))?;
        if uid != 0 {
            return Err(fail(format!("{}: the service runs as uid {uid}, not root; not trusted", path.display())));
        }
        if !initial_userns {
            return Err(fail(format!(
                "{}: this process is in a user namespace of its own, where uid 0 need not be the host's root; no service is trusted here",
                path.display()
            )));
        }
        if pid != 0 && !host_pidns {
            return Err(fail(format!("{}: the service (PID {pid}) runs inside this PID namespace, so it cannot know host PIDs; not trusted", path.display())));
        }
        Ok(Request { socket })
    }

    /// Reads the answer if it has come, without blocking.
    pub fn poll(&self) -> Answer {
        let mut buf = [0u8; REPLY];
        let n = match crate::sys::peek_nonblocking(self.socket.as_fd(), &mut buf) {
            Ok(n) => n,
            Err(e) => {
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Answer::Pending,
                    _ => Answer::Failed(format!("reading the service's answer: {e}")),
                };
            }
        };
        match n.cmp(&REPLY) {
            std::cmp::Ordering::Less if n > 0 => Answer::Pending,
            _ => match decode_reply(&buf[..n]) {
                Some(pid) => Answer::HostPid(pid),
                None => Answer::Failed("the service gave no valid answer".into()),
            },
        }
    }

    /// Waits up to `timeout` for the answer (for tools; the shim only polls).
    pub fn wait(&self, timeout: std::time::Duration) -> Answer {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.poll() {
                Answer::Pending if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(2)),
                Answer::Pending => return Answer::Failed("the service did not answer in time".into()),
                done => return done,
            }
        }
    }
}

/// Answers one connection: the peer's PID as this process's namespace sees it.
pub fn answer(stream: &std::os::unix::net::UnixStream) -> io::Result<u32> {
    use std::io::Write;
    let (pid, _) = peer_credentials(stream)?;
    if pid == 0 {
        return Err(io::Error::other("the peer is not visible from this PID namespace"));
    }
    (&*stream).write_all(&encode_reply(pid))?;
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip_and_garbage_is_refused() {
        assert_eq!(decode_reply(&encode_reply(4242)), Some(4242));
        assert_eq!(decode_reply(&encode_reply(0)), None);
        assert_eq!(decode_reply(b"FGPUPID1\x01\x00"), None);
        assert_eq!(decode_reply(b"NOTFGPU!\x01\x00\x00\x00"), None);
    }

    #[test]
    fn a_service_answers_with_the_pid_the_kernel_gives_it() {
        let dir = std::env::temp_dir().join(format!("fgpu-hostpid-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("host.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            answer(&stream).unwrap()
        });
        let result = Request::send(&path);
        if crate::ledger::store::euid() != 0 || !crate::pidns::in_host_pidns() || !crate::pidns::in_initial_userns() {
            // As another user, the service in this test is not root and is refused.
            assert!(result.is_err());
            let _ = std::os::unix::net::UnixStream::connect(&path);
        } else {
            let request = result.unwrap();
            assert_eq!(request.wait(std::time::Duration::from_secs(5)), Answer::HostPid(std::process::id()));
        }
        assert_eq!(server.join().unwrap(), std::process::id());
        let missing = Request::send(&dir.join("nothing-here")).unwrap_err();
        assert!(missing.message.contains("nothing-here") && !missing.retry, "{missing:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A service whose uid reads as 0 is not trusted from a user namespace of its own: there
    /// an ordinary user outside can map to 0 (L1 of issue 18).
    #[test]
    fn uid_0_is_trusted_only_in_the_initial_user_namespace() {
        if crate::ledger::store::euid() != 0 || !crate::pidns::in_host_pidns() || !crate::pidns::in_initial_userns() {
            return; // the peer would not read as root here anyway
        }
        let dir = std::env::temp_dir().join(format!("fgpu-hostpid-userns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("host.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let refused = Request::send_trusting(&path, false, true).unwrap_err();
        assert!(refused.message.contains("user namespace") && !refused.retry, "{refused:?}");
        assert!(Request::send_trusting(&path, true, true).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A listener whose backlog is full turns a non-blocking connect away with EAGAIN: the
    /// error says to ask again (M3 of issue 18).
    #[test]
    fn a_full_backlog_says_to_ask_again() {
        let dir = std::env::temp_dir().join(format!("fgpu-hostpid-backlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("host.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Nobody accepts: connections queue until the backlog (set to 1 here) is full.
        crate::sys::relisten(std::os::fd::AsFd::as_fd(&listener), 1).unwrap();
        let mut held = Vec::new();
        let mut turned_away = None;
        for _ in 0..64 {
            match crate::sys::unix_connect_nonblocking(&path) {
                Ok(fd) => held.push(fd),
                Err(e) => {
                    turned_away = Some(e);
                    break;
                }
            }
        }
        let e = turned_away.expect("the backlog filled");
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
        let error = Request::send_trusting(&path, true, true).unwrap_err();
        assert!(error.retry, "{error:?}");
        drop(held);
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
