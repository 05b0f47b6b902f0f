//! The PID namespace, and which PIDs NVML gives a process here (docs/configuration.md).

use crate::doctor::facts::Facts;
use crate::doctor::finding::{finding, Finding, Level};
use fgpu_core::nvmlpids::NvmlPids;

pub fn check(f: &Facts, out: &mut Vec<Finding>) {
    if f.host_pidns {
        out.push(finding(
            "pidns",
            Level::Info,
            "This is the host PID namespace: PIDs that fgpu status shows are host PIDs, the same as nvidia-smi shows. Every driver gives host PIDs here, so which PIDs it gives a container cannot be told from here: run `fgpu doctor` in the container while a capped process runs there.",
            None,
        ));
    } else {
        out.push(finding(
            "pidns",
            Level::Info,
            "This is not the host PID namespace (a container): fgpu status shows PIDs as seen here; nvidia-smi on the host shows other (host) PIDs. Run `fgpu status --all` as root on the host to see both.",
            None,
        ));
        out.push(pid_behaviour_finding(f));
    }
}

/// What the doctor says about the PIDs NVML gives a container, and what it needs.
fn pid_behaviour_finding(f: &Facts) -> Finding {
    let service = fgpu_core::hostpid::SERVICE_DIR;
    let counted = "memory the driver takes without an allocation call (module code, lazily loaded kernels) is counted against the cap, and the compute share reads this process's own utilisation samples";
    match (f.nvml_pids, &f.host_pid) {
        (NvmlPids::Caller, _) => finding(
            "pidns",
            Level::Ok,
            format!("NVML gives PIDs as this namespace sees them, with their memory (NVML PIDs: caller, as current drivers): {counted}. Neither `fgpu service` nor --pid=host is needed."),
            None,
        ),
        (NvmlPids::Host, Ok(pid)) => finding(
            "pidns",
            Level::Ok,
            format!("NVML gives host PIDs (NVML PIDs: host, as older drivers), and the host's fgpu service answers: this process is host PID {pid}, so {counted}."),
            None,
        ),
        (NvmlPids::Host, Err(why)) => finding(
            "pidns",
            Level::Warn,
            format!("NVML gives host PIDs (NVML PIDs: host, as older drivers), and host PIDs are unknown here ({why}): a process is then found in NVML's list by what it holds, which fails while several could be it, and until then memory the driver takes without an allocation call cannot be counted against the cap."),
            Some(format!("Run `fgpu service` on the host and mount {service} into the container (read-only), or run the container with --pid=host.")),
        ),
        (NvmlPids::CallerNoMemory | NvmlPids::Absent, _) => {
            let what = if f.nvml_pids == NvmlPids::Absent {
                "NVML lists none of this namespace's processes (NVML PIDs: none)"
            } else {
                "NVML lists this namespace's processes under the PIDs it sees but without their memory (NVML PIDs: caller-no-memory)"
            };
            finding(
                "pidns",
                Level::Warn,
                format!("{what}: no per-process figure is usable, so module memory is measured on the whole device around each load (exact only while nothing else on the GPU changes meanwhile) and kernels loaded lazily are not counted."),
                Some("Run the container with --pid=host: in the host's namespace every driver gives each process's memory. (`fgpu service` does not help here: NVML takes no host PIDs from inside the container.)".into()),
            )
        }
        (_, Ok(pid)) => finding(
            "pidns",
            Level::Ok,
            format!("The host's fgpu service answers: this process is host PID {pid}. Which PIDs NVML gives here cannot be told yet (NVML PIDs: unknown): no process of this ledger that this namespace sees holds GPU memory. With host PIDs the service's answer is used; with PIDs as this namespace sees them nothing is needed."),
            None,
        ),
        (_, Err(why)) => finding(
            "pidns",
            Level::Warn,
            format!("Host PIDs are unknown here ({why}), and which PIDs NVML gives cannot be told yet (NVML PIDs: unknown): no process of this ledger that this namespace sees holds GPU memory. Drivers that give PIDs as this namespace sees them need nothing; drivers that give host PIDs need the host's PID of each process for memory the driver takes without an allocation call (module code, lazily loaded kernels) to count against the cap."),
            Some(format!("Run `fgpu doctor` again while a capped process runs here; if it says host PIDs, run `fgpu service` on the host and mount {service} into the container (read-only), or run the container with --pid=host.")),
        ),
    }
}
