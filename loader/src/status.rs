//! `fgpu status`.

use crate::cli::StatusArgs;
use crate::ledgers;
use crate::report::{self, LedgerState};

pub fn status(args: &StatusArgs) -> i32 {
    let report = report::collect(ledgers::resolve_with_runs(&args.select));
    let failed = report.ledgers.iter().any(|l| l.state == LedgerState::Error);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("report serialises"));
    } else {
        for note in &report.notes {
            eprintln!("fgpu status: {note}");
        }
        print!("{}", report::render_text(&report, terminal_width()));
    }
    i32::from(failed)
}

/// Width of the terminal on stdout, 100 when it is not a terminal.
pub fn terminal_width() -> usize {
    crossterm::terminal::size().map(|(w, _)| w as usize).ok().filter(|w| *w > 0).unwrap_or(100)
}
