//! NVML as the container should see it: `nvidia-smi`, pynvml, gpustat, nvitop and the
//! frameworks' NVML use all read memory and processes from here.
//!
//! * Memory info: total = the cap (the GPU's own memory when the cap is larger), used = what
//!   the ledger's processes hold (contexts included), free = the rest. `_v2`'s
//!   `reserved` is 0: the driver's reservation belongs to the card, not the container, so
//!   total = used + free holds in both layouts.
//! * Compute process lists (and compute mode of the r550 detail list) are built from the
//!   ledger: only this container's processes, with PIDs as the caller's PID namespace sees
//!   them and the memory the ledger counts, whatever PIDs the driver gives.
//! * Graphics and MPS lists, utilisation samples, accounting data and encoder /
//!   frame-buffer-capture sessions are the driver's, filtered to the ledger's processes and
//!   given with the PIDs the caller sees. What a driver PID stands for depends on the
//!   driver, which is found out, not assumed (`process/nvml_pid.rs`, `fgpu_core::nvmlpids`): host
//!   PIDs (older drivers, and any caller in the host's namespace) map through the ledger's
//!   host PIDs; caller-namespace PIDs (current drivers) are the ledger's PIDs as this
//!   namespace sees them, and in utilisation samples a process this namespace cannot see
//!   keeps its raw host PID. Accounting and session records carry the raw host PID on every
//!   driver (the driver stores `pClient->ProcID`). A driver PID that could stand for two of
//!   the ledger's processes stands for neither; while it is not known which PIDs the driver
//!   gives, nothing of the driver's lists is shown. With a broken configuration all of
//!   them are empty.
//!
//! * [`memory`]: `nvmlDeviceGetMemoryInfo` and `_v2`.
//! * [`lists`]: the process lists (compute, graphics, MPS, in three layouts, and r550's
//!   detail list).
//! * [`filtered`]: utilisation samples, accounting, encoder and frame-buffer-capture
//!   sessions: the driver's answer less other containers' processes.
//!
//! What the container is shown is the accounting's (`accounting/listing.rs`); these hooks
//! read the caller's buffers and write the answers in its layouts.

pub mod filtered;
pub mod lists;
pub mod memory;
