//! fgpu's integration tests: one binary, real processes, the simulated driver.
//!
//! Run `cargo build --release` first (tests/run.sh does); every test gets its own temp
//! directory, simulated GPU and ledger (see tests/support).

mod abi_layout;
mod allocation_kinds;
mod bad_input;
mod cdi;
mod cli;
mod compute;
mod config_file;
mod crash_windows;
mod cuda_bindings;
mod dra;
mod dra_shared;
mod entry_paths;
mod front;
mod host_pids;
mod kernels;
mod ledger_file;
mod lookup_escapes;
mod mig_caps;
mod mig_cli;
mod mig_sim;
mod nvml;
mod nvml_events;
mod pid_modes;
mod security;
mod sharing;
mod sim_uuids;
mod tenant_influence;
mod wheel;
