//! The ledger in effect (healthy, not in use yet, replaced, or broken), and the room left
//! for ledgers in the kernel's shared-memory limits (each ledger is one System V segment).

use crate::doctor::facts::{Facts, LedgerFact};
use crate::doctor::finding::{finding, Finding, Level};
use crate::observe::ledgers::Origin;
use fgpu_core::ledger::shm_usage::ShmUsage;

pub fn check(f: &Facts, out: &mut Vec<Finding>) {
    let origin = match f.ledger_origin {
        Origin::Env => "from FGPU_LEDGER",
        Origin::ConfigFile => "from /etc/fgpu/fgpu.conf",
        _ => "the default",
    };
    let lp = f.ledger_path.display();
    match &f.ledger {
        LedgerFact::Healthy { devices, processes } => out.push(finding("ledger", Level::Ok, format!("The ledger {lp} ({origin}) is healthy: {devices} GPU(s), {processes} live process(es)."), None)),
        LedgerFact::Missing { dir_problem: None, .. } => out.push(finding("ledger", Level::Ok, format!("The ledger {lp} ({origin}) is not in use; the first capped process creates it."), None)),
        LedgerFact::FileReplaced(why) => out.push(finding(
            "ledger",
            Level::Warn,
            format!("The ledger {lp} ({origin}) is in use, but {why}. New processes reach the old file through a running member's /proc/PID/fd where they may, and refuse GPU memory where they may not."),
            Some("Do not delete or replace a ledger's file while its processes run; the ledger is whole again once they have all exited.".into()),
        )),
        LedgerFact::Missing { dir, dir_problem: Some(p) } => out.push(finding(
            "ledger",
            Level::Fail,
            format!("The ledger {lp} ({origin}) does not exist and capped processes cannot create it: {p}."),
            Some(format!("Make {} writable for the users who run GPU jobs, or set FGPU_LEDGER to a writable place.", dir.display())),
        )),
        LedgerFact::Broken(e) => out.push(finding("ledger", Level::Fail, format!("The ledger cannot be used: {e}"), Some("Stop the capped processes that use it, then remove the file; or set FGPU_LEDGER to another file.".into()))),
    }
}

/// Room for ledgers: each is one System V segment.
pub fn check_shm(f: &Facts, out: &mut Vec<Finding>) {
    if let Some(usage) = &f.shm {
        out.push(shm_finding(usage, matches!(f.ledger, LedgerFact::Healthy { .. })));
    }
}

/// at `kernel.shmmni` segments (or `kernel.shmall` pages) no new ledger can be made, and
/// capped processes that need one are refused GPU memory. `in_use`: the ledger in effect
/// exists already (its processes join it without a new segment).
fn shm_finding(usage: &ShmUsage, in_use: bool) -> Finding {
    let page = fgpu_core::sys::page_size();
    let figures = format!(
        "{} of kernel.shmmni {} shared-memory segments and {} of kernel.shmall {} pages in use in this IPC namespace",
        usage.segments, usage.max_segments, usage.pages, usage.max_pages
    );
    let who = if usage.segments > 0 { format!(" ({})", usage.owners()) } else { String::new() };
    let advice = Some("Find the segments with `ipcs -m` and remove the unused ones with `ipcrm`, or raise the limit (`sysctl kernel.shmmni=N`).".to_string());
    match usage.limit_reached(fgpu_core::ledger::layout::SEGMENT_SIZE as u64, page) {
        Some(limit) => {
            let level = if in_use { Level::Warn } else { Level::Fail };
            let effect = if in_use {
                "The ledger in effect exists, so its new processes still join it; but no new ledger can be made here (a `fgpu run`, another user's first GPU process), and those are refused GPU memory."
            } else {
                "No ledger can be made here, so capped processes are refused GPU memory."
            };
            let limit = limit.replacen("this IPC namespace", "This IPC namespace", 1);
            finding("shm", level, format!("{limit}{who}: {figures}. {effect}"), advice)
        }
        None if usage.segments * 10 >= usage.max_segments * 9 => {
            finding("shm", Level::Warn, format!("Shared memory is nearly full: {figures}{who}; each ledger needs one more segment."), advice)
        }
        None => finding("shm", Level::Ok, format!("Room for ledgers: {figures}."), None),
    }
}
