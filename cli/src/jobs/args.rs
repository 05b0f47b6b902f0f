//! `fgpu run`'s arguments.

use clap::{ArgGroup, Args};
use fgpu_core::limit::{parse_limit, LimitError};
use std::ffi::OsString;
use std::path::PathBuf;

const RUN_HELP: &str = "\
Examples:
  fgpu run --limit 8G -- python train.py
  fgpu run --limit 50% -- ./simulate --steps 1000
  fgpu run --limit 4G --device GPU-1a2b3c4d=16G -- torchrun --nproc-per-node 2 train.py
  fgpu run --limit 8G --ledger /shared/team-a.ledger -- ./job    (share one cap across runs)
  fgpu run --limit 8G --compute 30% -- python train.py   (8 GiB and 30 % of each GPU's time)
  fgpu run --limit 50G --gpus auto -- python train.py     (on the GPU with the most room)
  fgpu run --limit 50G --gpus auto --wait -- ./job          (wait for room instead of refusing)
  sudo fgpu run --mig 3g.40gb --limit 8G -- ./job             (in a MIG instance made for it)

The command and every process it starts share one cap: each `fgpu run` gets a fresh
ledger of its own (a private directory under $XDG_RUNTIME_DIR or $TMPDIR), removed when
the command ends, or kept with a message while processes it started still run (a later
fgpu run removes it once they are gone, as it removes those of runs killed with SIGKILL);
--ledger names one for several runs of this user (--shared-ledger: of all users) instead.
libfgpu.so is looked for next to fgpu, in ../lib/fgpu and ../lib relative to it, in
/usr/local/lib/fgpu and /usr/lib/fgpu; FGPU_SHIM=PATH overrides the search.

Exit status: the command's. If it is killed by a signal, fgpu kills itself with the same
signal (a shell then reports 128+N). 125: fgpu itself failed; 126: the command cannot be
executed; 127: the command was not found; 2: usage error.";

/// Run a command with its GPU memory capped, its share of GPU time, or both.
#[derive(Debug, Args)]
#[command(after_help = RUN_HELP)]
// At least one of --limit, --device and --compute; the usage line shows the choice.
#[command(group(ArgGroup::new("cap").required(true).multiple(true).args(["limit", "device", "compute", "mig"])))]
pub struct RunArgs {
    /// The cap for every GPU: a size (8G, 512M, 8GiB, 8589934592), a percentage of each
    /// GPU's memory (50%), or per device (GPU-1a2b=8G,*=4G). Sizes are binary: 8G = 8 GiB.
    #[arg(long, short = 'l', value_name = "LIMIT", value_parser = parse_limit_arg)]
    pub limit: Option<LimitArg>,

    /// A cap for one GPU, by UUID or UUID prefix (as nvidia-smi -L prints it); repeatable.
    /// Overrides --limit for that GPU.
    #[arg(long, short = 'd', value_name = "UUID=SIZE", value_parser = parse_device_arg)]
    pub device: Vec<DeviceArg>,

    /// The share of each GPU's time the command's kernels may occupy, together: a
    /// percentage (30%), or per device (GPU-1a2b=30%,*=50%). A ceiling: it holds whether
    /// or not others wait for the GPU. Sets FGPU_COMPUTE.
    #[arg(long, short = 'c', value_name = "SHARE", value_parser = parse_compute_arg)]
    pub compute: Option<LimitArg>,

    /// Use this ledger file instead of a fresh private one: every run of this user naming
    /// the same file shares one cap. The file is kept when the command ends. Private to
    /// this user (file and shared memory 0600) unless --shared-ledger is given.
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,

    /// Let other users' runs naming the same --ledger file share its cap (file and shared
    /// memory 0666; sets FGPU_LEDGER_SHARED=1). Without it a run's ledger is private.
    #[arg(long, requires = "ledger")]
    pub shared_ledger: bool,

    /// Which GPU the command gets: `auto` puts it on the GPU with the most room left (its
    /// memory less the caps of the live ledgers on it and what others use there beyond
    /// them; the lower index on a tie) that fits its cap, and sets CUDA_VISIBLE_DEVICES to
    /// that GPU's UUID. Refuses, naming each GPU and what it has left, when none fits.
    /// GPUs in MIG mode are left out (a whole-GPU job cannot run there; see --mig).
    #[arg(long, value_name = "auto", value_parser = ["auto"])]
    pub gpus: Option<String>,

    /// With --gpus auto: when no GPU has room, wait until one has (checking every second)
    /// instead of refusing.
    #[arg(long, requires = "gpus")]
    pub wait: bool,

    /// Run in a MIG instance of this profile (3g.40gb, or a profile ID) made for the job:
    /// fgpu chooses the GPU and placement (docs/mig.md), creates the GPU instance and its
    /// full-size compute instance, sets CUDA_VISIBLE_DEVICES to its MIG UUID, and destroys
    /// it when the command ends. Needs root or the MIG config capability.
    #[arg(long, value_name = "PROFILE", conflicts_with = "gpus")]
    pub mig: Option<String>,

    /// With --mig: keep the instance when the command ends (`fgpu mig destroy` removes it).
    #[arg(long, requires = "mig")]
    pub keep: bool,

    /// The command to run and its arguments: everything after `--`.
    ///
    /// Without `--`, the command starts at the first word that is not an option of fgpu run;
    /// before it, an option fgpu run does not know is a usage error.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// A validated `--limit` value, kept as typed so the shim parses the same text.
#[derive(Debug, Clone)]
pub struct LimitArg {
    pub text: String,
}

/// A validated `--device UUID=SIZE` value.
#[derive(Debug, Clone)]
pub struct DeviceArg {
    pub key: String,
    pub amount: String,
}

/// Why a `--device` value is refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceArgError {
    #[error("{0:?} is not UUID=SIZE (for example GPU-1a2b3c4d=8G)")]
    NotKeyValue(String),
    #[error("'*' is not a device; use --limit for every device")]
    Star,
    #[error(transparent)]
    Limit(#[from] LimitError),
}

fn parse_limit_arg(text: &str) -> Result<LimitArg, LimitError> {
    parse_limit(text)?;
    Ok(LimitArg { text: text.trim().to_string() })
}

fn parse_compute_arg(text: &str) -> Result<LimitArg, LimitError> {
    fgpu_core::compute::parse_share(text)?;
    Ok(LimitArg { text: text.trim().to_string() })
}

fn parse_device_arg(text: &str) -> Result<DeviceArg, DeviceArgError> {
    let (key, amount) = text.split_once('=').ok_or_else(|| DeviceArgError::NotKeyValue(text.to_string()))?;
    let (key, amount) = (key.trim(), amount.trim());
    if key == "*" {
        return Err(DeviceArgError::Star);
    }
    parse_limit(&format!("{key}={amount}"))?;
    Ok(DeviceArg { key: key.to_string(), amount: amount.to_string() })
}

#[cfg(test)]
mod tests {
    use crate::args::{parse, Cli, Command};
    use clap::CommandFactory;

    #[test]
    fn run_takes_the_command_verbatim() {
        let cli = parse(&["run", "--limit", "8G", "--", "python", "-c", "print(1)", "--limit", "x"]).unwrap();
        let Command::Run(run) = cli.command else { panic!() };
        assert_eq!(run.limit.unwrap().text, "8G");
        let words: Vec<_> = run.command.iter().map(|s| s.to_str().unwrap()).collect();
        assert_eq!(words, ["python", "-c", "print(1)", "--limit", "x"]);
    }

    #[test]
    fn bad_limit_names_the_argument_and_the_reason() {
        let err = parse(&["run", "--limit", "8XB", "--", "true"]).unwrap_err().to_string();
        assert!(err.contains("--limit"), "{err}");
        assert!(err.contains("8XB"), "{err}");
        assert!(err.contains("not a number followed by"), "{err}");
        let err = parse(&["run", "--device", "GPU-zz=8G", "--", "true"]).unwrap_err().to_string();
        assert!(err.contains("--device"), "{err}");
        assert!(err.contains("GPU-zz"), "{err}");
        let err = parse(&["run", "--device", "8G", "--", "true"]).unwrap_err().to_string();
        assert!(err.contains("UUID=SIZE"), "{err}");
    }

    #[test]
    fn an_unknown_option_before_the_command_is_a_usage_error_naming_it() {
        for (args, named) in [
            (&["run", "--limit", "8G", "--devic", "GPU-7f=4G", "--", "./job"][..], "--devic"),
            (&["run", "--bogus", "--limit", "8G", "--", "true"][..], "--bogus"),
            (&["run", "--limit", "8G", "-x", "--", "true"][..], "-x"),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument, "{args:?}: {err}");
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(&format!("'{named}'")), "{err}");
        }
        // After the command's first word, or after `--`, everything is the command's.
        let cli = parse(&["run", "--limit", "8G", "python", "--version", "-x", "--bogus"]).unwrap();
        let Command::Run(run) = cli.command else { panic!() };
        assert_eq!(run.command, ["python", "--version", "-x", "--bogus"]);
        let cli = parse(&["run", "--limit", "8G", "--", "--weird-name", "--", "x"]).unwrap();
        let Command::Run(run) = cli.command else { panic!() };
        assert_eq!(run.command, ["--weird-name", "--", "x"]);
    }

    #[test]
    fn run_usage_shows_limit_device_or_compute() {
        let mut cli = Cli::command();
        let usage = cli.find_subcommand_mut("run").unwrap().render_usage().to_string();
        assert!(usage.contains("<--limit <LIMIT>|--device <UUID=SIZE>|--compute <SHARE>|--mig <PROFILE>>"), "{usage}");
    }

    #[test]
    fn compute_takes_a_share_and_names_a_bad_one() {
        let cli = parse(&["run", "--compute", "30%", "--", "true"]).unwrap();
        let Command::Run(run) = cli.command else { panic!() };
        assert_eq!(run.compute.unwrap().text, "30%");
        assert!(run.limit.is_none());
        let err = parse(&["run", "--compute", "8G", "--", "true"]).unwrap_err().to_string();
        assert!(err.contains("--compute") && err.contains("not a share of the GPU's time"), "{err}");
    }

    #[test]
    fn run_needs_a_limit_and_a_command() {
        assert!(parse(&["run", "--", "true"]).is_err());
        assert!(parse(&["run", "--limit", "8G"]).is_err());
        assert!(parse(&["run", "--device", "GPU-1a=1G", "--", "true"]).is_ok());
    }
}
