//! `fgpu run`: start a command with the front (`libfgpu.so`, which loads the shim) preloaded,
//! the cap set and a ledger of its own, forward signals to it, and leave the way it left.

use super::args::{DeviceArg, LimitArg, RunArgs};
use crate::shimpath;
use fgpu_core::config::{ENV_COMPUTE, ENV_LEDGER, ENV_LEDGER_SHARED, ENV_LIMIT};
use fgpu_core::limit::parse_limit;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

/// fgpu itself failed (the command did not run or its fate is unknown).
pub const EXIT_FGPU_FAILED: i32 = 125;
/// The command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Exited(i32),
    Signaled(i32),
}

/// The value of `FGPU_LIMIT` for `--limit` and `--device` together (`None`: neither was
/// given, as with `--compute` alone). Device entries come first; `--limit`'s plain size
/// becomes the `*` entry. Fails, naming the argument, when a device is given twice.
/// `--device` and `--limit` that make no valid cap together (a device given twice).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--device and --limit together give FGPU_LIMIT={value:?}, which is not valid: {source}")]
pub struct CombinedLimitError {
    pub value: String,
    pub source: fgpu_core::limit::LimitError,
}

pub fn limit_value(limit: Option<&LimitArg>, devices: &[DeviceArg]) -> Result<Option<String>, CombinedLimitError> {
    if devices.is_empty() {
        return Ok(limit.map(|l| l.text.clone()));
    }
    let mut entries: Vec<String> = devices.iter().map(|d| format!("{}={}", d.key, d.amount)).collect();
    if let Some(limit) = limit {
        if limit.text.contains('=') {
            entries.push(limit.text.clone());
        } else {
            entries.push(format!("*={}", limit.text));
        }
    }
    let value = entries.join(",");
    if let Err(source) = parse_limit(&value) {
        return Err(CombinedLimitError { value, source });
    }
    Ok(Some(value))
}

/// `LD_PRELOAD` for the child: the front first, then what was there, minus other copies of
/// the front (two would count every allocation twice). ld.so accepts ':' and ' ' as
/// separators; the result uses ':'.
pub fn preload_value(front: &Path, existing: Option<&OsStr>) -> OsString {
    let mut out = OsString::from(front.as_os_str());
    if let Some(existing) = existing {
        for entry in existing.as_bytes().split(|b| *b == b':' || *b == b' ').filter(|e| !e.is_empty()) {
            let entry = Path::new(OsStr::from_bytes(entry));
            if entry == front || entry.file_name() == Some(OsStr::new(shimpath::FRONT_NAME)) {
                continue;
            }
            out.push(":");
            out.push(entry.as_os_str());
        }
    }
    out
}

/// Exit code for a failure to start the command, as a shell would give it.
pub fn spawn_failure_code(error: &std::io::Error) -> i32 {
    match error.kind() {
        std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
        std::io::ErrorKind::PermissionDenied => EXIT_CANNOT_EXECUTE,
        _ if error.raw_os_error() == Some(libc::ENOEXEC) || error.raw_os_error() == Some(libc::EISDIR) => EXIT_CANNOT_EXECUTE,
        _ => EXIT_FGPU_FAILED,
    }
}

pub fn fate_of(status: std::process::ExitStatus) -> Fate {
    match (status.code(), status.signal()) {
        (Some(code), _) => Fate::Exited(code),
        (None, Some(signal)) => Fate::Signaled(signal),
        _ => Fate::Exited(EXIT_FGPU_FAILED),
    }
}

/// Runs `fgpu run` and returns the process exit code, or does not return when the command
/// was killed by a signal (fgpu then dies of the same signal).
pub fn run(args: RunArgs) -> i32 {
    let limit = match limit_value(args.limit.as_ref(), &args.device) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("fgpu run: {e}");
            return 2;
        }
    };
    let front = match shimpath::locate() {
        Ok(found) => found.path,
        Err(e) => {
            eprintln!("fgpu run: {e}");
            return EXIT_FGPU_FAILED;
        }
    };
    let mut private = None;
    let ledger = match &args.ledger {
        Some(path) => std::path::absolute(path).unwrap_or_else(|_| path.clone()),
        None => match super::private_ledger::PrivateLedger::create() {
            Ok(p) => {
                let path = p.path.clone();
                private = Some(p);
                path
            }
            Err(e) => {
                eprintln!("fgpu run: cannot create a private directory for the ledger in {}: {e}", std::env::temp_dir().display());
                return EXIT_FGPU_FAILED;
            }
        },
    };
    let placed = match args.gpus.as_deref() {
        Some(_) => match super::place::place(&args, limit.as_deref(), &ledger) {
            Ok(placed) => Some(placed),
            Err(e) => {
                eprintln!("fgpu run: {e}");
                return EXIT_FGPU_FAILED;
            }
        },
        None => None,
    };
    let carved = match args.mig.as_deref() {
        Some(profile) => match crate::mig::carve::Carved::new(profile, args.keep) {
            Ok(carved) => Some(carved),
            Err(e) => {
                eprintln!("fgpu run: --mig {profile}: {e}");
                return EXIT_FGPU_FAILED;
            }
        },
        None => None,
    };
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    if let Some(placed) = &placed {
        command.env("CUDA_VISIBLE_DEVICES", &placed.uuid);
    }
    if let Some(carved) = &carved {
        command.env("CUDA_VISIBLE_DEVICES", &carved.entry.mig_uuid);
    }
    command
        .args(rest)
        .env("LD_PRELOAD", preload_value(&front, std::env::var_os("LD_PRELOAD").as_deref()))
        .env(ENV_LEDGER, &ledger)
        // Stated either way: a FGPU_LEDGER_SHARED=1 left in the caller's environment must
        // not open a private run's ledger to every user.
        .env(ENV_LEDGER_SHARED, if args.shared_ledger { "1" } else { "0" });
    if let Some(limit) = &limit {
        command.env(ENV_LIMIT, limit);
    }
    if let Some(compute) = &args.compute {
        command.env(ENV_COMPUTE, &compute.text);
    }

    crate::jobs::signals::install_forwarding();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            crate::jobs::signals::restore_defaults();
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => "command not found".to_string(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                _ => e.to_string(),
            };
            eprintln!("fgpu run: {}: {why}", program.to_string_lossy());
            return spawn_failure_code(&e);
        }
    };
    crate::jobs::signals::set_child(child.id() as i32);
    let status = child.wait();
    crate::jobs::signals::restore_defaults();
    // fgpu's own place in the ledger goes first, so that only the command's processes can
    // keep the private directory.
    drop(placed);
    drop(carved);
    if let Some(p) = private.as_mut() {
        p.finish();
    }
    drop(private);
    match status {
        Ok(status) => match fate_of(status) {
            Fate::Exited(code) => code,
            Fate::Signaled(signal) => crate::jobs::signals::die_of(signal),
        },
        Err(e) => {
            eprintln!("fgpu run: cannot wait for {}: {e}", program.to_string_lossy());
            EXIT_FGPU_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str) -> LimitArg {
        LimitArg { text: text.into() }
    }

    fn device(key: &str, amount: &str) -> DeviceArg {
        DeviceArg { key: key.into(), amount: amount.into() }
    }

    #[test]
    fn limit_and_devices_combine() {
        assert_eq!(limit_value(Some(&limit("8G")), &[]).unwrap().unwrap(), "8G");
        assert_eq!(limit_value(Some(&limit("8G")), &[device("GPU-1a", "16G")]).unwrap().unwrap(), "GPU-1a=16G,*=8G");
        assert_eq!(limit_value(None, &[device("GPU-1a", "16G"), device("GPU-2b", "50%")]).unwrap().unwrap(), "GPU-1a=16G,GPU-2b=50%");
        assert_eq!(limit_value(Some(&limit("GPU-3=1G,*=2G")), &[device("GPU-1a", "16G")]).unwrap().unwrap(), "GPU-1a=16G,GPU-3=1G,*=2G");
        let err = limit_value(Some(&limit("GPU-1a=1G")), &[device("GPU-1a", "16G")]).unwrap_err().to_string();
        assert!(err.contains("--device") && err.contains("given twice"), "{err}");
        assert_eq!(limit_value(None, &[]), Ok(None), "--compute alone sets no memory cap");
    }

    #[test]
    fn the_front_goes_first_and_only_once() {
        let front = Path::new("/opt/fgpu/lib/libfgpu.so");
        assert_eq!(preload_value(front, None), "/opt/fgpu/lib/libfgpu.so");
        assert_eq!(preload_value(front, Some(OsStr::new(""))), "/opt/fgpu/lib/libfgpu.so");
        assert_eq!(
            preload_value(front, Some(OsStr::new("/usr/lib/libjemalloc.so.2 /old/libfgpu.so:/opt/fgpu/lib/libfgpu.so:libx.so"))),
            "/opt/fgpu/lib/libfgpu.so:/usr/lib/libjemalloc.so.2:libx.so"
        );
    }

    #[test]
    fn spawn_failures_map_like_a_shell() {
        use std::io::{Error, ErrorKind};
        assert_eq!(spawn_failure_code(&Error::from(ErrorKind::NotFound)), 127);
        assert_eq!(spawn_failure_code(&Error::from(ErrorKind::PermissionDenied)), 126);
        assert_eq!(spawn_failure_code(&Error::from_raw_os_error(libc::ENOEXEC)), 126);
        assert_eq!(spawn_failure_code(&Error::from_raw_os_error(libc::ENOMEM)), 125);
    }

    #[test]
    fn fates() {
        let exited = std::process::ExitStatus::from_raw(3 << 8);
        assert_eq!(fate_of(exited), Fate::Exited(3));
        let killed = std::process::ExitStatus::from_raw(libc::SIGTERM);
        assert_eq!(fate_of(killed), Fate::Signaled(libc::SIGTERM));
    }
}
