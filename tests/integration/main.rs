//! fgpu's integration tests: one binary, real processes, the simulated driver.
//!
//! Run `cargo build --release` first (tests/run.sh does); every test gets its own temp
//! directory, simulated GPU and ledger (see tests/support).

mod allocation_kinds;
mod bad_input;
mod cli;
mod config_file;
mod cuda_bindings;
mod entry_paths;
mod front;
mod nvml;
mod sharing;
mod wheel;
