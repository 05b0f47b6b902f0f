//! `fgpu doctor`'s arguments.

use clap::Args;

const DOCTOR_HELP: &str = "\
Examples:
  fgpu doctor
  fgpu run --limit 8G -- fgpu doctor      check what a job started by fgpu run gets
  fgpu doctor --json

Checks: the front (libfgpu.so) is found, and it and the shim beside it load here; it
is preloaded (LD_PRELOAD or /etc/ld.so.preload); which cap applies and where it comes from; libcuda.so.1 and
libnvidia-ml.so.1 load, and their versions; the ledger is reachable and healthy; the PID
namespace; no other CUDA interposer (such as HAMi-core's libvgpu.so) is loaded.

Exit status: 0 a cap applies here, 1 it would not (each reason is printed), 2 usage error.";

/// Check whether a cap applies here, and say what to do if not.
#[derive(Debug, Args)]
#[command(after_help = DOCTOR_HELP)]
pub struct DoctorArgs {
    /// Print JSON (only JSON) on standard output.
    #[arg(long)]
    pub json: bool,
}
