//! What this process holds in its ledger, and the flows that change it. The process itself
//! (its mode, configuration, ledger, slot and devices) is the layer below, `crate::process`.
//!
//! * [`mode`]: the process's mode, with, when capped, its accounting ([`Active`]); built
//!   with the process's, started over in a forked child.
//! * [`active`]: [`Active`], a capped process's account and records.
//! * [`records`]: one record per kind of memory, each behind its own lock.
//! * [`nvml_look`]: what NVML's compute list says of this process (which PIDs NVML gives,
//!   how large a new context is).
//! * Flows, each an `impl Active` of its own: [`alloc`] (count ahead, call, settle; frees;
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

pub use active::Active;

use crate::process::{self, lifecycle::PerProcess};

/// The process's mode ([`process::Mode`]), carrying the accounting when capped.
pub type Mode = process::Mode<Active>;

static MODE: PerProcess<Mode> = PerProcess::new();

/// The mode of this process with its accounting, built on first use with the process's
/// own (`process::mode`).
#[inline]
pub fn mode() -> &'static Mode {
    match MODE.get() {
        Some(mode) => mode,
        None => MODE.get_or_build(build, after_fork_in_child),
    }
}

fn build() -> Mode {
    let mode = process::mode().map(Active::new);
    if let Mode::On(active) = &mode {
        active.account().set_nvml_look(look_at_nvml);
    }
    mode
}

/// What the compute sampler has run while the PID NVML knows this process by is not known:
/// the count of what NVML shows the process holding, which looks at NVML's lists
/// (`process::account::Account::sampled_pid`).
fn look_at_nvml() {
    if let Mode::On(active) = mode() {
        active.count_untracked();
    }
}

/// A forked child builds its own accounting (the process's mode is started over too).
fn after_fork_in_child() {
    MODE.forget_in_child();
}
