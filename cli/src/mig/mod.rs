//! `fgpu mig` (list, create, destroy, gc) and the instances `fgpu run --mig` makes for a
//! job: what the driver says of each GPU (`gpus.rs`), where a new instance goes
//! (`placement.rs`, the rule), creating and destroying (`carve.rs`), and the record of what
//! fgpu created (`record.rs`). docs/mig.md is the user's side.

pub mod args;
pub mod carve;
pub mod error;
pub mod gpus;
pub mod placement;
pub mod record;

use args::{MigArgs, MigCommand};
use error::MigError;
use record::Record;
use serde::Serialize;

/// Runs `fgpu mig ...` and returns the exit status.
pub fn mig(args: &MigArgs) -> i32 {
    let outcome = match &args.command {
        MigCommand::List { json } => list(*json),
        MigCommand::Create { profile, gpu, placement, json } => carve::create(profile, gpu.as_deref(), *placement, None).map(|c| {
            let e = &c.entry;
            if *json {
                println!("{}", serde_json::to_string(&c).expect("an entry serialises"));
            } else {
                println!("{}", e.mig_uuid);
            }
            eprintln!(
                "fgpu mig: created {} on GPU {} at {}:{} (GPU instance {}, compute instance {})",
                e.profile, e.gpu_index, e.placement.0, e.placement.1, e.gpu_instance, e.compute_instance
            );
        }),
        MigCommand::Destroy { uuids, json } => return destroy(uuids, *json),
        MigCommand::Gc => carve::gc().map(|lines| {
            for line in &lines {
                println!("{line}");
            }
            if lines.is_empty() {
                println!("nothing to collect");
            }
        }),
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fgpu mig: {e}");
            e.exit_code()
        }
    }
}

/// `fgpu mig destroy --json`'s line for one instance.
#[derive(Serialize)]
struct DestroyOutcome<'a> {
    mig_uuid: &'a str,
    /// `destroyed`, `gone`, `not_recorded`, or a [`MigError::kind`].
    outcome: &'static str,
    message: String,
}

/// Destroys each instance; the exit status: 0 when each is destroyed or already gone, 3
/// when some are in use and nothing else failed, else 1.
fn destroy(uuids: &[String], json: bool) -> i32 {
    let opened = carve::may_configure().and_then(|()| Ok((Record::open()?, carve::Session::open()?)));
    let (record, session) = match opened {
        Ok(o) => o,
        Err(e) => return destroy_failed(uuids, json, &e),
    };
    let mig = match session.mig() {
        Ok(m) => m,
        Err(e) => return destroy_failed(uuids, json, &e),
    };
    let entries = record.entries();
    let (mut in_use, mut failed) = (false, false);
    for uuid in uuids {
        let result = match entries.iter().find(|e| e.mig_uuid.eq_ignore_ascii_case(uuid)) {
            None => Err((
                "not_recorded",
                format!(
                    "{uuid} is not an instance fgpu created (its record {} does not name it); `nvidia-smi mig -dci` and `-dgi` destroy others",
                    record.dir.display()
                ),
            )),
            Some(entry) => match carve::destroy_instance(&session, &mig, entry) {
                Ok(outcome) => {
                    record.remove(entry);
                    let (kind, what) = if outcome == carve::Destroyed::Now { ("destroyed", "destroyed") } else { ("gone", "already gone:") };
                    Ok((kind, format!("{what} {} ({} on GPU {})", entry.mig_uuid, entry.profile, entry.gpu_index)))
                }
                Err(e) => Err((e.kind(), e.to_string())),
            },
        };
        match &result {
            Ok(_) => {}
            Err(("in_use", _)) => in_use = true,
            Err(_) => failed = true,
        }
        let (outcome, message) = result.unwrap_or_else(|e| e);
        if json {
            println!("{}", serde_json::to_string(&DestroyOutcome { mig_uuid: uuid, outcome, message }).expect("serialises"));
        } else if matches!(outcome, "destroyed" | "gone") {
            println!("{message}");
        } else {
            eprintln!("fgpu mig: {message}");
        }
    }
    if failed {
        1
    } else if in_use {
        error::EXIT_IN_USE
    } else {
        0
    }
}

/// Every instance failed for the same reason `e` (no right, no driver).
fn destroy_failed(uuids: &[String], json: bool, e: &MigError) -> i32 {
    if json {
        for uuid in uuids {
            println!("{}", serde_json::to_string(&DestroyOutcome { mig_uuid: uuid, outcome: e.kind(), message: e.to_string() }).expect("serialises"));
        }
    }
    eprintln!("fgpu mig: {e}");
    e.exit_code()
}

/// `fgpu mig list --json`'s document.
#[derive(Serialize)]
struct Listing {
    gpus: Vec<GpuListing>,
}

#[derive(Serialize)]
struct GpuListing {
    #[serde(flatten)]
    gpu: gpus::Gpu,
    /// Per profile: the free placements and how many more fit.
    free: Vec<FreeListing>,
    /// Which instances fgpu created: GPU instance ID to the record's entry.
    fgpu_created: Vec<record::Entry>,
    users: Vec<UserListing>,
}

#[derive(Serialize)]
struct FreeListing {
    profile: String,
    id: u32,
    free_placements: Vec<(u32, u32)>,
    fits: u32,
}

#[derive(Serialize)]
struct UserListing {
    pid: u32,
    uid: Option<u32>,
    gpu_instance: u32,
}

fn uid_of(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

fn list(json: bool) -> Result<(), MigError> {
    let session = carve::Session::open()?;
    let mig = session.mig()?;
    let all = gpus::scan(&session.nvml, &mig)?;
    let entries = Record::open().map(|r| r.entries()).unwrap_or_default();
    let listing = Listing {
        gpus: all
            .into_iter()
            .map(|gpu| {
                let layout = gpu.layout();
                let free = gpu
                    .profiles
                    .iter()
                    .map(|p| FreeListing { profile: p.name.clone(), id: p.id, free_placements: layout.free(p.id), fits: layout.fits(p.id) })
                    .collect();
                let fgpu_created = entries
                    .iter()
                    .filter(|e| {
                        e.gpu_uuid == gpu.uuid
                            && gpu.instances.iter().any(|i| i.gpu_instance == e.gpu_instance && i.compute_instances.iter().any(|(_, u)| *u == e.mig_uuid))
                    })
                    .cloned()
                    .collect();
                let users =
                    gpu.instances.iter().flat_map(|i| i.pids.iter().map(|&pid| UserListing { pid, uid: uid_of(pid), gpu_instance: i.gpu_instance })).collect();
                GpuListing { gpu, free, fgpu_created, users }
            })
            .collect(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&listing).expect("the listing serialises"));
        return Ok(());
    }
    for g in &listing.gpus {
        let gpu = &g.gpu;
        let mode = match gpu.mig {
            None => "no MIG".to_string(),
            Some(m) if m.current => "MIG on".to_string(),
            Some(m) if m.pending => "MIG off (enabling pending a GPU reset)".to_string(),
            Some(_) => format!("MIG off (fgpu never changes it; `nvidia-smi -i {} -mig 1` enables it)", gpu.index),
        };
        println!("GPU {} {} ({}): {mode}", gpu.index, gpu.name, gpu.uuid);
        if !gpu.mig_on() {
            continue;
        }
        println!("  {:<12} {:>3} {:>9} {:>4}  free placements (slice:size)", "profile", "ID", "memory", "fits");
        for (p, f) in gpu.profiles.iter().zip(&g.free) {
            let places: Vec<String> = f.free_placements.iter().map(|(s, n)| format!("{s}:{n}")).collect();
            println!(
                "  {:<12} {:>3} {:>6}MiB {:>4}  {}",
                p.name,
                p.id,
                p.memory_mib,
                f.fits,
                if places.is_empty() { "-".to_string() } else { places.join(" ") }
            );
        }
        if gpu.instances.is_empty() {
            println!("  no instances");
        }
        for i in &gpu.instances {
            let created = g.fgpu_created.iter().find(|e| e.gpu_instance == i.gpu_instance);
            let by = match created {
                Some(e) => match e.owner {
                    Some(o) if !e.orphaned() => format!("fgpu, for the job of fgpu run PID {}", o.pid),
                    Some(o) => format!("fgpu, its job (fgpu run PID {}) gone: `fgpu mig gc` destroys it", o.pid),
                    None => "fgpu, kept".to_string(),
                },
                None => "not fgpu".to_string(),
            };
            let uuids: Vec<&str> = i.compute_instances.iter().map(|(_, u)| u.as_str()).collect();
            let users: Vec<String> = i.pids.iter().map(|&pid| format!("{pid} (uid {})", uid_of(pid).map_or("?".into(), |u| u.to_string()))).collect();
            println!(
                "  instance {:>2} {:<10} at {}:{}  {}  created by {by}; processes: {}",
                i.gpu_instance,
                i.profile,
                i.placement.0,
                i.placement.1,
                if uuids.is_empty() { "no compute instance".to_string() } else { uuids.join(" ") },
                if users.is_empty() { "none".to_string() } else { users.join(", ") }
            );
        }
    }
    Ok(())
}

/// One MIG instance as `fgpu status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StatusInstance {
    pub gpu: u32,
    pub gpu_uuid: String,
    pub gpu_instance: u32,
    pub profile: String,
    pub placement: (u32, u32),
    pub mig_uuids: Vec<String>,
    /// fgpu made it (its record names it).
    pub fgpu_created: bool,
    pub pids: Vec<u32>,
}

/// The MIG instances of every GPU in MIG mode, for `fgpu status`; `None` when the driver
/// cannot be asked or no GPU is in MIG mode.
pub fn status_instances() -> Option<Vec<StatusInstance>> {
    let session = carve::Session::open().ok()?;
    let mig = session.mig().ok()?;
    let all = gpus::scan(&session.nvml, &mig).ok()?;
    if !all.iter().any(gpus::Gpu::mig_on) {
        return None;
    }
    let mut records = Record::open().map(|r| r.entries()).unwrap_or_default();
    if fgpu_core::sys::geteuid() != 0 {
        // Root's record, read to be shown only.
        let root = Record { dir: std::path::PathBuf::from(record::ROOT_RECORD), uid: 0 };
        records.extend(root.entries());
    }
    let out = all
        .iter()
        .flat_map(|g| {
            g.instances.iter().map(|i| {
                let mig_uuids: Vec<String> = i.compute_instances.iter().map(|(_, u)| u.clone()).collect();
                StatusInstance {
                    gpu: g.index,
                    gpu_uuid: g.uuid.clone(),
                    gpu_instance: i.gpu_instance,
                    profile: i.profile.clone(),
                    placement: i.placement,
                    fgpu_created: records.iter().any(|e| e.gpu_uuid == g.uuid && mig_uuids.contains(&e.mig_uuid)),
                    mig_uuids,
                    pids: i.pids.clone(),
                }
            })
        })
        .collect();
    Some(out)
}

/// GPUs in MIG mode (their UUIDs), which `fgpu run --gpus auto` leaves out: their memory
/// belongs to their instances, and a whole-GPU job cannot run there.
pub fn mig_enabled_gpus() -> Vec<String> {
    let Ok(session) = carve::Session::open() else { return Vec::new() };
    let Ok(mig) = session.mig() else { return Vec::new() };
    gpus::scan(&session.nvml, &mig).map(|all| all.into_iter().filter(gpus::Gpu::mig_on).map(|g| g.uuid).collect()).unwrap_or_default()
}

/// `fgpu status`'s MIG section.
pub fn render_status(instances: &[StatusInstance]) -> String {
    let mut out = String::from("\nMIG instances (fgpu mig list shows free placements):\n");
    if instances.is_empty() {
        out.push_str("  none\n");
    }
    for i in instances {
        let pids: Vec<String> = i.pids.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "  GPU {} instance {:>2} {:<10} at {}:{}  {}  {}  processes: {}\n",
            i.gpu,
            i.gpu_instance,
            i.profile,
            i.placement.0,
            i.placement.1,
            if i.mig_uuids.is_empty() { "no compute instance".to_string() } else { i.mig_uuids.join(" ") },
            if i.fgpu_created { "made by fgpu" } else { "not made by fgpu" },
            if pids.is_empty() { "none".to_string() } else { pids.join(", ") }
        ));
    }
    out
}
