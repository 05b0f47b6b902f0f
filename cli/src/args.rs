//! The command-line grammar's root (clap derive): `fgpu` and its commands. Each command's
//! own arguments are its family's (`jobs/args.rs`, `observe/args.rs`, ...). Kept apart from
//! the logic so completions and unit tests can build the command without running anything.

use crate::cdi::args::CdiArgs;
use crate::doctor::args::DoctorArgs;
use crate::jobs::args::RunArgs;
use crate::mig::args::MigArgs;
use crate::observe::args::{ExporterArgs, StatusArgs, TopArgs};
use crate::service::args::ServiceArgs;
use crate::sim_env::args::SimEnvArgs;
use clap::{Args, Parser, Subcommand};

const ROOT_HELP: &str = "\
Examples:
  fgpu run --limit 8G -- python train.py      run a job capped at 8 GiB per GPU
  fgpu run --compute 30% -- python train.py   ... held to 30 % of each GPU's time
  fgpu status                                 who holds what under the cap in effect here
  sudo fgpu status --all                      every capped process on the machine
  fgpu doctor                                 why a cap does or does not apply here
  sudo fgpu cdi generate                      cap containers at run time: --device fgpu.io/gpu=0-8g

Exit status: 0 success, 1 failure (see the command's help), 2 usage error.
`fgpu run` passes the command's own exit status through.";

/// Caps the GPU memory of programs and shows who holds what.
#[derive(Debug, Parser)]
#[command(name = "fgpu", version, about, after_help = ROOT_HELP, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(RunArgs),
    Status(StatusArgs),
    Top(TopArgs),
    Doctor(DoctorArgs),
    Exporter(ExporterArgs),
    Completions(CompletionsArgs),
    Cdi(CdiArgs),
    Service(ServiceArgs),
    Mig(MigArgs),
    /// Internal: loads the driver libraries and prints what they say as JSON (used by
    /// `fgpu doctor` in a child process without the shim preloaded).
    #[command(name = "__driver-probe", hide = true)]
    DriverProbe,
    /// Internal: watches the GPUs' health through NVML's events and prints one JSON line per
    /// event (run by fgpu-kubelet-plugin as a child process).
    #[command(name = "__nvml-events", hide = true)]
    NvmlEvents,
    /// For development: set up fgpu's simulated driver (docs/simulator.md). Hidden: it needs
    /// the simulator built in the workspace, which an installed fgpu does not ship.
    #[command(hide = true)]
    SimEnv(SimEnvArgs),
}

/// The grammar completion scripts are made from: the visible subcommands only, so no shell
/// offers the internal ones. (clap's generators list hidden subcommands, and a `Command`
/// cannot drop one, so the root is built anew around the visible ones; the root has no
/// arguments of its own to carry over, which a unit test checks.)
pub fn completion_command() -> clap::Command {
    use clap::CommandFactory;
    let full = Cli::command();
    full.get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .cloned()
        .fold(clap::Command::new("fgpu").version(env!("CARGO_PKG_VERSION")).propagate_version(true).subcommand_required(true), |root, sub| root.subcommand(sub))
}

/// Print a shell completion script.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  fgpu completions bash > /etc/bash_completion.d/fgpu
  fgpu completions zsh > \"${fpath[1]}/_fgpu\"
  fgpu completions fish > ~/.config/fish/completions/fgpu.fish")]
pub struct CompletionsArgs {
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// A usage error as the user should read it. clap's tip for an unknown option, "to pass
/// '--bogus' as a value, use '-- --bogus'", is wrong for fgpu: under `fgpu run` everything
/// after `--` is the command, so following it would run `--bogus` as the command. The tip is
/// dropped, and under `fgpu run` replaced by what the grammar means: fgpu run's options come
/// first, then the command and its own arguments.
pub fn usage_error(mut e: clap::Error) -> clap::Error {
    use clap::builder::StyledStr;
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg).cloned() else { return e };
    let mut tips = match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(tips)) => tips.clone(),
        _ => Vec::new(),
    };
    tips.retain(|tip| !tip.to_string().contains("as a value, use '"));
    let under_run = matches!(e.get(ContextKind::Usage), Some(ContextValue::StyledStr(usage)) if usage.to_string().contains("fgpu run "));
    if under_run {
        tips.push(StyledStr::from(format!(
            "'{arg}' is not an option of fgpu run (fgpu run --help lists them); the command and its own arguments come after fgpu run's options, as in 'fgpu run --limit 8G -- ./job {arg}'"
        )));
    }
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    e
}

#[cfg(test)]
/// Parses `fgpu ARGS...` as the command line would (for the families' grammar tests).
pub(crate) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("fgpu").chain(args.iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    /// clap's "use '-- --bogus'" would run `--bogus` as the command under fgpu run.
    #[test]
    fn an_unknown_option_gets_no_tip_that_would_run_it() {
        let e = usage_error(parse(&["run", "--limit", "8G", "--bogus", "--", "true"]).unwrap_err());
        let text = e.to_string();
        assert!(!text.contains("-- --bogus'"), "{text}");
        assert!(text.contains("'--bogus' is not an option of fgpu run") && text.contains("'fgpu run --limit 8G -- ./job --bogus'"), "{text}");
        assert_eq!(e.exit_code(), 2);
        // A near miss keeps clap's suggestion.
        let text = usage_error(parse(&["run", "--limt", "8G", "--", "true"]).unwrap_err()).to_string();
        assert!(text.contains("--limit"), "{text}");
        // Elsewhere the tip is dropped, and nothing about fgpu run is said.
        let text = usage_error(parse(&["sim-env", "--bogus", "/tmp/x"]).unwrap_err()).to_string();
        assert!(!text.contains("as a value") && !text.contains("fgpu run"), "{text}");
        // Other errors pass through untouched.
        let e = parse(&["top", "--interval", "0"]).unwrap_err();
        assert_eq!(usage_error(e).kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn completions_offer_every_visible_subcommand_and_no_hidden_one() {
        assert_eq!(Cli::command().get_arguments().count(), 0, "completion_command() carries no root arguments over");
        let full = Cli::command();
        let hidden: Vec<&str> = full.get_subcommands().filter(|s| s.is_hide_set()).map(|s| s.get_name()).collect();
        assert!(hidden.contains(&"__driver-probe"), "{hidden:?}");
        for shell in
            [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish, clap_complete::Shell::Elvish, clap_complete::Shell::PowerShell]
        {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut completion_command(), "fgpu", &mut out);
            let script = String::from_utf8(out).unwrap();
            for name in &hidden {
                assert!(!script.contains(name), "{shell} completions offer {name}");
            }
            for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
                assert!(script.contains(sub.get_name()), "{shell} completions lack {}", sub.get_name());
            }
            let limit = if shell == clap_complete::Shell::Fish { "-l limit" } else { "--limit" };
            assert!(script.contains(limit), "{shell}: subcommand options are kept");
        }
    }
}
