//! `fgpu run --gpus auto`: the GPU with the most room for the job's cap, chosen and
//! claimed under a placement lock (`placement.rs` chooses, `crate::observe::rooms` says what
//! each GPU has committed).

use super::args::RunArgs;
use super::placement::NoRoom;
use crate::driver::probe::ProbeError;
use fgpu_core::ledger::{Ledger, LedgerError};
use fgpu_core::limit::{parse_limit, LimitError};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why `--gpus auto` placed nothing.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("--limit: {0}")]
    Limit(LimitError),
    #[error("--compute: {0}")]
    Compute(LimitError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// What NVML said, or that it lists none.
    #[error("--gpus auto: the driver lists no GPU ({0})")]
    NoGpu(String),
    #[error("--gpus auto: no safe place for the placement lock ({default}; and {home}); two placements at once could pick the same room, so none is made")]
    NoLockPlace { default: LockPlaceError, home: LockPlaceError },
    #[error("--gpus auto: cannot open the placement lock {}: {source}", path.display())]
    OpenLock { path: PathBuf, source: std::io::Error },
    #[error("--gpus auto: cannot lock {}: {source}", path.display())]
    Lock { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the driver named a GPU {0:?} fgpu cannot read")]
    BadUuid(String),
    #[error(transparent)]
    NoRoom(#[from] NoRoom),
    /// The GPUs in MIG mode, when every GPU is.
    #[error("--gpus auto: every GPU is in MIG mode ({0}); a whole-GPU job cannot run there: use --mig PROFILE")]
    AllMig(String),
}

/// Why a directory cannot hold the placement lock.
#[derive(Debug, thiserror::Error)]
pub enum LockPlaceError {
    #[error(transparent)]
    NoDefault(#[from] fgpu_core::config::NoPlaceLeft),
    #[error("the default ledger has no directory")]
    NoDirectory,
    #[error("cannot make {}: {source}", dir.display())]
    Make { dir: PathBuf, source: std::io::Error },
    #[error("uid {0} has no home directory in the password database")]
    NoHome(u32),
    #[error("{}: {source}", dir.display())]
    Inspect { dir: PathBuf, source: std::io::Error },
    #[error("{} is not a directory of uid {uid}'s that only it may write", dir.display())]
    NotOwn { dir: PathBuf, uid: u32 },
}

/// Where `--gpus auto` put the job: the GPU, and fgpu's own place in the job's ledger,
/// which holds the job's cap on that GPU from before the placement lock is let go until
/// the command ends (so the next placement counts it even before the job's first CUDA
/// call).
pub struct Placed {
    pub uuid: String,
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
fn placement_lock() -> Result<std::fs::File, PlaceError> {
    let uid = fgpu_core::sys::geteuid();
    let default = fgpu_core::ledger::default_path::choose(uid, &fgpu_core::ledger::default_path::OsPlaces)
        .map_err(LockPlaceError::from)
        .and_then(|d| d.path.parent().map(Path::to_path_buf).ok_or(LockPlaceError::NoDirectory))
        .and_then(|dir| match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            Ok(()) => Ok(dir),
            Err(source) => Err(LockPlaceError::Make { dir, source }),
        });
    let dir = match default {
        Ok(dir) => dir,
        Err(default) => home_cache(uid).map_err(|home| PlaceError::NoLockPlace { default, home })?,
    };
    let path = dir.join("placement.lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| PlaceError::OpenLock { path: path.clone(), source })?;
    // Waits for other placements.
    if let Err(source) = fgpu_core::sys::files::flock(std::os::fd::AsFd::as_fd(&file), fgpu_core::sys::files::FlockWait::Wait) {
        return Err(PlaceError::Lock { path, source });
    }
    Ok(file)
}

/// `~/.cache/fgpu` of user `uid` (home from the password database, not `HOME`), made 0700
/// where missing: only if the home directory and each directory below it are the user's
/// own, not links, and writable by nobody else.
fn home_cache(uid: u32) -> Result<PathBuf, LockPlaceError> {
    use std::os::unix::fs::MetadataExt;
    let home = fgpu_core::sys::host::home_of(uid).ok_or(LockPlaceError::NoHome(uid))?;
    let mut dir = home;
    for (i, part) in ["", ".cache", "fgpu"].iter().enumerate() {
        if i > 0 {
            dir.push(part);
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(LockPlaceError::Make { dir, source }),
            }
        }
        let meta = match std::fs::symlink_metadata(&dir) {
            Ok(meta) => meta,
            Err(source) => return Err(LockPlaceError::Inspect { dir, source }),
        };
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(LockPlaceError::NotOwn { dir, uid });
        }
    }
    Ok(dir)
}

/// `--gpus auto`: chooses the GPU with the most room for the job's cap and registers the
/// cap there in the job's ledger.
pub fn place(args: &RunArgs, limit: Option<&str>, ledger: &Path) -> Result<Placed, PlaceError> {
    let spec = limit.map(parse_limit).transpose().map_err(PlaceError::Limit)?;
    let compute = args.compute.as_ref().map(|c| fgpu_core::compute::parse_share(&c.text)).transpose().map_err(PlaceError::Compute)?;
    let (mut said, mut last_said) = (String::new(), std::time::Instant::now());
    loop {
        let probe = crate::driver::probe::probe_driver()?;
        if probe.devices.is_empty() {
            return Err(PlaceError::NoGpu(probe.nvml.error.clone().unwrap_or_else(|| "NVML lists none".into())));
        }
        let _lock = placement_lock()?;
        let seen =
            crate::observe::report::collect(crate::observe::ledgers::resolve(&crate::observe::args::LedgerSelection { all: true, ..Default::default() }));
        let mut rooms = crate::observe::rooms::rooms(&probe.devices, &seen.ledgers);
        // A GPU in MIG mode is not a place for a whole-GPU job (its memory is its
        // instances'): left out, and said when that leaves none.
        let mig = crate::mig::mig_enabled_gpus();
        rooms.retain(|r| !mig.iter().any(|u| u.eq_ignore_ascii_case(&r.uuid)));
        if rooms.is_empty() {
            return Err(PlaceError::AllMig(mig.join(", ")));
        }
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
                let held = Ledger::open(ledger, sharing)?;
                let slot = held.join()?;
                let uuid = fgpu_core::uuid::DeviceUuid::parse(&room.uuid).ok_or_else(|| PlaceError::BadUuid(room.uuid.clone()))?;
                let cap = need(room);
                let cap = if cap == 0 { room.total_bytes } else { cap };
                let device = held.register_device(uuid, room.total_bytes, cap, Some(slot))?.device;
                if let Some(share) = compute.as_ref().and_then(|c| c.share_for(&room.uuid)) {
                    held.register_compute(device, share, Some(slot))?;
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
            Err(why) => return Err(why.into()),
        }
    }
}
