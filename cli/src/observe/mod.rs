//! Observing the ledgers: which ledgers to show (`ledgers.rs`: the one in effect, a named
//! one, or the `--all` scan), what is shown of each (`report.rs`; as text, `text.rs`), and the commands that show
//! it: `fgpu status` (`status.rs`), `fgpu top` (`top.rs`) and `fgpu exporter` (`exporter.rs`);
//! what each GPU has committed (`rooms.rs`).

pub mod args;
pub mod exporter;
pub mod ledgers;
pub mod report;
pub mod rooms;
pub mod status;
pub mod text;
pub mod top;
