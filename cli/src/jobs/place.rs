//! `fgpu run --gpus auto`: the GPU with the most room for the job's cap, chosen and
//! claimed under a placement lock (`placement.rs` chooses, `crate::observe::rooms` says what
//! each GPU has committed).

use super::args::RunArgs;
use fgpu_core::ledger::Ledger;
use fgpu_core::limit::parse_limit;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
pub fn place(args: &RunArgs, limit: Option<&str>, ledger: &Path) -> Result<Placed, String> {
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
        let mut rooms = crate::observe::rooms::rooms(&probe.devices, &seen.ledgers);
        // A GPU in MIG mode is not a place for a whole-GPU job (its memory is its
        // instances'): left out, and said when that leaves none.
        let mig = crate::mig::mig_enabled_gpus();
        rooms.retain(|r| !mig.iter().any(|u| u.eq_ignore_ascii_case(&r.uuid)));
        if rooms.is_empty() {
            return Err(format!("--gpus auto: every GPU is in MIG mode ({}); a whole-GPU job cannot run there: use --mig PROFILE", mig.join(", ")));
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
