//! `fgpu status`'s and `fgpu top`'s text for people, from a [`StatusReport`]: each ledger,
//! its GPUs with bars, its processes; what a ledger's processes wrote, escaped.

use crate::observe::report::{LedgerReport, LedgerState, ProcessReport, StatusReport};
use fgpu_core::limit::format_bytes;
use std::fmt::Write as _;

/// `text` with control characters (terminal escape sequences, line breaks) written as
/// escapes: what a ledger's processes wrote (its path, their names) goes to a terminal.
pub fn clean(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// A bar like `[||||||||      ]` of `width` cells inside the brackets.
pub fn bar(used: u64, cap: u64, width: usize) -> String {
    let filled = if cap == 0 { 0 } else { ((used as u128 * width as u128 + cap as u128 / 2) / cap as u128).min(width as u128) as usize };
    format!("[{}{}]", "|".repeat(filled), " ".repeat(width - filled))
}

fn percent(used: u64, cap: u64) -> String {
    if cap == 0 {
        return "-".into();
    }
    format!("{:.0}%", used as f64 * 100.0 / cap as f64)
}

fn opt(v: Option<u32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Whether a ledger's process is `fgpu run` itself, which joins the ledger under
/// `--gpus auto` only to keep the job's place and never holds memory (its name is the
/// process's own word, so this only changes how a process holding nothing is shown).
fn is_launcher(p: &ProcessReport) -> bool {
    p.name == "fgpu" && p.devices.is_empty()
}

/// Renders the report as text for people; `width` is the line width to aim for.
pub fn render_text(report: &StatusReport, width: usize) -> String {
    let mut out = String::new();
    if report.ledgers.is_empty() {
        out.push_str("No ledger found: no capped process is running on this machine (or none visible to this user).\n");
    }
    for (i, ledger) in report.ledgers.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_ledger(&mut out, ledger, width);
    }
    if !report.gpus.is_empty() {
        out.push_str("\nGPUs: what is committed on each (caps of this user's own live ledgers, and memory used beyond them)\n");
        for g in &report.gpus {
            let _ = writeln!(
                out,
                "  GPU {}  {}  {}: {} committed by {} ledger(s), {} used outside them, {} left",
                g.index,
                clean(&g.uuid),
                format_bytes(g.total_bytes),
                format_bytes(g.committed_bytes),
                g.ledgers,
                format_bytes(g.used_outside_bytes),
                format_bytes(g.left_bytes)
            );
        }
    }
    out
}

fn render_ledger(out: &mut String, l: &LedgerReport, width: usize) {
    let pids: Vec<String> = l.mapped_by.iter().map(|p| p.to_string()).collect();
    let source = match l.source {
        "argument" => "given with --ledger".to_string(),
        "environment" => "from FGPU_LEDGER".to_string(),
        "config-file" => "from /etc/fgpu/fgpu.conf".to_string(),
        "default" => "the default".to_string(),
        _ => format!("mapped by PID {}", pids.join(", ")),
    };
    let _ = writeln!(out, "Ledger {} ({source})", clean(&l.path));
    match l.state {
        LedgerState::Missing => {
            out.push_str("  Not in use: no capped process uses this ledger now.\n");
            return;
        }
        LedgerState::Error | LedgerState::Timeout => {
            let _ = writeln!(out, "  Cannot be read: {}", clean(l.error.as_deref().unwrap_or("unknown error")));
            return;
        }
        LedgerState::Ok | LedgerState::Unverified => {
            if let Some(problem) = &l.error {
                let _ = writeln!(out, "  Warning: {}", clean(problem));
            }
        }
    }
    if l.devices.is_empty() {
        out.push_str("  No GPU registered yet: no process has used CUDA under this ledger.\n");
    }
    let bar_width = width.saturating_sub(60).clamp(10, 50);
    for d in &l.devices {
        let _ = writeln!(out, "  GPU {}  {}  ({} physical)", d.index, d.uuid, format_bytes(d.total_bytes));
        let _ = writeln!(
            out,
            "    {} {} of {} cap ({}), peak {}, {} refused",
            bar(d.used_bytes, d.cap_bytes, bar_width),
            format_bytes(d.used_bytes),
            format_bytes(d.cap_bytes),
            percent(d.used_bytes, d.cap_bytes),
            format_bytes(d.peak_bytes),
            d.refusals
        );
        if let Some(share) = d.compute_share {
            let used =
                d.compute_used.map(|u| format!("{:.1}% of the GPU's time used (last 2 s)", u * 100.0)).unwrap_or_else(|| "use not measured lately".into());
            let _ = writeln!(
                out,
                "    {} compute share {}: {used}, {:.1} s in all, launches waited {:.1} s",
                bar((d.compute_used.unwrap_or(0.0) * 1e6) as u64, (share * 1e6) as u64, bar_width),
                fgpu_core::compute::format_share((share * 1e6).round() as u64),
                d.compute_seconds,
                d.compute_wait_seconds
            );
        }
    }
    // `fgpu run --gpus auto` keeps the job's place in its ledger until the command ends: a
    // process that holds nothing, named `fgpu`. Said as such, not listed as holding 0 B.
    let (launchers, processes): (Vec<&ProcessReport>, Vec<&ProcessReport>) = l.processes.iter().partition(|p| is_launcher(p));
    for p in &launchers {
        let pid = p.pid.map_or_else(|| format!("({})", p.pid_in_namespace), |pid| pid.to_string());
        let _ = writeln!(out, "  PID {pid} is fgpu run, keeping its job's place in the ledger until the job ends; it holds no GPU memory.");
    }
    if processes.is_empty() {
        out.push_str("  No process is using the ledger.\n");
    } else {
        // Processes in another PID namespace: also show the PID they see themselves.
        let ns_column = processes.iter().any(|p| p.pid != Some(p.pid_in_namespace));
        let ns = |text: &str| if ns_column { format!(" {text:>7}") } else { String::new() };
        let _ = writeln!(out, "  {:>8}{} {:>9} {:>4} {:>11} {:>11}  NAME", "PID", ns("NS PID"), "HOST PID", "GPU", "MEMORY", "CONTEXT");
        for p in &processes {
            let pid = match p.pid {
                Some(pid) => pid.to_string(),
                None => format!("({})", p.pid_in_namespace),
            };
            let ns_pid = ns(&p.pid_in_namespace.to_string());
            if p.devices.is_empty() {
                let _ = writeln!(out, "  {:>8}{ns_pid} {:>9} {:>4} {:>11} {:>11}  {}", pid, opt(p.host_pid), "-", "0 B", "-", clean(&p.name));
            }
            for d in &p.devices {
                let _ = writeln!(
                    out,
                    "  {:>8}{ns_pid} {:>9} {:>4} {:>11} {:>11}  {}",
                    pid,
                    opt(p.host_pid),
                    d.index,
                    format_bytes(d.used_bytes),
                    format_bytes(d.context_bytes),
                    clean(&p.name)
                );
            }
        }
        if processes.iter().any(|p| p.pid.is_none()) {
            out.push_str("  (N): PID in the process's own namespace; it is not visible from here.\n");
        }
    }
    for p in &l.dying {
        let pid = p.pid.unwrap_or(p.pid_in_namespace);
        let _ = writeln!(
            out,
            "  Dying: PID {pid} ({}) died; the driver may still hold its {}, which stays counted until it is freed.",
            clean(&p.name),
            format_bytes(p.used_bytes)
        );
    }
    for p in &l.dead {
        let pid = p.pid.unwrap_or(p.pid_in_namespace);
        let _ = writeln!(
            out,
            "  Dead: PID {pid} ({}) died holding {}; left for the ledger's own processes to drop (a scanned ledger is only read).",
            clean(&p.name),
            format_bytes(p.used_bytes)
        );
    }
    for p in &l.reclaimed {
        let pid = p.pid.unwrap_or(p.pid_in_namespace);
        if p.used_bytes > 0 {
            let _ =
                writeln!(out, "  Reclaimed: PID {pid} ({}) had exited; the {} it still held went back to the cap.", clean(&p.name), format_bytes(p.used_bytes));
        } else {
            let _ = writeln!(out, "  Reclaimed: PID {pid} ({}) had exited, holding nothing; its entry was removed.", clean(&p.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::fixtures::{process_view, snapshot, GIB};
    use crate::observe::ledgers::{Origin, Target};
    use crate::observe::report::SCHEMA;

    #[test]
    fn control_characters_are_written_as_escapes() {
        assert_eq!(clean("/tmp/x"), "/tmp/x");
        assert_eq!(clean("a\x1b[31mb\nLedger"), "a\\u{1b}[31mb\\nLedger");
        let mut p = process_view(0, 10, true, GIB, 0);
        p.name = "x\x1b[2J".into();
        let target = Target::plain("/l\nLedger /fake".into(), Origin::Env);
        let r = LedgerReport::from_snapshots(&target, &snapshot(vec![p.clone()], GIB), &snapshot(vec![p], GIB));
        let text = render_text(&StatusReport { schema: SCHEMA, ledgers: vec![r], notes: vec![], gpus: vec![] }, 100);
        assert!(!text.contains('\x1b') && !text.lines().any(|l| l.starts_with("Ledger /fake")), "{text}");
    }

    #[test]
    fn bars() {
        assert_eq!(bar(0, 8, 4), "[    ]");
        assert_eq!(bar(4, 8, 4), "[||  ]");
        assert_eq!(bar(9, 8, 4), "[||||]");
        assert_eq!(bar(1, 0, 4), "[    ]");
    }

    #[test]
    fn fgpu_run_keeping_a_place_is_said_as_such_not_listed_as_holding_nothing() {
        let mut launcher = crate::observe::fixtures::process();
        launcher.pid = Some(4242);
        launcher.name = "fgpu".into();
        let mut job = crate::observe::fixtures::process();
        job.name = "python".into();
        let target = Target::plain("/l".into(), Origin::Env);
        let mut r = crate::observe::fixtures::empty(&target);
        r.state = LedgerState::Ok;
        r.processes = vec![launcher.clone()];
        let text = render_text(&StatusReport { schema: SCHEMA, ledgers: vec![r.clone()], notes: vec![], gpus: vec![] }, 100);
        assert!(text.contains("PID 4242 is fgpu run, keeping its job's place") && text.contains("No process is using the ledger."), "{text}");
        assert!(!text.lines().any(|l| l.trim_end().ends_with("  fgpu")), "{text}");
        r.processes = vec![launcher, job];
        let text = render_text(&StatusReport { schema: SCHEMA, ledgers: vec![r], notes: vec![], gpus: vec![] }, 100);
        assert!(text.contains("PID 4242 is fgpu run") && text.lines().any(|l| l.trim_end().ends_with("  python")), "{text}");
    }
}
