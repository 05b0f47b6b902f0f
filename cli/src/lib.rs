//! fgpu-cli: the `fgpu` command as a library under a thin binary (`main.rs` parses the
//! command line, calls [`run`] and exits with what it returns), so that the logic of every
//! command is unit-tested without a process.
//!
//! One folder per command family, each with its grammar (`args.rs`) beside its logic:
//!
//! * [`jobs`]: `fgpu run`, the signals it forwards, and `--gpus auto`'s placement;
//! * [`observe`]: `fgpu status`, `top` and `exporter`, the ledgers they find and what they
//!   show of each; the hidden `fgpu __nvml-events`, the GPUs' health for the DRA driver;
//! * [`doctor`]: `fgpu doctor`, one function per check;
//! * [`cdi`]: `fgpu cdi generate`;
//! * [`service`]: `fgpu service`, the host-PID helper;
//! * [`mig`]: `fgpu mig` and the instances `fgpu run --mig` makes;
//! * [`sim_env`]: the hidden `fgpu sim-env`, the simulated driver for development.
//!
//! What they share: [`driver`] (the driver as the tools see it, never through the shim),
//! [`elf`] and [`shimpath`]. The grammar's root is [`args`]. Imports run one way: the
//! binary, this root, the grammar, the families, what they share (scripts/layers.toml, which
//! `scripts/check-imports.py` enforces).
//!
//! The crate is `#![deny(unsafe_code)]`: its system calls go through `fgpu_core::sys`, and
//! the driver's functions are called in one module that opts in (`driver/calls.rs`).

#![deny(unsafe_code)]

pub mod args;
pub mod cdi;
pub mod doctor;
pub mod driver;
pub mod elf;
pub mod jobs;
pub mod mig;
pub mod observe;
pub mod service;
pub mod shimpath;
pub mod sim_env;

use args::{Cli, Command};

/// Runs a parsed command line and returns its exit status (`fgpu run` does not return
/// when its command was killed by a signal: it dies of the same signal).
pub fn run(cli: Cli) -> i32 {
    if prints_and_exits(&cli.command) {
        // Rust starts with SIGPIPE ignored, so `fgpu mig list --json | head` would panic
        // in println! once head is gone; a command that prints and exits dies quietly of
        // the signal instead, as other command-line tools do. `run` (its job gets the
        // default disposition anyway), `service`, `exporter` and `top` keep theirs.
        let _ = fgpu_core::sys::signals::default_action(libc::SIGPIPE);
    }
    match cli.command {
        Command::Run(args) => jobs::run::run(args),
        Command::Status(args) => observe::status::status(&args),
        Command::Top(args) => observe::top::top(&args),
        Command::Doctor(args) => doctor::doctor(&args),
        Command::Exporter(args) => observe::exporter::exporter(&args),
        Command::Completions(args) => {
            clap_complete::generate(args.shell, &mut args::completion_command(), "fgpu", &mut std::io::stdout());
            0
        }
        Command::Cdi(args) => cdi::cdi(&args),
        Command::Service(args) => service::service(&args),
        Command::Mig(args) => mig::mig(&args),
        Command::DriverProbe => driver::probe::main(),
        Command::NvmlEvents => observe::nvml_events::main(),
        Command::SimEnv(args) => sim_env::sim_env(&args),
    }
}

/// Whether the command prints what it found and exits (so a closed pipe may end it).
fn prints_and_exits(command: &Command) -> bool {
    matches!(command, Command::Status(_) | Command::Doctor(_) | Command::Completions(_) | Command::Cdi(_) | Command::Mig(_) | Command::SimEnv(_))
}
