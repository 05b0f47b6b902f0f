//! `fgpu cdi generate`: makes fgpu a Container Device Interface (CDI) vendor, so that a
//! container is capped when it starts (`--device fgpu.io/gpu=0-8g`), with nothing of fgpu
//! in its image. The spec, the devices and the files they mount are planned and written by
//! the fgpu-cdi crate (shared with fgpu-kubelet-plugin); this module adds the GPUs (read
//! from NVML by the driver probe `fgpu doctor` uses), the library this `fgpu` finds, and
//! the command line.
//!
//! Everything that can fail without writing (the GPUs, the plan, the library and the shim
//! beside it, the owner) is checked before the first directory is created, so a refusal
//! leaves nothing half-written behind.

pub mod args;

use crate::elf;
use crate::shimpath;
use args::{CdiArgs, CdiCommand, CdiGenerateArgs};
use fgpu_cdi::files::{absolute, create_dir, prepare_dir, resolve_owner, write_file, Payload};
use fgpu_cdi::{config_text, device_dir, no_longer_generated, plan, spec, to_yaml, Gpu, CONFIG_FILE, DEVICES_SUBDIR, HEADER, KIND};
use std::path::{Path, PathBuf};

/// The glibc the release build needs (scripts/build-release.sh).
const RELEASE_GLIBC: &str = "2.17";

/// `fgpu cdi ...`
pub fn cdi(args: &CdiArgs) -> i32 {
    match &args.command {
        CdiCommand::Generate(args) => match generate(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("fgpu cdi generate: {e}");
                1
            }
        },
    }
}

/// Why `fgpu cdi generate` wrote nothing (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("cannot read the GPUs: {0}")]
    Gpus(#[from] crate::driver::probe::ProbeError),
    #[error("{0}")]
    Front(#[from] shimpath::ShimError),
    #[error("{} is not a library fgpu can use: {source}", path.display())]
    NotALibrary { path: PathBuf, source: elf::ElfError },
    #[error("{0}")]
    Plan(#[from] fgpu_cdi::PlanError),
    #[error("{0}")]
    Files(#[from] fgpu_cdi::files::FileError),
    #[error("{0}")]
    NoGpu(#[from] fgpu_cdi::probe::GpusError),
}

fn generate(args: &CdiGenerateArgs) -> Result<(), CdiError> {
    let sizes: Vec<u64> = args.sizes.iter().copied().filter(|&b| b > 0).collect();
    let percents: Vec<u32> = args.percents.iter().copied().filter(|&p| p > 0).collect();
    let gpus = probe_gpus()?;
    let devices = plan(&gpus, &sizes, &percents, &args.combine)?;
    let front = shimpath::locate()?.path;
    // The front, the shim it loads and this command (so that `/usr/lib/fgpu/fgpu status`
    // works inside the container), all read before anything is written.
    let exe = std::env::current_exe().ok().filter(|exe| std::fs::metadata(exe).is_ok());
    let payload = Payload::read(&front, exe.as_deref())?;
    let front_info = elf::parse(payload.front_bytes()).map_err(|source| CdiError::NotALibrary { path: front.clone(), source })?;
    // The shim the front loads is part of the payload too: the larger need counts.
    let shim = shimpath::companion(&front);
    let shim_info = elf::read(&shim).map_err(|source| CdiError::NotALibrary { path: shim.clone(), source })?;
    let newer = glibc_newer_than_release(&[(&front, Some(&front_info)), (&shim, Some(&shim_info))]);
    let owner = args.owner.as_deref().map(resolve_owner).transpose()?;
    let to_stdout = args.output.as_os_str() == "-";
    let output = if to_stdout { None } else { Some(absolute(&args.output)?) };
    let config_dir = absolute(&args.config_dir)?;

    prepare_dir(&config_dir, None)?;
    payload.install(&config_dir, owner)?;
    prepare_dir(&config_dir.join(DEVICES_SUBDIR), None)?;
    for device in &devices {
        let dir = device_dir(&config_dir, device);
        prepare_dir(&dir, owner)?;
        write_file(&dir.join(CONFIG_FILE), config_text(device, &gpus).as_bytes(), 0o644, owner)?;
    }
    let kept = no_longer_generated(&config_dir.join(DEVICES_SUBDIR), &devices);

    // The host-PID service's directory, if the service runs (or ran) here: containers
    // without --pid=host then have what the driver takes unannounced counted (docs/security.md).
    let service = Path::new(fgpu_core::hostpid::SERVICE_DIR);
    let spec = spec(&devices, &config_dir, service.is_dir().then_some(service));
    let json = args.output.extension().is_some_and(|e| e == "json");
    let text = if json {
        serde_json::to_string_pretty(&spec).expect("the spec serialises") + "\n"
    } else {
        format!(
            "{HEADER} from the GPUs of this machine; run it again after changing GPUs\n# or upgrading fgpu. Devices: {KIND}=<GPU index>-<size>, all-<size>; see docs/cdi.md.\n{}",
            to_yaml(&spec)
        )
    };
    match &output {
        Some(output) => {
            if let Some(parent) = output.parent() {
                create_dir(parent)?;
            }
            write_file(output, text.as_bytes(), 0o644, None)?;
        }
        None => print!("{text}"),
    }

    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    eprintln!(
        "fgpu cdi generate: {} {} devices for {} GPU{} ({}); the containers get {} and the files in {}",
        if to_stdout { "printed".to_string() } else { format!("wrote {} with", args.output.display()) },
        devices.len(),
        gpus.len(),
        if gpus.len() == 1 { "" } else { "s" },
        names.join(" "),
        front.display(),
        config_dir.display(),
    );
    if !kept.is_empty() {
        eprintln!(
            "fgpu cdi generate: kept the files of {} device{} no longer generated ({}): containers started with them still read them; remove them when none runs",
            kept.len(),
            if kept.len() == 1 { "" } else { "s" },
            kept.join(" ")
        );
    }
    if let Some((need, library)) = newer {
        eprintln!(
            "fgpu cdi generate: warning: {} needs glibc {need}: in images with an older glibc the loader cannot preload it, and their programs run uncapped; use the release build (scripts/build-release.sh, glibc {RELEASE_GLIBC})",
            library.display()
        );
    }
    let euid = fgpu_core::sys::geteuid();
    if owner.is_none() && euid != 0 {
        eprintln!(
            "fgpu cdi generate: the files in {} are owned by uid {euid}, not root: only containers of rootless podman run by uid {euid} trust them (docs/cdi.md, Rootless podman)",
            config_dir.display()
        );
    }
    Ok(())
}

/// The newest glibc the libraries need, and the library that needs it, when newer than
/// the release build's baseline.
fn glibc_newer_than_release<'a>(libraries: &[(&'a Path, Option<&elf::ElfInfo>)]) -> Option<(String, &'a Path)> {
    let (need, library) = elf::newest_glibc_among(libraries)?;
    (elf::glibc_version(&need)? > elf::glibc_version(RELEASE_GLIBC)?).then_some((need, library))
}

/// The GPUs NVML lists, read by `fgpu __driver-probe` in a child process without the shim.
fn probe_gpus() -> Result<Vec<Gpu>, CdiError> {
    let probe = crate::driver::probe::probe_driver()?;
    Ok(fgpu_cdi::probe::gpus(&probe)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_needing_a_newer_glibc_than_the_release_build_is_named() {
        let info = |versions: &[&str]| elf::ElfInfo {
            class64: true,
            little_endian: true,
            machine: 62,
            needed_versions: versions.iter().map(|v| ("libc.so.6".to_string(), v.to_string())).collect(),
            defined: Vec::new(),
        };
        let (front, shim) = (Path::new("/l/libfgpu.so"), Path::new("/l/libfgpu_shim.so"));
        let old = info(&["GLIBC_2.2.5", "GLIBC_2.17"]);
        let new = info(&["GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.17"]);
        assert_eq!(glibc_newer_than_release(&[(front, Some(&old)), (shim, Some(&old))]), None);
        assert_eq!(glibc_newer_than_release(&[(front, Some(&new)), (shim, Some(&old))]), Some(("2.34".into(), front)));
        // The shim the front loads counts too: the larger need is named, with its library.
        assert_eq!(glibc_newer_than_release(&[(front, Some(&old)), (shim, Some(&new))]), Some(("2.34".into(), shim)));
        // The release build itself (scripts/build-release.sh) passes when it was built here.
        let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dist");
        if let (Ok(front), Ok(shim)) = (elf::read(&dist.join("libfgpu.so")), elf::read(&dist.join("libfgpu_shim.so"))) {
            assert_eq!(glibc_newer_than_release(&[(&dist, Some(&front)), (&dist, Some(&shim))]), None, "{}", dist.display());
        }
    }
}
