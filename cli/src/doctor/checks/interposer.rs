//! Other CUDA interposers preloaded beside fgpu (HAMi-core's `libvgpu.so`, ...): their
//! own handling of allocations may never reach fgpu.

use crate::doctor::facts::{Facts, PreloadEntry};
use crate::doctor::finding::{finding, Finding, Level};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub fn check(f: &Facts, out: &mut Vec<Finding>) {
    let others: Vec<&PreloadEntry> = f.preloads.iter().filter(|p| p.interposes).collect();
    if others.is_empty() {
        out.push(finding("interposer", Level::Ok, "No other CUDA interposer is preloaded.", None));
    }
    for p in others {
        let what = if Path::new(&p.path).file_name().is_some_and(|n| n.as_bytes().starts_with(b"libvgpu")) { " (HAMi-core)" } else { "" };
        out.push(finding(
            "interposer",
            Level::Fail,
            format!("{}{what}, preloaded through {}, also intercepts CUDA memory calls: allocations it handles itself may never reach fgpu, so fgpu's cap is not guaranteed.", p.path, p.source),
            Some(format!("Use one of the two: remove {} from {}, or stop preloading fgpu.", p.path, p.source)),
        ));
    }
}
