//! One-line diagnostics on stderr, prefixed `fgpu:`, filtered by `FGPU_LOG`.
//!
//! Written with a single `write(2)` so lines from several threads and processes do not
//! interleave, and so logging never takes a Rust lock inside a driver hook.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Quiet = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl std::str::FromStr for Level {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "quiet" | "off" | "none" => Ok(Level::Quiet),
            "error" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" | "trace" => Ok(Level::Debug),
            _ => Err(()),
        }
    }
}

impl Level {
    /// The level's name as `FGPU_LOG` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Quiet => "quiet",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level != Level::Quiet && level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes `fgpu: <message>\n` to stderr if `level` is enabled.
pub fn emit(level: Level, message: std::fmt::Arguments<'_>) {
    if enabled(level) {
        write_line(message);
    }
}

/// Like [`emit`], but filtered by `threshold` instead of the process's level (for lines
/// written before that level is set).
pub fn emit_under(threshold: Level, level: Level, message: std::fmt::Arguments<'_>) {
    if level != Level::Quiet && level <= threshold {
        write_line(message);
    }
}

fn write_line(message: std::fmt::Arguments<'_>) {
    let line = format!("fgpu: {message}\n");
    crate::sys::write_stderr(line.as_bytes());
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::emit($level, format_args!($($arg)*))
    };
}

/// Lets at most one event per `interval_ns` through; counts the ones it held back.
pub struct RateLimit {
    next_ns: AtomicU64,
    suppressed: AtomicU64,
    interval_ns: u64,
}

impl RateLimit {
    pub const fn new(interval_ns: u64) -> Self {
        RateLimit { next_ns: AtomicU64::new(0), suppressed: AtomicU64::new(0), interval_ns }
    }

    /// `Some(n)` when this event may be reported, `n` being how many were held back since the
    /// last one; `None` when it must be dropped.
    pub fn check(&self, now_ns: u64) -> Option<u64> {
        let next = self.next_ns.load(Ordering::Relaxed);
        if now_ns >= next && self.next_ns.compare_exchange(next, now_ns + self.interval_ns, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// CLOCK_MONOTONIC in nanoseconds (system-wide, the same in every process and container).
pub fn monotonic_ns() -> u64 {
    crate::sys::monotonic_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("DEBUG".parse(), Ok(Level::Debug));
        assert_eq!("quiet".parse(), Ok(Level::Quiet));
        assert!("loud".parse::<Level>().is_err());
        assert!(Level::Error < Level::Debug);
        for level in [Level::Quiet, Level::Error, Level::Warn, Level::Info, Level::Debug] {
            assert_eq!(level.name().parse(), Ok(level));
        }
    }

    #[test]
    fn rate_limit_counts_suppressed_events() {
        let limit = RateLimit::new(1000);
        assert_eq!(limit.check(5000), Some(0));
        assert_eq!(limit.check(5100), None);
        assert_eq!(limit.check(5200), None);
        assert_eq!(limit.check(6001), Some(2));
    }
}
