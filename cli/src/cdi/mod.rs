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
use std::path::Path;

/// The glibc the release build needs (scripts/build-release.sh).
const RELEASE_GLIBC: &str = "2.17";

/// `fgpu cdi ...`
pub fn cdi(args: &CdiArgs) -> i32 {
    match &args.command {
        CdiCommand::Generate(args) => match generate(args) {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("fgpu cdi generate: {message}");
                1
            }
        },
    }
}

fn generate(args: &CdiGenerateArgs) -> Result<(), String> {
    let sizes: Vec<u64> = args.sizes.iter().copied().filter(|&b| b > 0).collect();
    let percents: Vec<u32> = args.percents.iter().copied().filter(|&p| p > 0).collect();
    let gpus = probe_gpus()?;
    let devices = plan(&gpus, &sizes, &percents, &args.combine)?;
    let front = shimpath::locate().map_err(|e| e.to_string())?.path;
    // The front, the shim it loads and this command (so that `/usr/lib/fgpu/fgpu status`
    // works inside the container), all read before anything is written.
    let exe = std::env::current_exe().ok().filter(|exe| std::fs::metadata(exe).is_ok());
    let payload = Payload::read(&front, exe.as_deref())?;
    let newer = elf::parse(payload.front_bytes()).map_err(|e| format!("{} is not a library fgpu can use: {e}", front.display()))?;
    let newer = glibc_newer_than_release(&newer);
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
    if let Some(need) = newer {
        eprintln!(
            "fgpu cdi generate: warning: {} needs glibc {need}: in images with an older glibc the loader cannot preload it, and their programs run uncapped; use the release build (scripts/build-release.sh, glibc {RELEASE_GLIBC})",
            front.display()
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

/// The newest glibc the library needs, when newer than the release build's baseline.
fn glibc_newer_than_release(info: &elf::ElfInfo) -> Option<String> {
    let need = elf::newest_glibc_needed(info)?;
    (elf::glibc_version(&need)? > elf::glibc_version(RELEASE_GLIBC)?).then_some(need)
}

/// The GPUs NVML lists, read by `fgpu __driver-probe` in a child process without the shim.
fn probe_gpus() -> Result<Vec<Gpu>, String> {
    let probe = crate::driver::probe::probe_driver().map_err(|e| format!("cannot read the GPUs: {e}"))?;
    fgpu_cdi::probe::gpus(&probe)
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
        assert_eq!(glibc_newer_than_release(&info(&["GLIBC_2.2.5", "GLIBC_2.17"])), None);
        assert_eq!(glibc_newer_than_release(&info(&["GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.17"])), Some("2.34".into()));
        // The release build itself (scripts/build-release.sh) passes when it was built here.
        let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dist/libfgpu.so");
        if let Ok(info) = elf::read(&dist) {
            assert_eq!(glibc_newer_than_release(&info), None, "{}", dist.display());
        }
    }
}
