//! Running jobs: `fgpu run` (`run.rs`, its arguments in `args.rs`), the private ledger each
//! run gets (`private_ledger.rs`), the signals it forwards to the job (`signals.rs`), and
//! where `--gpus auto` puts a job (`place.rs` claims under the placement lock what
//! `placement.rs` chooses).

pub mod args;
pub mod place;
pub mod placement;
pub mod private_ledger;
pub mod run;
pub mod signals;
