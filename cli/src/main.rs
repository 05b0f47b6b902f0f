//! `fgpu`: the binary, a thin layer over the fgpu-cli library. It parses the command line
//! (a usage error exits 2, `--help` and `--version` 0), runs the command, and exits with
//! its status.

use clap::Parser;

fn main() {
    let cli = match fgpu_cli::args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => fgpu_cli::args::usage_error(e).exit(),
    };
    std::process::exit(fgpu_cli::run(cli));
}
