//! Support for fgpu's integration tests: a temp directory per test with its own simulated
//! GPU and ledger, commands whose failures show everything, and C clients built on demand.
//!
//! The tests drive the release build (`cargo build --release` first; `tests/run.sh` does).
//!
//! The rule every test follows (tests/README.md says it in full): every load proves it
//! happened ([`assert_load`], [`Background::assert_running`], [`process_alive`]), every
//! skip goes through [`prerequisite`] and is counted, and every range is as tight as the
//! ground truth (the simulator's own figures) allows.

pub mod c_layout;
pub mod dra;

mod clients;
mod env;
mod net;
mod paths;
mod process;
mod skips;

pub use clients::*;
pub use env::*;
pub use net::*;
pub use paths::*;
pub use process::*;
pub use skips::*;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
