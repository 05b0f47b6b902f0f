//! The one skip policy ([`prerequisite`]): what tests/run.sh provides, what CI requires,
//! and how a skip is counted.

use crate::paths::workspace;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of the test venv (FGPU_TEST_PYTHON, set by tests/run.sh), if it can import
/// `module`. Missing under CI is a failure; elsewhere the test prints why it skipped.
pub fn python_with(module: &str) -> Option<PathBuf> {
    let found = std::env::var_os("FGPU_TEST_PYTHON").map(PathBuf::from).or_else(|| {
        let venv = workspace().join(".venv/bin/python");
        venv.exists().then_some(venv)
    });
    let usable = found.filter(|p| Command::new(p).args(["-c", &format!("import {module}")]).output().map(|o| o.status.success()).unwrap_or(false));
    prerequisite(usable.is_some(), &format!("no Python with {module} (tests/run.sh creates .venv with it)"));
    usable
}

/// Whether the tests run under CI: `CI` set to anything but empty, `0`, `false` or `no`
/// (CI services set `CI=true`; `CI=false` is how one says "not CI").
pub fn under_ci() -> bool {
    ci_value_means_ci(std::env::var_os("CI").as_deref())
}

fn ci_value_means_ci(value: Option<&std::ffi::OsStr>) -> bool {
    let Some(value) = value else { return false };
    let value = value.to_string_lossy().trim().to_ascii_lowercase();
    !matches!(value.as_str(), "" | "0" | "false" | "no")
}

/// The one skip policy of the tests: whether a test's prerequisite (root, a tool, a file
/// tests/run.sh prepares) is there. Under CI ([`under_ci`]) a missing one is a failure: CI
/// runs as root and tests/run.sh installs every tool, so a test never passes there without
/// having run. Elsewhere the skip is counted ([`record_skip`]) and the caller skips the
/// test, or the part of it that needs the prerequisite (`if prerequisite(..) { .. }`).
/// Never skip any other way.
pub fn prerequisite(present: bool, what: &str) -> bool {
    if !present {
        assert!(!under_ci(), "missing under CI: {what} (CI runs as root; tests/run.sh installs the tools)");
        record_skip(what);
    }
    present
}

/// The variable naming the file every skip is written to, one line each (tests/run.sh sets
/// it, counts the lines in its summary, and fails under CI when there is any).
pub const SKIP_LOG_VAR: &str = "FGPU_TEST_SKIP_LOG";

/// Makes a skip visible and counted. cargo test captures what a passing test prints, so
/// the line `SKIPPED: <test>: <why>` goes to the process's own standard error, which the
/// capture does not take, and is appended to the file [`SKIP_LOG_VAR`] names, if any.
/// Called by [`prerequisite`]; a test never calls it itself.
fn record_skip(what: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("(a test)");
    let line = format!("SKIPPED: {test}: {}\n", what.replace('\n', " "));
    // Written whole in one call each, so lines of tests running at once do not interleave.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os(SKIP_LOG_VAR).filter(|p| !p.is_empty()) {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        let written = file.and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!("cannot record the skip in {SKIP_LOG_VAR}={}: {e}", Path::new(&log).display());
        }
    }
}

/// A path tests/run.sh provides through the variable `var` (a Python venv, a tool it
/// fetched), under [`prerequisite`]'s policy: `None` after saying why when it is not set.
pub fn provided_path(var: &str, what: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from);
    if let Some(path) = &path {
        assert!(path.exists(), "{var}={} does not exist", path.display());
    }
    prerequisite(path.is_some(), &format!("{var} is not set: {what} (tests/run.sh sets it)")).then_some(path).flatten()
}

/// Whether a program is on PATH.
pub fn tool(name: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {name} >/dev/null")]).status().map(|s| s.success()).unwrap_or(false)
}

/// Whether we run as root (namespace and mount tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ci_means_a_true_value_of_ci() {
        let means = |v: Option<&str>| super::ci_value_means_ci(v.map(std::ffi::OsStr::new));
        for ci in ["true", "TRUE", "1", "yes", "github"] {
            assert!(means(Some(ci)), "{ci}");
        }
        for not in [None, Some(""), Some("false"), Some("False"), Some("0"), Some("no"), Some(" false ")] {
            assert!(!means(not), "{not:?}");
        }
    }

    /// tests/run.sh decides whether it runs under CI (skips fail, prerequisites must be
    /// there) by the same rule as the tests: `bash tests/run.sh --is-ci` agrees with
    /// `under_ci` on every value.
    #[test]
    fn run_sh_decides_ci_by_the_same_rule() {
        let script = super::workspace().join("tests/run.sh");
        for value in [None, Some(""), Some("true"), Some("TRUE"), Some("1"), Some("yes"), Some("github"), Some("false"), Some(" False "), Some("0"), Some("no")]
        {
            let mut bash = std::process::Command::new("bash");
            bash.arg(&script).arg("--is-ci");
            match value {
                Some(v) => bash.env("CI", v),
                None => bash.env_remove("CI"),
            };
            let status = bash.status().expect("bash");
            let tests_say = super::ci_value_means_ci(value.map(std::ffi::OsStr::new));
            assert_eq!(status.success(), tests_say, "CI={value:?}: tests/run.sh --is-ci exits {status}, the tests say {tests_say}");
        }
    }
}
