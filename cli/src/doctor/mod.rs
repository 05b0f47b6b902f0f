//! `fgpu doctor`: is a cap applied to programs started here, and if not, why and what to do.
//!
//! In three parts: [`system`] is the seam between the doctor and the machine (a trait, which
//! a fake stands in for in the tests); [`facts`] gathers what the checks look at through it;
//! [`checks`] turns the facts into findings, one function per check (unit-tested with
//! made-up facts). This file runs them and prints the findings.

pub mod args;
pub mod checks;
pub mod facts;
pub mod finding;
pub mod system;
#[cfg(test)]
mod tests;

use args::DoctorArgs;
pub use checks::assess;
pub use facts::{gather, Facts};
pub use finding::{Finding, Level};
use serde::Serialize;

#[derive(Serialize)]
struct DoctorJson<'a> {
    schema: u32,
    /// True when a cap applies to programs started here. False with exit status 1 when a
    /// check failed, false with exit status 0 when no cap is configured yet.
    cap_applies: bool,
    /// Which PIDs NVML gives here: host-namespace, host, caller, caller-no-memory, none or
    /// unknown (`fgpu_core::nvmlpids`, docs/configuration.md).
    nvml_pids: &'static str,
    findings: &'a [Finding],
}

/// The findings as text: one line each (`ok`, `info`, `warn`, `FAIL`), the advice under
/// it, and the verdict.
pub fn render_text(findings: &[Finding]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for f in findings {
        let tag = match f.level {
            Level::Ok => "ok  ",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(out, "{tag}  {}", f.message);
        if let Some(advice) = &f.advice {
            let _ = writeln!(out, "      What to do: {advice}");
        }
    }
    out.push('\n');
    if findings.iter().any(|f| f.level == Level::Fail) {
        out.push_str("A cap would NOT apply to GPU programs started here (see FAIL above).\n");
    } else if checks::cap::no_cap_yet(findings) {
        out.push_str("fgpu works here, and no cap is configured yet: see \"What to do\" above for the next step.\n");
    } else {
        out.push_str("A cap applies to GPU programs started here.\n");
    }
    out
}

pub fn doctor(args: &DoctorArgs) -> i32 {
    let facts = gather(&system::Host);
    let findings = assess(&facts);
    let failed = findings.iter().any(|f| f.level == Level::Fail);
    let unconfigured = checks::cap::no_cap_yet(&findings);
    if args.json {
        let json = DoctorJson { schema: 1, cap_applies: !failed && !unconfigured, nvml_pids: facts.nvml_pids.label(), findings: &findings };
        println!("{}", serde_json::to_string_pretty(&json).expect("findings serialise"));
    } else {
        print!("{}", render_text(&findings));
    }
    i32::from(failed)
}
