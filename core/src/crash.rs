//! Crash points: named places in the accounting where a test build of the shim kills its
//! own process, so that every crash window is tested deterministically.
//!
//! Compiled only with the `crash-points` feature (never in the released library). A process
//! with `FGPU_CRASH_AT=NAME` (or `NAME@N` for the N-th time the point is reached) sends
//! itself SIGKILL there: no handler, no unwinding, no flush, as a kill -9 would. With
//! `FGPU_PANIC_AT=NAME` it panics there instead (the hooks must catch it and answer as the
//! driver did, when it already had).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

struct Target {
    name: String,
    nth: u64,
}

static TARGET: OnceLock<Option<Target>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);
static PANIC_AT: OnceLock<Option<String>> = OnceLock::new();

fn target() -> Option<&'static Target> {
    TARGET
        .get_or_init(|| {
            let value = std::env::var("FGPU_CRASH_AT").ok()?;
            let (name, nth) = match value.split_once('@') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
                None => (value, 1),
            };
            Some(Target { name, nth })
        })
        .as_ref()
}

/// Kills this process if it is the configured crash point (and hit the configured time).
pub fn point(name: &str) {
    if PANIC_AT.get_or_init(|| std::env::var("FGPU_PANIC_AT").ok()).as_deref() == Some(name) {
        panic!("test panic at crash point {name}");
    }
    let Some(target) = target() else { return };
    if target.name == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == target.nth {
        crate::sys::kill_self();
    }
}

/// A named crash point (see the module): nothing at all without the `crash-points` feature.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        $crate::crash::point($name)
    };
}
