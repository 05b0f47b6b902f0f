//! Running jobs: `fgpu run` (`run.rs`), the signals it forwards to the job (`signals.rs`),
//! and where `--gpus auto` puts a job (`placement.rs`).

pub mod args;
pub mod placement;
pub mod run;
pub mod signals;
