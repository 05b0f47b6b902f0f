//! `fgpu service`'s arguments.

use clap::Args;

const SERVICE_HELP: &str = "\
Examples:
  sudo fgpu service                                  listen on /run/fgpu-service/host.sock
  sudo fgpu service --verbose                        and say why a connection got no answer
  sudo fgpu service --socket /run/other/host.sock    another socket (FGPU_HOST_SOCKET in the jobs)

Run it on the host (not in a container), as root, for example from a systemd unit or a
Kubernetes DaemonSet with hostPID, and mount its socket into capped containers:
  docker run -v /run/fgpu-service:/run/fgpu-service:ro ... fractional-gpu:...
CDI specs written by `fgpu cdi generate` mount it when it exists. A process in a container
connects once, when it first uses the GPU, and learns its host PID (the kernel reports the
peer's PID in the service's PID namespace); nothing waits for the answer. With the host
PID known, memory NVML shows for the process that no allocation call announced (module
code, lazily loaded kernels) counts against the container's cap, as with --pid=host.
FGPU_HOST_SOCKET names another socket for the processes. See docs/security.md.";

/// Tell processes in containers their host PID (the host-side helper).
#[derive(Debug, Args)]
#[command(after_help = SERVICE_HELP)]
pub struct ServiceArgs {
    /// The socket to listen on.
    #[arg(long, default_value = fgpu_core::hostpid::DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: std::path::PathBuf,
    /// Say why a connection got no answer.
    #[arg(long)]
    pub verbose: bool,
}
