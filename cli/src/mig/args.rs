//! `fgpu mig`'s arguments.

use clap::{Args, Subcommand};

const MIG_HELP: &str = "\
Examples:
  fgpu mig list                          GPUs, modes, free placements, instances, users
  sudo fgpu mig create 3g.40gb           an instance kept until destroyed
  sudo fgpu mig destroy MIG-1a2b...      destroy an instance fgpu created
  sudo fgpu mig gc                       destroy instances whose fgpu run job is gone
  sudo fgpu run --mig 1g.10gb --limit 4G -- python job.py
                                         an instance for one job, destroyed after it

fgpu never changes a GPU's MIG mode (`nvidia-smi -i N -mig 1` does). Creating and
destroying need root or the MIG config capability. fgpu destroys only the instances it
created, as its record names them (docs/mig.md).

Exit status: 0 success, 1 failure, 2 usage error.";

/// Multi-Instance GPU: list, create and destroy instances.
#[derive(Debug, Args)]
#[command(after_help = MIG_HELP)]
pub struct MigArgs {
    #[command(subcommand)]
    pub command: MigCommand,
}

#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// GPUs, their MIG mode, free placements per profile, the instances, which fgpu created
    /// and whose processes use them.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Create a GPU instance of PROFILE (3g.40gb, or a profile ID) and its full-size
    /// compute instance, at the placement fgpu's rule chooses (docs/mig.md); kept until
    /// `fgpu mig destroy`. Prints its MIG UUID.
    Create {
        #[arg(value_name = "PROFILE")]
        profile: String,
        /// Only on this GPU (its index).
        #[arg(long, value_name = "N")]
        gpu: Option<u32>,
    },
    /// Destroy instances fgpu created, by MIG UUID (as `fgpu mig list` prints it).
    Destroy {
        #[arg(required = true, value_name = "MIG-UUID")]
        uuids: Vec<String>,
    },
    /// Destroy the instances fgpu created for jobs that are gone (crashed or killed) and
    /// that no process uses.
    Gc,
}

#[cfg(test)]
mod tests {
    use crate::args::{parse, Command};

    #[test]
    fn mig_grammar() {
        let cli = parse(&["mig", "create", "3g.40gb", "--gpu", "1"]).unwrap();
        let Command::Mig(mig) = cli.command else { panic!() };
        assert!(matches!(mig.command, super::MigCommand::Create { ref profile, gpu: Some(1) } if profile == "3g.40gb"));
        assert!(parse(&["mig", "destroy"]).is_err(), "destroy needs a UUID");
        assert!(parse(&["mig", "list", "--json"]).is_ok());
        assert!(parse(&["mig", "gc"]).is_ok());
    }
}
