//! What this process holds in its ledger, and the flows that change it.
//!
//! * [`process`]: whether the process is capped ([`process::Mode`]), built on first use and
//!   started over after a fork; when capped, [`process::Active`]: its account and records.
//! * [`account`]: the configuration, the ledger, the slot, the host PID, the devices, and
//!   the moves of the count (reserve, release, settle).
//! * [`devices`]: the devices used, registered on first use.
//! * [`records`]: one record per kind of memory, each behind its own lock.
//! * [`nvml_look`]: what NVML's compute list says of this process (which PIDs NVML gives,
//!   how large a new context is).
//! * Flows, each an `impl Active` of its own: [`alloc`] (reserve, call, settle; frees;
//!   arrays), [`context`], [`pool`], [`graph`], [`vmm`], and [`listing`] (what NVML shows
//!   of the ledger's processes).

pub mod active;
pub mod alloc;
pub mod context;
pub mod graph;
pub mod listing;
pub mod nvml_look;
pub mod pool;
pub mod records;
pub mod vmm;

#[cfg(test)]
mod tests;
