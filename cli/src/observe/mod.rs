//! Observing the ledgers: which ledgers to show (`ledgers.rs`: the one in effect, a named
//! one, or the `--all` scan), what is shown of each (`report.rs`; as text, `text.rs`), and the commands that show
//! it: `fgpu status` (`status.rs`), `fgpu top` (`top.rs`) and `fgpu exporter` (`exporter.rs`, its metrics in `metrics.rs`);
//! what each GPU has committed (`rooms.rs`).

pub mod args;
pub mod exporter;
#[cfg(test)]
pub mod fixtures;
pub mod ledgers;
pub mod metrics;
pub mod report;
pub mod rooms;
pub mod scan;
pub mod status;
pub mod target;
pub mod text;
pub mod top;
