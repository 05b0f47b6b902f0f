//! `fgpu service`: the host-side helper that tells processes in containers their host PID
//! (`fgpu_core::hostpid`), so memory NVML shows for them (module code, lazily loaded
//! kernels) is counted against their container's cap without `--pid=host`.
//!
//! It must run in the host's PID namespace (the kernel translates each client's PID into
//! the service's namespace). The socket is world-connectable: it answers each client with
//! its own PID and nothing else.

use crate::cli::ServiceArgs;
use fgpu_core::hostpid;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

pub fn service(args: &ServiceArgs) -> i32 {
    if !fgpu_core::pidns::in_host_pidns() {
        eprintln!("fgpu service: this is not the host's PID namespace, so the PIDs it would tell are not host PIDs; run it on the host");
        return 1;
    }
    let path = &args.socket;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("fgpu service: cannot create {}: {e}", dir.display());
            return 1;
        }
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
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
    // Every user of every container may ask: the answer is only the asker's own PID.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
    eprintln!("fgpu service: telling processes their host PID at {}", path.display());
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let _ = stream.set_write_timeout(Some(std::time::Duration::from_millis(100)));
                if let Err(e) = hostpid::answer(&stream) {
                    if args.verbose {
                        eprintln!("fgpu service: {e}");
                    }
                }
            }
            Err(e) => eprintln!("fgpu service: accept: {e}"),
        }
    }
    0
}
