//! Whether the front is preloaded (`LD_PRELOAD` or /etc/ld.so.preload), and entries there
//! that name nothing.

use crate::doctor::facts::{Facts, LD_SO_PRELOAD};
use crate::doctor::finding::{finding, Finding, Level};

/// Whether the front is preloaded here.
pub fn check(f: &Facts, out: &mut Vec<Finding>) -> bool {
    let mut preloaded = false;
    for p in f.preloads.iter().filter(|p| !p.exists) {
        out.push(finding(
            "preload",
            if p.is_fgpu { Level::Fail } else { Level::Warn },
            format!("{} names {}, which does not exist; the dynamic loader skips it with an error in every program.", p.source, p.path),
            Some(format!("Correct or remove the entry in {}.", p.source)),
        ));
    }
    for p in f.preloads.iter().filter(|p| p.exists && p.is_fgpu) {
        preloaded = true;
        let scope = if p.source == LD_SO_PRELOAD { "for every program on this system" } else { "for programs started from this environment" };
        out.push(finding("preload", Level::Ok, format!("{} is preloaded {scope} (through {}).", p.path, p.source), None));
    }
    if !preloaded {
        out.push(finding(
            "preload",
            Level::Warn,
            "libfgpu.so is not preloaded here: programs started from this environment are not capped unless they are started with `fgpu run`.",
            Some("Start jobs with `fgpu run --limit SIZE -- COMMAND`, or set LD_PRELOAD to the path of libfgpu.so (in a container image, write it to /etc/ld.so.preload).".into()),
        ));
    }
    preloaded
}
