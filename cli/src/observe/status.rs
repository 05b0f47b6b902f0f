//! `fgpu status`.

use super::args::StatusArgs;
use crate::observe::ledgers;
use crate::observe::report::{self, LedgerState};

pub fn status(args: &StatusArgs) -> i32 {
    let mut report = report::collect(ledgers::resolve_with_runs(&args.select));
    if args.select.ledger.is_none() {
        report.gpus = gpus(&report, args.select.all);
    }
    // The ledgers asked for decide the exit status; others of this user's runs, shown as
    // well, come and go with their jobs (one that ended mid-look is no failure here).
    let asked = |l: &&report::LedgerReport| args.select.all || l.source != "scan";
    let failed = report.ledgers.iter().filter(asked).any(|l| l.state == LedgerState::Error);
    let mig = if args.select.ledger.is_none() { crate::mig::status_instances() } else { None };
    if args.json {
        let mut value = serde_json::to_value(&report).expect("report serialises");
        if let (Some(mig), Some(map)) = (&mig, value.as_object_mut()) {
            map.insert("mig_instances".into(), serde_json::to_value(mig).expect("instances serialise"));
        }
        println!("{}", serde_json::to_string_pretty(&value).expect("report serialises"));
    } else {
        for note in &report.notes {
            eprintln!("fgpu status: {note}");
        }
        print!("{}", crate::observe::text::render_text(&report, terminal_width()));
        if let Some(mig) = &mig {
            print!("{}", crate::mig::render_status(mig));
        }
    }
    i32::from(failed)
}

/// Width of the terminal on stdout, 100 when it is not a terminal.
pub fn terminal_width() -> usize {
    crossterm::terminal::size().map(|(w, _)| w as usize).ok().filter(|w| *w > 0).unwrap_or(100)
}

/// What is committed on each GPU, from every ledger this user can see (a second scan when
/// the report is not of all of them already).
fn gpus(report: &report::StatusReport, all: bool) -> Vec<report::GpuRoom> {
    let Ok(probe) = crate::driver::probe::probe_driver() else { return Vec::new() };
    if probe.devices.is_empty() {
        return Vec::new();
    }
    if all {
        return crate::observe::rooms::rooms(&probe.devices, &report.ledgers);
    }
    let seen = report::collect(ledgers::resolve(&super::args::LedgerSelection { all: true, ..Default::default() }));
    crate::observe::rooms::rooms(&probe.devices, &seen.ledgers)
}
