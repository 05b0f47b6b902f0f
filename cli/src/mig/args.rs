//! `fgpu mig`'s arguments.

use clap::{Args, Subcommand};

const MIG_HELP: &str = "\
Examples:
  fgpu mig list                          GPUs, modes, free placements, instances, users
  sudo fgpu mig create 3g.40gb           an instance kept until destroyed
  sudo fgpu mig create 3g.40gb --gpu GPU-7f2f... --placement 4 --json
                                         at memory slice 4 of that GPU, or fail
  sudo fgpu mig destroy MIG-1a2b...      destroy an instance fgpu created
  sudo fgpu mig gc                       destroy instances whose fgpu run job is gone
  sudo fgpu run --mig 1g.10gb --limit 4G -- python job.py
                                         an instance for one job, destroyed after it

fgpu never changes a GPU's MIG mode (`nvidia-smi -i N -mig 1` does). Creating and
destroying need root or the MIG config capability. fgpu destroys only the instances it
created, as its record names them (docs/mig.md).

Exit status: 0 success, 1 failure, 2 usage error, 3 an instance to destroy is in use
(and nothing else failed), 4 the placement asked is taken.";

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
    /// compute instance, at the placement fgpu's rule chooses (docs/mig.md) or the one
    /// asked; kept until `fgpu mig destroy`. Prints its MIG UUID.
    Create {
        #[arg(value_name = "PROFILE")]
        profile: String,
        /// Only on this GPU: its index or its UUID (an index can change at a reboot).
        #[arg(long, value_name = "N|UUID")]
        gpu: Option<String>,
        /// At the placement starting at this memory slice (as `fgpu mig list` shows them),
        /// or fail (exit status 4 when another instance holds it); needs --gpu.
        #[arg(long, value_name = "START", requires = "gpu")]
        placement: Option<u32>,
        /// Print the record's entry as JSON (MIG UUID, GPU and compute instance, placement,
        /// GPU UUID and minor number) instead of the MIG UUID.
        #[arg(long)]
        json: bool,
    },
    /// Destroy instances fgpu created, by MIG UUID (as `fgpu mig list` prints it).
    Destroy {
        #[arg(required = true, value_name = "MIG-UUID")]
        uuids: Vec<String>,
        /// Print one JSON object per instance: its outcome (`destroyed`, `gone`, `in_use`,
        /// `not_recorded`, or another error's kind) and the message.
        #[arg(long)]
        json: bool,
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
        assert!(
            matches!(mig.command, super::MigCommand::Create { ref profile, gpu: Some(ref g), placement: None, json: false } if profile == "3g.40gb" && g == "1")
        );
        let cli = parse(&["mig", "create", "3g.40gb", "--gpu", "GPU-a", "--placement", "4", "--json"]).unwrap();
        let Command::Mig(mig) = cli.command else { panic!() };
        assert!(matches!(mig.command, super::MigCommand::Create { placement: Some(4), json: true, .. }));
        assert!(parse(&["mig", "create", "3g.40gb", "--placement", "4"]).is_err(), "a placement needs its GPU");
        assert!(parse(&["mig", "destroy", "--json", "MIG-1"]).is_ok());
        assert!(parse(&["mig", "destroy"]).is_err(), "destroy needs a UUID");
        assert!(parse(&["mig", "list", "--json"]).is_ok());
        assert!(parse(&["mig", "gc"]).is_ok());
    }
}
