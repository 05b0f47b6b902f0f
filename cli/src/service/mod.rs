//! `fgpu service`: the host-side helper that tells processes in containers their host PID
//! (`fgpu_core::hostpid`), so memory NVML shows for them (module code, lazily loaded
//! kernels) is counted against their container's cap without `--pid=host`.
//!
//! It must run in the host's PID namespace (the kernel translates each client's PID into
//! the service's namespace). The socket is world-connectable: it answers each client with
//! its own PID and nothing else.
//!
//! Floods: the answer needs no reading from the client (the kernel gives the peer's PID
//! at accept), so each connection is answered with one non-blocking write and closed at
//! once; several threads accept from one listening socket whose queue is as long as the
//! kernel allows, so a newcomer's connect finds room while others hammer the socket, and
//! the shim asks again, later, when a connect is refused with EAGAIN.

pub mod args;

use args::ServiceArgs;
use fgpu_core::hostpid;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;

pub fn service(args: &ServiceArgs) -> i32 {
    if !fgpu_core::pidns::in_host_pidns() {
        eprintln!("fgpu service: this is not the host's PID namespace, so the PIDs it would tell are not host PIDs; run it on the host");
        return 1;
    }
    let path = &args.socket;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Only a directory made here is given its mode: one that was there (a 1777 /tmp, a
        // directory another tool manages) is left as it is.
        if !dir.exists() {
            if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir) {
                eprintln!("fgpu service: cannot create {}: {e}", dir.display());
                return 1;
            }
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
        }
    }
    // A socket left by a service that died is replaced; anything else at the path is not.
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                eprintln!("fgpu service: another service already answers at {}", path.display());
                return 1;
            }
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => {
            eprintln!("fgpu service: {} exists and is not a socket; refusing to replace it", path.display());
            return 1;
        }
        Err(_) => {}
    }
    let listener = match UnixListener::bind(path) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("fgpu service: cannot listen on {}: {e}", path.display());
            return 1;
        }
    };
    // The longest queue of pending connections the kernel allows (net.core.somaxconn).
    // Listening again only changes the length of the queue.
    let _ = fgpu_core::sys::relisten(std::os::fd::AsFd::as_fd(&listener), libc::SOMAXCONN.max(4096));
    // Every user of every container may ask: the answer is only the asker's own PID.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
    eprintln!("fgpu service: telling processes their host PID at {}", path.display());
    let listener = std::sync::Arc::new(listener);
    let threads: Vec<_> = (0..ANSWERING_THREADS)
        .map(|_| {
            let (listener, verbose) = (listener.clone(), args.verbose);
            std::thread::spawn(move || answer_all(&listener, verbose))
        })
        .collect();
    let mut code = 0;
    for thread in threads {
        code = code.max(thread.join().unwrap_or(1));
    }
    code
}

/// Threads accepting and answering from the one socket.
const ANSWERING_THREADS: usize = 4;

/// Accepts and answers until the socket fails for good; returns the exit code.
fn answer_all(listener: &UnixListener, verbose: bool) -> i32 {
    let mut backoff = std::time::Duration::from_millis(1);
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                backoff = std::time::Duration::from_millis(1);
                // The answer fits any socket buffer: a client that never reads cannot
                // hold this thread.
                let _ = stream.set_nonblocking(true);
                if let Err(e) = hostpid::answer(&stream) {
                    if verbose {
                        eprintln!("fgpu service: {e}");
                    }
                }
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)) => {
                eprintln!("fgpu service: accept: {e}; retrying in {} ms", backoff.as_millis());
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::WouldBlock) => {}
            Err(e) => {
                eprintln!("fgpu service: accept failed: {e}; stopping");
                return 1;
            }
        }
    }
}
