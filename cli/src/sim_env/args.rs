//! `fgpu sim-env`'s arguments.

use clap::Args;
use std::path::PathBuf;

const SIM_ENV_HELP: &str = "\
Examples:
  eval \"$(target/release/fgpu sim-env /tmp/fgpu-sim)\"     one simulated 80 GiB GPU
  eval \"$(target/release/fgpu sim-env /tmp/sim2 --devices 2 --memory 16G)\"
  eval \"$(target/release/fgpu sim-env /tmp/mig --product h100-80gb --mig all)\"
  target/release/fgpu sim-env /tmp/fgpu-sim --dry-run     show what it would do

Lays out DIR/lib with libcuda.so.1, libcuda.so and libnvidia-ml.so.1 linking to the built
simulated libraries (libfgpu_sim_cuda.so, libfgpu_sim_nvml.so), and prints the variables
that select them as shell `export` lines: LD_LIBRARY_PATH (DIR/lib first), FGPU_SIM_STATE
(DIR/sim-state), and the FGPU_SIM_* settings given. The settings are read when the state
file is created; a state file that exists keeps its own. See docs/simulator.md.

Exit status: 0 done, 1 the libraries are missing or DIR cannot be made, 2 usage error.";

/// Set up fgpu's simulated NVIDIA driver in DIR and print the environment that selects it.
#[derive(Debug, Args)]
#[command(after_help = SIM_ENV_HELP)]
pub struct SimEnvArgs {
    /// Where to lay it out (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Where the built libfgpu_sim_cuda.so and libfgpu_sim_nvml.so are (default: beside fgpu).
    #[arg(long, value_name = "DIR")]
    pub libs: Option<PathBuf>,

    /// Number of simulated GPUs (FGPU_SIM_DEVICES, 0 to 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=8))]
    pub devices: Option<u32>,

    /// Memory of each GPU (FGPU_SIM_MEMORY: 80G, 81920M, bytes; binary units).
    #[arg(long, value_name = "SIZE", value_parser = parse_sim_size)]
    pub memory: Option<String>,

    /// Device memory each CUDA context takes (FGPU_SIM_CONTEXT_OVERHEAD).
    #[arg(long, value_name = "SIZE", value_parser = parse_sim_size)]
    pub context_overhead: Option<String>,

    /// What cuDriverGetVersion answers (FGPU_SIM_DRIVER_VERSION, e.g. 12080).
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<u32>,

    /// The GPU simulated, with its memory and MIG profiles (FGPU_SIM_PRODUCT).
    #[arg(long, value_name = "PRODUCT", conflicts_with = "memory", value_parser = ["generic", "a100-80gb", "h100-80gb", "h200-141gb"])]
    pub product: Option<String>,

    /// GPUs in MIG mode at first (FGPU_SIM_MIG: all, none, or indices like 0,2); needs --product.
    #[arg(long, value_name = "GPUS", requires = "product", value_parser = parse_mig)]
    pub mig: Option<String>,

    /// Print the commands that make the layout, and the exports, without making anything.
    #[arg(long)]
    pub dry_run: bool,
}

fn parse_sim_size(text: &str) -> Result<String, fgpu_core::limit::LimitError> {
    fgpu_core::limit::parse_size(text)?;
    Ok(text.trim().to_string())
}

/// A `--mig` value that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not all, none or a list of GPU indices (0 to 7) such as 0,2")]
pub struct MigListError(pub String);

/// Checks `--mig`: `all`, `none`, or comma-separated GPU indices below 8 (the simulator
/// checks them against the number of GPUs when it creates the state file).
pub fn parse_mig(text: &str) -> Result<String, MigListError> {
    let text = text.trim();
    if text == "all" || text == "none" || text.split(',').all(|i| i.trim().parse::<u32>().is_ok_and(|i| i < 8)) {
        Ok(text.to_string())
    } else {
        Err(MigListError(text.to_string()))
    }
}
