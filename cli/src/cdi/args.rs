//! `fgpu cdi generate`'s arguments.

use clap::{Args, Subcommand};
use std::path::PathBuf;

const CDI_GENERATE_HELP: &str = "\
Examples:
  sudo fgpu cdi generate
  podman run --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g IMAGE nvidia-smi
  sudo fgpu cdi generate --sizes 10g,20g --percents 50 --combine 0-20g,1-10g
  fgpu cdi generate --output - --config-dir /tmp/fgpu-cdi    (print the spec)

Devices, one per GPU index (as nvidia-smi numbers them) and size: 0-8g, 0-25pct;
all-8g caps every GPU the container is given; --combine 0-8g,1-4g adds 0-8g_1-4g. A
device for one GPU gives the container no memory on any other GPU (use all-SIZE with
nvidia.com/gpu=all). Each device bind-mounts, read-only, a copy of the shipped
libfgpu.so (found as `fgpu run` finds it; FGPU_SHIM=PATH overrides) at /usr/lib/fgpu, an
/etc/ld.so.preload naming it and an /etc/fgpu/fgpu.conf with the cap, and gives the
container a private ledger on a tmpfs at /run/fgpu. The mounted files are written to
--config-dir. Run it again after adding, removing or replacing GPUs, or upgrading fgpu.
See docs/cdi.md.

Exit status: 0 written, 1 failure (no GPU found, a file cannot be written), 2 usage error.";

/// Container Device Interface: cap containers at run time.
#[derive(Debug, Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    pub command: CdiCommand,
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    Generate(CdiGenerateArgs),
}

/// Write a CDI spec with devices fgpu.io/gpu=<index>-<size> for this machine's GPUs.
#[derive(Debug, Args)]
#[command(after_help = CDI_GENERATE_HELP)]
pub struct CdiGenerateArgs {
    /// Where to write the spec (.json for JSON, anything else YAML; - for standard output).
    #[arg(long, short = 'o', default_value = "/etc/cdi/fgpu.yaml", value_name = "FILE")]
    pub output: PathBuf,

    /// Sizes to offer on each GPU, comma-separated (binary units; whole MiB). Sizes larger
    /// than a GPU are left out for that GPU. An empty value offers none.
    #[arg(long, value_name = "SIZES", value_delimiter = ',', default_value = "2g,4g,8g,12g,16g,24g,32g,40g",
          value_parser = parse_cdi_size)]
    pub sizes: Vec<u64>,

    /// Percentages of a GPU's memory to offer, comma-separated whole numbers (0-25pct).
    /// An empty value offers none.
    #[arg(long, value_name = "PERCENTS", value_delimiter = ',', default_value = "10,25,50,75",
          value_parser = parse_cdi_percent)]
    pub percents: Vec<u32>,

    /// A device giving several GPUs different caps in one container, such as 0-8g,1-4g
    /// (named 0-8g_1-4g); repeatable.
    #[arg(long, value_name = "DEVICES")]
    pub combine: Vec<String>,

    /// Directory for the files the spec bind-mounts: a copy of the library, the
    /// /etc/ld.so.preload, a directory with the fgpu.conf of each device. It must not be
    /// writable by group or others.
    #[arg(long, default_value = "/var/lib/fgpu/cdi", value_name = "DIR")]
    pub config_dir: PathBuf,

    /// Owner (USER, USER:GROUP, UID or UID:GID) of the files the spec mounts. Rootless
    /// podman shows host root's files as nobody, and fgpu distrusts them; owned by the
    /// user who runs rootless podman, they show up as root in that user's containers.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub owner: Option<String>,
}

/// Why a `--sizes` or `--percents` item is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    #[error(transparent)]
    Size(#[from] fgpu_core::limit::LimitError),
    #[error("{0:?} is not a positive whole number of MiB (such as 8g or 1536m)")]
    NotWholeMib(String),
    #[error("{0:?} is not a whole percentage such as 25")]
    NotPercentage(String),
    #[error("{0:?} is not between 1 and 100")]
    PercentOutOfRange(String),
}

/// An empty item (as in `--sizes=`) parses as 0, which means "none" and is dropped.
fn parse_cdi_size(text: &str) -> Result<u64, OfferError> {
    if text.trim().is_empty() {
        return Ok(0);
    }
    let bytes = fgpu_core::limit::parse_size(text)?;
    if bytes == 0 || bytes % (1 << 20) != 0 {
        return Err(OfferError::NotWholeMib(text.to_string()));
    }
    Ok(bytes)
}

/// An empty item (as in `--percents=`) parses as 0, which means "none" and is dropped.
fn parse_cdi_percent(text: &str) -> Result<u32, OfferError> {
    if text.trim().is_empty() {
        return Ok(0);
    }
    let value: u32 = text.trim().trim_end_matches('%').parse().map_err(|_| OfferError::NotPercentage(text.to_string()))?;
    if !(1..=100).contains(&value) {
        return Err(OfferError::PercentOutOfRange(text.to_string()));
    }
    Ok(value)
}
