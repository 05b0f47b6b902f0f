//! `fgpu run`: start a command with the front (`libfgpu.so`, which loads the shim) preloaded,
//! the cap set and a ledger of its own, forward signals to it, and leave the way it left.

use super::args::{DeviceArg, LimitArg, RunArgs};
use crate::shimpath;
use fgpu_core::config::{ENV_COMPUTE, ENV_LEDGER, ENV_LEDGER_SHARED, ENV_LIMIT};
use fgpu_core::ledger::Ledger;
use fgpu_core::limit::parse_limit;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
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
pub fn limit_value(limit: Option<&LimitArg>, devices: &[DeviceArg]) -> Result<Option<String>, String> {
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
    parse_limit(&value).map_err(|e| format!("--device and --limit together give FGPU_LIMIT={value:?}, which is not valid: {e}"))?;
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

/// Prefix of the private directories; `mkdtemp` adds six characters.
const PRIVATE_PREFIX: &str = "fgpu-run-";
/// The file in a private directory whose `flock` the `fgpu run` that made it holds for its
/// whole life. The kernel drops the lock when that process ends, however it ends (SIGKILL
/// included), so a lock that can be taken means the owner is gone, whatever has become of
/// its PID since.
const OWNER_LOCK: &str = "owner.lock";

/// A private directory holding a fresh ledger, removed when dropped unless kept.
pub struct PrivateLedger {
    dir: PathBuf,
    pub path: PathBuf,
    keep: bool,
    /// Holds the owner lock (opened close-on-exec: the command does not inherit it).
    _owner: std::fs::File,
}

impl PrivateLedger {
    /// Creates `fgpu-run-XXXXXX` (mode 0700) under `$XDG_RUNTIME_DIR` if usable, else the
    /// temporary directory (`$TMPDIR` or /tmp), after sweeping that place of the stale
    /// directories of earlier runs ([`sweep_stale`]).
    pub fn create() -> std::io::Result<PrivateLedger> {
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute() && writable_dir(p)).unwrap_or_else(std::env::temp_dir);
        sweep_stale(&base);
        let dir = fgpu_core::sys::files::mkdtemp(&base.join(format!("{PRIVATE_PREFIX}XXXXXX")))?;
        let owner = match take_owner_lock(&dir) {
            Ok(owner) => owner,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(PrivateLedger { path: dir.join("ledger"), dir, keep: false, _owner: owner })
    }

    /// After the command ended: keep the directory if processes the command left behind
    /// still use the ledger (they would lose nothing, but `fgpu status` could not find it).
    pub fn finish(&mut self) {
        let Ok(ledger) = Ledger::open_existing(&self.path) else { return };
        ledger.set_still_held(Box::new(crate::driver::lists::may_still_hold));
        ledger.reclaim_dead(None);
        let snapshot = ledger.snapshot(None);
        let alive: Vec<String> = snapshot.processes.iter().filter(|p| p.alive).map(|p| format!("{} ({})", p.pid_here.unwrap_or(p.pid), p.name)).collect();
        if !alive.is_empty() {
            self.keep = true;
            eprintln!(
                "fgpu: the command ended but {} of its processes still use the cap: {}; keeping {} while they run (the next fgpu run removes it once they are gone)",
                alive.len(),
                alive.join(", "),
                self.path.display()
            );
        }
    }
}

impl Drop for PrivateLedger {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Creates the owner lock in a new private directory and takes it.
fn take_owner_lock(dir: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(OWNER_LOCK))?;
    if !try_flock(&file) {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

/// Takes an exclusive `flock` on `file` without waiting; false if another holds it.
fn try_flock(file: &std::fs::File) -> bool {
    fgpu_core::sys::files::flock(std::os::fd::AsFd::as_fd(file), fgpu_core::sys::files::FlockWait::NoWait).is_ok()
}

/// Removes the private directories under `base` left by runs that are over: this user's
/// `fgpu-run-XXXXXX` directories whose owner lock can be taken (the `fgpu run` that made it
/// is gone: killed with SIGKILL, or it ended and kept the directory for processes that
/// outlived the command) and whose ledger, if any, no live process uses. A directory
/// without an owner lock is left alone (one being made this instant, or one of an older
/// fgpu). Returns how many were removed.
pub fn sweep_stale(base: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else { return 0 };
    let me = fgpu_core::sys::geteuid();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(PRIVATE_PREFIX) && name.len() == PRIVATE_PREFIX.len() + 6) {
            continue;
        }
        let dir = entry.path();
        // Not followed: a link named like ours is not ours.
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() && meta.uid() == me => {}
            _ => continue,
        }
        let Ok(lock) = std::fs::File::open(dir.join(OWNER_LOCK)) else { continue };
        // Held while we look and remove, so two sweeps never race over one directory.
        if !try_flock(&lock) || still_used(&dir.join("ledger")) {
            continue;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a live process uses the ledger at `path`. A ledger that cannot be read is taken
/// to be in use (it may be being created this instant); no ledger at all, or one no process
/// is attached to (it went away with its last process), is not.
fn still_used(path: &Path) -> bool {
    match Ledger::open_existing(path) {
        Ok(ledger) => {
            ledger.set_still_held(Box::new(crate::driver::lists::may_still_hold));
            ledger.reclaim_dead(None);
            ledger.snapshot(None).processes.iter().any(|p| p.alive)
        }
        Err(fgpu_core::ledger::LedgerError::NotInUse { .. }) => false,
        Err(_) => path.exists(),
    }
}

fn writable_dir(path: &Path) -> bool {
    path.is_dir() && fgpu_core::sys::files::access(path, libc::W_OK | libc::X_OK).is_ok()
}

/// Where `--gpus auto` put the job: the GPU, and fgpu's own place in the job's ledger,
/// which holds the job's cap on that GPU from before the placement lock is let go until
/// the command ends (so the next placement counts it even before the job's first CUDA
/// call).
struct Placed {
    uuid: String,
    held: Option<(Ledger, fgpu_core::ledger::SlotId)>,
}

impl Drop for Placed {
    fn drop(&mut self) {
        if let Some((ledger, slot)) = self.held.take() {
            ledger.leave(slot);
        }
    }
}

/// The placement lock: one `--gpus auto` at a time chooses and claims, per user (placements
/// of other users count only what the driver shows of this user's jobs, and this user's
/// only what it shows of theirs). It lives in the directory of the user's default ledger,
/// which no other user can write; where every such place is taken (another user squatted
/// them), in `~/.cache/fgpu` if the user's home directory is the user's own; else the
/// placement is refused, since two at once could both count the same room.
fn placement_lock() -> Result<std::fs::File, String> {
    let uid = fgpu_core::sys::geteuid();
    let default = fgpu_core::ledger::default_path::choose(uid, &fgpu_core::ledger::default_path::OsPlaces)
        .and_then(|d| d.path.parent().map(Path::to_path_buf).ok_or_else(|| "the default ledger has no directory".to_string()))
        .and_then(|dir| {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
            Ok(dir)
        });
    let dir = match default {
        Ok(dir) => dir,
        Err(why) => home_cache(uid).map_err(|home| {
            format!("--gpus auto: no safe place for the placement lock ({why}; and {home}); two placements at once could pick the same room, so none is made")
        })?,
    };
    let path = dir.join("placement.lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("--gpus auto: cannot open the placement lock {}: {e}", path.display()))?;
    // Waits for other placements.
    if let Err(e) = fgpu_core::sys::files::flock(std::os::fd::AsFd::as_fd(&file), fgpu_core::sys::files::FlockWait::Wait) {
        return Err(format!("--gpus auto: cannot lock {}: {e}", path.display()));
    }
    Ok(file)
}

/// `~/.cache/fgpu` of user `uid` (home from the password database, not `HOME`), made 0700
/// where missing: only if the home directory and each directory below it are the user's
/// own, not links, and writable by nobody else.
fn home_cache(uid: u32) -> Result<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let home = fgpu_core::sys::host::home_of(uid).ok_or_else(|| format!("uid {uid} has no home directory in the password database"))?;
    let mut dir = home;
    for (i, part) in ["", ".cache", "fgpu"].iter().enumerate() {
        if i > 0 {
            dir.push(part);
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
            }
        }
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(format!("{} is not a directory of uid {uid}'s that only it may write", dir.display()));
        }
    }
    Ok(dir)
}

/// `--gpus auto`: chooses the GPU with the most room for the job's cap and registers the
/// cap there in the job's ledger.
fn place(args: &RunArgs, limit: Option<&str>, ledger: &Path) -> Result<Placed, String> {
    let spec = limit.map(parse_limit).transpose().map_err(|e| format!("--limit: {e}"))?;
    let compute = args.compute.as_ref().map(|c| fgpu_core::compute::parse_share(&c.text)).transpose().map_err(|e| format!("--compute: {e}"))?;
    let (mut said, mut last_said) = (String::new(), std::time::Instant::now());
    loop {
        let probe = crate::driver::probe::probe_driver().map_err(|e| e.to_string())?;
        if probe.devices.is_empty() {
            return Err(format!("--gpus auto: the driver lists no GPU ({})", probe.nvml.error.as_deref().unwrap_or("NVML lists none")));
        }
        let _lock = placement_lock()?;
        let seen =
            crate::observe::report::collect(crate::observe::ledgers::resolve(&crate::observe::args::LedgerSelection { all: true, ..Default::default() }));
        let rooms = crate::observe::rooms::rooms(&probe.devices, &seen.ledgers);
        let need = |r: &crate::observe::report::GpuRoom| spec.as_ref().and_then(|s| s.cap_for(&r.uuid, r.total_bytes)).unwrap_or(0).min(r.total_bytes);
        match crate::jobs::placement::choose(&rooms, need) {
            Ok(room) if spec.is_none() => {
                // No memory cap: nothing to commit; the GPU with the most room is enough.
                eprintln!(
                    "fgpu run: on GPU {} ({}): {} left of {}",
                    room.index,
                    room.uuid,
                    fgpu_core::limit::format_bytes(room.left_bytes),
                    fgpu_core::limit::format_bytes(room.total_bytes)
                );
                return Ok(Placed { uuid: room.uuid.clone(), held: None });
            }
            Ok(room) => {
                let sharing = if args.shared_ledger { fgpu_core::ledger::Sharing::Shared } else { fgpu_core::ledger::Sharing::Private };
                let held = Ledger::open(ledger, sharing).map_err(|e| e.to_string())?;
                let slot = held.join().map_err(|e| e.to_string())?;
                let uuid = fgpu_core::uuid::parse_gpu_uuid(&room.uuid).ok_or_else(|| format!("the driver named a GPU {:?} fgpu cannot read", room.uuid))?;
                let cap = need(room);
                let cap = if cap == 0 { room.total_bytes } else { cap };
                let device = held.register_device(uuid, room.total_bytes, cap, Some(slot)).map_err(|e| e.to_string())?.device;
                if let Some(share) = compute.as_ref().and_then(|c| c.share_for(&room.uuid)) {
                    held.register_compute(device, share, Some(slot)).map_err(|e| e.to_string())?;
                }
                eprintln!(
                    "fgpu run: on GPU {} ({}): {} left of {} before this job",
                    room.index,
                    room.uuid,
                    fgpu_core::limit::format_bytes(room.left_bytes),
                    fgpu_core::limit::format_bytes(room.total_bytes)
                );
                return Ok(Placed { uuid: room.uuid.clone(), held: Some((held, slot)) });
            }
            Err(_) if args.wait => {
                // Said at once, and again when it changes, at most every 10 s.
                let why = crate::jobs::placement::waiting_for(&probe.devices, &rooms, &seen.ledgers, need);
                if said.is_empty() || (why != said && last_said.elapsed() >= std::time::Duration::from_secs(10)) {
                    eprintln!("fgpu run: {why}");
                    said = why;
                    last_said = std::time::Instant::now();
                }
                drop(_lock);
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            Err(why) => return Err(why),
        }
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
        None => match PrivateLedger::create() {
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
        Some(_) => match place(&args, limit.as_deref(), &ledger) {
            Ok(placed) => Some(placed),
            Err(e) => {
                eprintln!("fgpu run: {e}");
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
        let err = limit_value(Some(&limit("GPU-1a=1G")), &[device("GPU-1a", "16G")]).unwrap_err();
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

    #[test]
    fn stale_private_directories_are_swept_live_ones_kept() {
        let base = std::env::temp_dir().join(format!("fgpu-run-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let make = |name: &str, lock: bool| {
            let dir = base.join(name);
            std::fs::create_dir(&dir).unwrap();
            if lock {
                std::fs::write(dir.join(OWNER_LOCK), b"").unwrap();
            }
            dir
        };
        // Owner gone (nobody holds its lock), no ledger: swept.
        let stale = make("fgpu-run-aaaaaa", true);
        // Owner alive: this test holds the lock, as a running fgpu run does.
        let live = make("fgpu-run-bbbbbb", true);
        let held = std::fs::File::open(live.join(OWNER_LOCK)).unwrap();
        assert!(try_flock(&held));
        // Owner gone, but a live process still uses the ledger: kept.
        let used = make("fgpu-run-cccccc", true);
        let ledger = Ledger::open_or_create(&used.join("ledger")).unwrap();
        let _slot = ledger.join().unwrap();
        // No owner lock at all (being made, or an older fgpu's), or not ours by name: kept.
        let unlocked = make("fgpu-run-dddddd", false);
        let other_name = make("fgpu-run-toolong", true);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!stale.exists());
        for kept in [&live, &used, &unlocked, &other_name] {
            assert!(kept.exists(), "{} must be kept", kept.display());
        }
        // Once the holder of the ledger leaves, the directory goes at the next sweep.
        drop(ledger);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!used.exists());
        drop(held);
        assert_eq!(sweep_stale(&base), 1);
        assert!(!live.exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn private_ledger_is_private_and_removed() {
        let p = PrivateLedger::create().unwrap();
        let dir = p.path.parent().unwrap().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("fgpu-run-"));
        drop(p);
        assert!(!dir.exists());
    }
}
