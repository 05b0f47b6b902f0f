//! The command-line grammar (clap derive). Kept apart from the logic so completions and
//! unit tests can build the command without running anything.

use clap::{ArgGroup, Args, Parser, Subcommand};
use fgpu_core::limit::parse_limit;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

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

const RUN_HELP: &str = "\
Examples:
  fgpu run --limit 8G -- python train.py
  fgpu run --limit 50% -- ./simulate --steps 1000
  fgpu run --limit 4G --device GPU-1a2b3c4d=16G -- torchrun --nproc-per-node 2 train.py
  fgpu run --limit 8G --ledger /shared/team-a.ledger -- ./job    (share one cap across runs)
  fgpu run --limit 8G --compute 30% -- python train.py   (8 GiB and 30 % of each GPU's time)
  fgpu run --limit 50G --gpus auto -- python train.py     (on the GPU with the most room)
  fgpu run --limit 50G --gpus auto --wait -- ./job          (wait for room instead of refusing)

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
#[command(group(ArgGroup::new("cap").required(true).multiple(true).args(["limit", "device", "compute"])))]
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
    #[arg(long, value_name = "auto", value_parser = ["auto"])]
    pub gpus: Option<String>,

    /// With --gpus auto: when no GPU has room, wait until one has (checking every second)
    /// instead of refusing.
    #[arg(long, requires = "gpus")]
    pub wait: bool,

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

fn parse_limit_arg(text: &str) -> Result<LimitArg, String> {
    parse_limit(text).map_err(|e| e.to_string())?;
    Ok(LimitArg { text: text.trim().to_string() })
}

fn parse_compute_arg(text: &str) -> Result<LimitArg, String> {
    fgpu_core::compute::parse_share(text).map_err(|e| e.to_string())?;
    Ok(LimitArg { text: text.trim().to_string() })
}

fn parse_device_arg(text: &str) -> Result<DeviceArg, String> {
    let (key, amount) = text.split_once('=').ok_or_else(|| format!("{text:?} is not UUID=SIZE (for example GPU-1a2b3c4d=8G)"))?;
    let (key, amount) = (key.trim(), amount.trim());
    if key == "*" {
        return Err("'*' is not a device; use --limit for every device".into());
    }
    parse_limit(&format!("{key}={amount}")).map_err(|e| e.to_string())?;
    Ok(DeviceArg { key: key.to_string(), amount: amount.to_string() })
}

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

fn parse_interval(text: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.1..=3600.0).contains(&value) {
        return Err(format!("{text:?} is not between 0.1 and 3600 seconds"));
    }
    Ok(value)
}

const DOCTOR_HELP: &str = "\
Examples:
  fgpu doctor
  fgpu run --limit 8G -- fgpu doctor      check what a job started by fgpu run gets
  fgpu doctor --json

Checks: the front (libfgpu.so) is found, and it and the shim beside it load here; it
is preloaded (LD_PRELOAD or /etc/ld.so.preload); which cap applies and where it comes from; libcuda.so.1 and
libnvidia-ml.so.1 load, and their versions; the ledger is reachable and healthy; the PID
namespace; no other CUDA interposer (such as HAMi-core's libvgpu.so) is loaded.

Exit status: 0 a cap applies here, 1 it would not (each reason is printed), 2 usage error.";

/// Check whether a cap applies here, and say what to do if not.
#[derive(Debug, Args)]
#[command(after_help = DOCTOR_HELP)]
pub struct DoctorArgs {
    /// Print JSON (only JSON) on standard output.
    #[arg(long)]
    pub json: bool,
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

const SERVICE_HELP: &str = "\
Run it on the host (not in a container), as root, for example from a systemd unit or a
Kubernetes DaemonSet with hostPID, and mount its socket into capped containers:
  docker run -v /run/fgpu-service:/run/fgpu-service:ro ... fractional-gpu:...
CDI specs written by `fgpu cdi generate` mount it when it exists. A process in a container
connects once, when it first uses the GPU, and learns its host PID (the kernel reports the
peer's PID in the service's PID namespace); nothing waits for the answer. With the host
PID known, memory NVML shows for the process that no allocation call announced (module
code, lazily loaded kernels) counts against the container's cap, as with --pid=host.
FGPU_HOST_SOCKET names another socket for the processes. See docs/security.md.";

/// Tell processes in containers their host PID (the host-side helper).
#[derive(Debug, Args)]
#[command(after_help = SERVICE_HELP)]
pub struct ServiceArgs {
    /// The socket to listen on.
    #[arg(long, default_value = fgpu_core::hostpid::DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: std::path::PathBuf,
    /// Say why a connection got no answer.
    #[arg(long)]
    pub verbose: bool,
}

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

fn parse_sim_size(text: &str) -> Result<String, String> {
    fgpu_core::limit::parse_size(text).map_err(|e| e.to_string())?;
    Ok(text.trim().to_string())
}

/// Checks `--mig`: `all`, `none`, or comma-separated GPU indices below 8 (the simulator
/// checks them against the number of GPUs when it creates the state file).
pub fn parse_mig(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text == "all" || text == "none" || text.split(',').all(|i| i.trim().parse::<u32>().is_ok_and(|i| i < 8)) {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not all, none or a list of GPU indices (0 to 7) such as 0,2"))
    }
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

const CDI_GENERATE_HELP: &str = "\
Examples:
  sudo fgpu cdi generate
  podman run --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g IMAGE nvidia-smi
  sudo fgpu cdi generate --sizes 10g,20g --percents 50 --combine 0-20g,1-10g
  fgpu cdi generate --output - --config-dir /tmp/fgpu-cdi    (print the spec)

Devices, one per GPU index (as nvidia-smi numbers them) and size: 0-8g, 0-25pct;
all-8g caps every GPU the container is given; --combine 0-8g,1-4g adds 0-8g_1-4g. A
device for one GPU gives the container no memory on any other GPU (use all-SIZE with
nvidia.com/gpu=all). Each device bind-mounts, read-only, a copy of the shipped
libfgpu.so (found as `fgpu run` finds it; FGPU_SHIM=PATH overrides) at /usr/lib/fgpu, an
/etc/ld.so.preload naming it and an /etc/fgpu/fgpu.conf with the cap, and gives the
container a private ledger on a tmpfs at /run/fgpu. The mounted files are written to
--config-dir. Run it again after adding, removing or replacing GPUs, or upgrading fgpu.
See docs/cdi.md.

Exit status: 0 written, 1 failure (no GPU found, a file cannot be written), 2 usage error.";

/// Container Device Interface: cap containers at run time.
#[derive(Debug, Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    pub command: CdiCommand,
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    Generate(CdiGenerateArgs),
}

/// Write a CDI spec with devices fgpu.io/gpu=<index>-<size> for this machine's GPUs.
#[derive(Debug, Args)]
#[command(after_help = CDI_GENERATE_HELP)]
pub struct CdiGenerateArgs {
    /// Where to write the spec (.json for JSON, anything else YAML; - for standard output).
    #[arg(long, short = 'o', default_value = "/etc/cdi/fgpu.yaml", value_name = "FILE")]
    pub output: PathBuf,

    /// Sizes to offer on each GPU, comma-separated (binary units; whole MiB). Sizes larger
    /// than a GPU are left out for that GPU. An empty value offers none.
    #[arg(long, value_name = "SIZES", value_delimiter = ',', default_value = "2g,4g,8g,12g,16g,24g,32g,40g",
          value_parser = parse_cdi_size)]
    pub sizes: Vec<u64>,

    /// Percentages of a GPU's memory to offer, comma-separated whole numbers (0-25pct).
    /// An empty value offers none.
    #[arg(long, value_name = "PERCENTS", value_delimiter = ',', default_value = "10,25,50,75",
          value_parser = parse_cdi_percent)]
    pub percents: Vec<u32>,

    /// A device giving several GPUs different caps in one container, such as 0-8g,1-4g
    /// (named 0-8g_1-4g); repeatable.
    #[arg(long, value_name = "DEVICES")]
    pub combine: Vec<String>,

    /// Directory for the files the spec bind-mounts: a copy of the library, the
    /// /etc/ld.so.preload, a directory with the fgpu.conf of each device. It must not be
    /// writable by group or others.
    #[arg(long, default_value = "/var/lib/fgpu/cdi", value_name = "DIR")]
    pub config_dir: PathBuf,

    /// Owner (USER, USER:GROUP, UID or UID:GID) of the files the spec mounts. Rootless
    /// podman shows host root's files as nobody, and fgpu distrusts them; owned by the
    /// user who runs rootless podman, they show up as root in that user's containers.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub owner: Option<String>,
}

/// An empty item (as in `--sizes=`) parses as 0, which means "none" and is dropped.
fn parse_cdi_size(text: &str) -> Result<u64, String> {
    if text.trim().is_empty() {
        return Ok(0);
    }
    let bytes = fgpu_core::limit::parse_size(text).map_err(|e| e.to_string())?;
    if bytes == 0 || bytes % (1 << 20) != 0 {
        return Err(format!("{text:?} is not a positive whole number of MiB (such as 8g or 1536m)"));
    }
    Ok(bytes)
}

/// An empty item (as in `--percents=`) parses as 0, which means "none" and is dropped.
fn parse_cdi_percent(text: &str) -> Result<u32, String> {
    if text.trim().is_empty() {
        return Ok(0);
    }
    let value: u32 = text.trim().trim_end_matches('%').parse().map_err(|_| format!("{text:?} is not a whole percentage such as 25"))?;
    if !(1..=100).contains(&value) {
        return Err(format!("{text:?} is not between 1 and 100"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("fgpu").chain(args.iter().copied()))
    }

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
        assert!(usage.contains("<--limit <LIMIT>|--device <UUID=SIZE>|--compute <SHARE>>"), "{usage}");
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

    #[test]
    fn all_and_ledger_conflict() {
        assert!(parse(&["status", "--all", "--ledger", "/x"]).is_err());
        assert!(parse(&["exporter", "--listen", "nonsense"]).is_err());
        assert!(parse(&["top", "--interval", "0"]).is_err());
    }
}
