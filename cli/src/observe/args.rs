//! The arguments of `fgpu status`, `fgpu top` and `fgpu exporter`, and the ledgers they show.

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Args, Clone, Default)]
pub struct LedgerSelection {
    /// Show this ledger file instead of the one in effect here.
    #[arg(long, value_name = "FILE", conflicts_with = "all")]
    pub ledger: Option<PathBuf>,

    /// Find the ledgers of every capped process on this machine, containers included, by
    /// looking at what each process has mapped (needs root to see other users' processes).
    #[arg(long)]
    pub all: bool,
}

const STATUS_HELP: &str = "\
Examples:
  fgpu status                         the ledger a capped program started here would use
  fgpu status --ledger /tmp/fgpu-1000/ledger
  sudo fgpu status --all              every ledger on the machine, containers included
  fgpu status --json | jq '.ledgers[].devices[].used_bytes'

The ledger in effect is FGPU_LEDGER, else `ledger` in /etc/fgpu/fgpu.conf, else
/tmp/fgpu-UID/ledger (one per user), exactly as the shim resolves it. Processes that died are reclaimed (their memory returned to the cap)
and listed as reclaimed. The JSON schema is described in docs/cli.md.

Exit status: 0 shown (a ledger not created yet counts), 1 a ledger could not be read, 2 usage error.";

/// Show each GPU's cap, what is held, and by which process.
#[derive(Debug, Args)]
#[command(after_help = STATUS_HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub select: LedgerSelection,

    /// Print JSON (only JSON) on standard output.
    #[arg(long)]
    pub json: bool,
}

const TOP_HELP: &str = "\
Examples:
  fgpu top
  sudo fgpu top --all
  fgpu top --interval 0.5

Keys: q, Esc or Ctrl-C quit.";

/// Like `fgpu status`, refreshed live in the terminal.
#[derive(Debug, Args)]
#[command(after_help = TOP_HELP)]
pub struct TopArgs {
    #[command(flatten)]
    pub select: LedgerSelection,

    /// Seconds between refreshes.
    #[arg(long, short = 'n', default_value = "1", value_name = "SECONDS", value_parser = parse_interval)]
    pub interval: f64,
}

/// Why a `--interval` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error("{0:?} is not a number of seconds")]
    NotANumber(String),
    #[error("{0:?} is not between 0.1 and 3600 seconds")]
    OutOfRange(String),
}

fn parse_interval(text: &str) -> Result<f64, IntervalError> {
    let value: f64 = text.trim().parse().map_err(|_| IntervalError::NotANumber(text.to_string()))?;
    if !(0.1..=3600.0).contains(&value) {
        return Err(IntervalError::OutOfRange(text.to_string()));
    }
    Ok(value)
}

const EXPORTER_HELP: &str = "\
Examples:
  fgpu exporter                                  metrics of the ledger in effect here
  sudo fgpu exporter --all --listen 0.0.0.0:9400   every ledger on the machine
  curl -s localhost:9400/metrics

Serves Prometheus metrics at /metrics: fgpu_memory_cap_bytes, fgpu_memory_used_bytes,
fgpu_process_memory_used_bytes, fgpu_allocation_refusals_total and more, labelled with
gpu (the ledger's device index), UUID (as DCGM's exporter labels it) and ledger.
See docs/cli.md. Listens on loopback unless told otherwise.

Exit status: runs until stopped; 1 the address cannot be bound, 2 usage error.";

/// Serve Prometheus metrics of the ledgers `fgpu status` would show.
#[derive(Debug, Args, Clone)]
#[command(after_help = EXPORTER_HELP)]
pub struct ExporterArgs {
    #[command(flatten)]
    pub select: LedgerSelection,

    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:9400", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
}

#[cfg(test)]
mod tests {
    use crate::args::parse;

    #[test]
    fn all_and_ledger_conflict() {
        assert!(parse(&["status", "--all", "--ledger", "/x"]).is_err());
        assert!(parse(&["exporter", "--listen", "nonsense"]).is_err());
        assert!(parse(&["top", "--interval", "0"]).is_err());
    }
}
