//! `fgpu`: a thin binary over the modules of this crate. Each command's logic lives in its
//! module; this file only parses arguments and turns results into exit codes.

mod args;
mod cdi;
mod doctor;
mod driver_lists;
mod driver_probe;
mod elf;
mod exporter;
mod ledgers;
mod nvml_events;
mod placement;
mod report;
mod run;
mod service;
mod shimpath;
mod signals;
mod sim_env;
mod status;
mod top;

use args::{Cli, Command};
use clap::Parser;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and exit 0; usage errors exit 2.
            e.exit();
        }
    };
    let code = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::status(&args),
        Command::Top(args) => top::top(&args),
        Command::Doctor(args) => doctor::doctor(&args),
        Command::Exporter(args) => exporter::exporter(&args),
        Command::Completions(args) => {
            clap_complete::generate(args.shell, &mut args::completion_command(), "fgpu", &mut std::io::stdout());
            0
        }
        Command::Cdi(args) => cdi::cdi(&args),
        Command::Service(args) => service::service(&args),
        Command::DriverProbe => driver_probe::main(),
        Command::NvmlEvents => nvml_events::main(),
        Command::SimEnv(args) => sim_env::sim_env(&args),
    };
    std::process::exit(code);
}
