//! What a check of `fgpu doctor` finds: a level, a message, and what to do about it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Info,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// shim, preload, cap, compute, driver, ledger, shm, pidns or interposer.
    pub check: &'static str,
    pub level: Level,
    pub message: String,
    /// What to do about it, for warnings and failures.
    pub advice: Option<String>,
}

pub fn finding(check: &'static str, level: Level, message: impl Into<String>, advice: Option<String>) -> Finding {
    Finding { check, level, message: message.into(), advice }
}
