//! `fgpu`: a thin binary over the modules of this crate. Each command's logic lives in its
//! module; this file only parses arguments and turns results into exit codes.

mod args;
mod cdi;
mod doctor;
mod driver;
mod elf;
mod jobs;
mod observe;
mod service;
mod shimpath;
mod sim_env;

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
        Command::DriverProbe => driver::probe::main(),
        Command::SimEnv(args) => sim_env::sim_env(&args),
    };
    std::process::exit(code);
}
