//! `fgpu-kubelet-plugin`: the DRA driver `gpu.fgpu.io` on one node (docs/kubernetes.md).

use clap::{Args, Parser, Subcommand};
use fgpu_cdi::files::{prepare_dir, Payload};
use fgpu_kubelet_plugin::api::Api;
use fgpu_kubelet_plugin::authority::Notice;
use fgpu_kubelet_plugin::claimfiles::ClaimFiles;
use fgpu_kubelet_plugin::health::HealthMonitor;
use fgpu_kubelet_plugin::health_service::HealthService;
use fgpu_kubelet_plugin::health_watch::Helper;
use fgpu_kubelet_plugin::inventory::{self, Managed, MigProbe};
use fgpu_kubelet_plugin::metrics::{self, Metrics, View};
use fgpu_kubelet_plugin::metrics_http::{self, Scrape};
use fgpu_kubelet_plugin::mig::MigTool;
use fgpu_kubelet_plugin::nvidia::NvidiaNames;
use fgpu_kubelet_plugin::plugin::{Plugin, Settings};
use fgpu_kubelet_plugin::publish::Publisher;
use fgpu_kubelet_plugin::slices::MemoryPolicy;
use fgpu_kubelet_plugin::startup::{check_policy, find_fgpu, parse_bytes, parse_step, stopped_why, RunError};
use fgpu_kubelet_plugin::status::{self, Status};
use fgpu_kubelet_plugin::xid::XidPolicy;
use fgpu_kubelet_plugin::{check, log, server, watch};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

const AFTER_HELP: &str = "\
Runs on each GPU node (a DaemonSet: deploy/kubernetes/). It publishes the node's GPUs as a
pool of ResourceSlices (pool = the node's name; devices gpu-0, gpu-1, ... with consumable
capacity `memory` and `compute`, or whole GPUs where the cluster lacks DRAConsumableCapacity),
registers with kubelet, and answers NodePrepareResources with NVIDIA's CDI device for each
allocated GPU and fgpu's device `fgpu.io/gpu=claim-<uid>`, which caps the claim's containers
at the memory and compute the scheduler allocated.

Examples:
  fgpu-kubelet-plugin --node-name gpu-node-1
  NODE_NAME=gpu-node-1 fgpu-kubelet-plugin --kubeconfig ~/.kube/config --cdi-root /etc/cdi
  fgpu-kubelet-plugin check       (the probes: calls the plugin over its sockets)
  fgpu-kubelet-plugin status      (what it publishes and has prepared, as JSON)

See docs/kubernetes.md.";

/// How long a stopping plugin waits for the calls in flight (kubelet gives each 45 s; the
/// DaemonSet's grace period is longer).
const STOP_GRACE: Duration = Duration::from_secs(50);
/// How long the relays may take, once the servers stopped, to pass their last answers on.
const RELAY_DRAIN: Duration = Duration::from_secs(5);

/// The Kubernetes DRA driver gpu.fgpu.io: GPUs shared by memory and compute, each claim capped.
#[derive(Debug, Parser)]
#[command(name = "fgpu-kubelet-plugin", version, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Calls the running plugin over its sockets as kubelet does (GetInfo, then an empty
    /// NodePrepareResources); exits 0 when both answer. For liveness and startup probes.
    Check(Dirs),
    /// Prints the running plugin's status (JSON): what it publishes and why, what is
    /// prepared on each GPU.
    Status(Dirs),
}

/// kubelet's directories, where the plugin's sockets and status are.
#[derive(Debug, Args)]
struct Dirs {
    /// kubelet's plugin registration directory, where the registration socket goes.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry", value_name = "DIR")]
    kubelet_registrar_directory_path: PathBuf,

    /// kubelet's plugins directory: the DRA socket, the checkpoint and the status go in its
    /// gpu.fgpu.io/.
    #[arg(long, default_value = "/var/lib/kubelet/plugins", value_name = "DIR")]
    kubelet_plugins_directory_path: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The node this plugin runs on: the pool of its ResourceSlices.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,

    /// Where the claims' CDI specs are written (/var/run/cdi: generated at run time, gone at
    /// reboot, when the plugin writes them again; CDI reads it after /etc/cdi).
    #[arg(long, default_value = "/var/run/cdi", value_name = "DIR")]
    cdi_root: PathBuf,

    #[command(flatten)]
    dirs: Dirs,

    /// The kubeconfig of the API server (default: KUBECONFIG or ~/.kube/config, else the
    /// pod's service account).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,

    /// Where the files the CDI specs mount go: the library, the preload list, and each
    /// claim's configuration and ledger directory (claims/, root's alone). Not writable by
    /// group or others.
    #[arg(long, default_value = "/var/lib/fgpu/dra", value_name = "DIR")]
    state_dir: PathBuf,

    /// The fgpu command shipped with this plugin (reads the GPUs; copied into containers).
    /// Default: fgpu beside this binary, else on PATH. The library is found as fgpu finds it
    /// (beside this binary, ../lib/fgpu, ..., FGPU_SHIM).
    #[arg(long, value_name = "FILE")]
    fgpu: Option<PathBuf>,

    /// The host's driver root, mounted into the plugin's container: NVML
    /// (libnvidia-ml.so.1) is read from its library directories. / for a driver installed
    /// on the host, /run/nvidia/driver for the GPU operator's driver container. Default:
    /// the libraries the dynamic loader finds.
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// NVIDIA's CDI device for a GPU, with {index} and {uuid} (such as
    /// nvidia.com/gpu={uuid}). Default: the name NVIDIA's spec in /etc/cdi or /var/run/cdi
    /// gives the GPU: its UUID, else its index.
    #[arg(long, value_name = "TEMPLATE")]
    nvidia_cdi_device: Option<String>,

    /// The directories whose CDI specs are searched for NVIDIA's devices, comma-separated
    /// (default: /etc/cdi, /var/run/cdi and --cdi-root, where container runtimes read them).
    #[arg(long, value_name = "DIRS", value_delimiter = ',')]
    cdi_spec_dirs: Vec<PathBuf>,

    /// GPU memory not offered to claims (for the driver and processes outside any claim).
    #[arg(long, default_value = "512Mi", value_name = "QUANTITY", value_parser = parse_bytes)]
    memory_reserve: u64,

    /// The step claims' memory is rounded up to (and the least a claim gets).
    #[arg(long, default_value = "256Mi", value_name = "QUANTITY", value_parser = parse_step)]
    memory_step: u64,

    /// Seconds between two looks at the GPUs and the ResourceSlices (the slices are also
    /// watched, and put back within seconds when someone else deletes or changes them).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86400))]
    resync_interval: u64,

    /// Watch the GPUs' health (XID errors, GPUs that fall off the bus, through NVML's events
    /// in a child process, fgpu __nvml-events) and serve kubelet's device health service
    /// (DRAResourceHealth) on the DRA socket.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    device_health: bool,

    /// XIDs that leave a GPU healthy besides the application errors 13, 31, 43, 45, 68 and
    /// 109, comma-separated (as NVIDIA's DRA driver's flag of the same name).
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", value_delimiter = ',', value_name = "XIDS")]
    additional_xids_to_ignore: Vec<u64>,

    /// The GPUs whose MIG partitions this driver publishes and creates at prepare: GPU
    /// indices or UUIDs, comma-separated, or all. Default: none. fgpu never changes a GPU's
    /// MIG mode: a GPU named here with MIG off is published whole (one line in the log).
    #[arg(long, env = "FGPU_MIG_GPUS", default_value = "", value_name = "GPUS", value_parser = Managed::from_str)]
    mig_gpus: Managed,

    /// The kernel module's list of MIG capability minors, read for the `nvidia-caps`
    /// device nodes of the MIG instances created for claims.
    #[arg(long, default_value = fgpu_kubelet_plugin::mig::MIG_MINORS, value_name = "FILE")]
    mig_minors: PathBuf,

    /// The host's root for device nodes: the claims' specs name
    /// <DIR>/dev/nvidia-caps/nvidia-cap<minor> as the host path of a MIG instance's nodes.
    #[arg(long, default_value = "/", value_name = "DIR")]
    device_root: PathBuf,

    /// Serve Prometheus metrics on this address (such as 0.0.0.0:9478), at /metrics. Off
    /// unless given (the DaemonSet of deploy/kubernetes gives it).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<SocketAddr>,
}

struct Looks {
    plugin: Arc<Plugin>,
    publisher: Arc<Publisher>,
    fgpu: PathBuf,
    driver_root: Option<PathBuf>,
    mig: MigProbe,
    interval: Duration,
    kick: Arc<Notify>,
}

/// Probes the GPUs every `interval`, and keeps the slices as they should be at each look and
/// whenever the watch says they changed; a failed look is tried again sooner.
async fn looks(l: Looks) {
    let mut next_probe = tokio::time::Instant::now() + l.interval;
    loop {
        if tokio::time::Instant::now() >= next_probe {
            next_probe = tokio::time::Instant::now() + l.interval;
            let (path, root, mig) = (l.fgpu.clone(), l.driver_root.clone(), l.mig.clone());
            match tokio::task::spawn_blocking(move || inventory::probe(&path, root.as_deref(), &mig)).await {
                Ok(Ok(found)) => {
                    let text = inventory::describe(&found);
                    for note in inventory::new_notes(&l.plugin.inventory(), &found) {
                        log(note);
                    }
                    if l.plugin.set_inventory(found) {
                        log(&format!("the GPUs changed: {text}"));
                    }
                }
                Ok(Err(e)) => log(&format!("{e}; keeping the GPUs last seen")),
                Err(e) => log(&format!("the probe failed: {e}")),
            }
        }
        let found = l.plugin.inventory();
        let wait = match l.publisher.sync(&found, &l.plugin.settings.memory).await {
            Ok(Some(said)) => {
                log(&said);
                next_probe
            }
            Ok(None) => next_probe,
            Err(e) => {
                log(&format!("cannot publish the ResourceSlices: {e}"));
                next_probe.min(tokio::time::Instant::now() + Duration::from_secs(5))
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wait) => {}
            _ = l.kick.notified() => {
                // Let a burst of changes (kubelet deleting every slice) settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Keeps the GPUs' health and the health watch in the status.
async fn show_health(plugin: Arc<Plugin>, monitor: Arc<HealthMonitor>, status: Arc<Status>) {
    let mut changed = monitor.subscribe();
    loop {
        let indices: Vec<u32> = plugin.inventory().gpus.iter().map(|g| g.index).collect();
        let (health, watch) = (monitor.report(&indices), monitor.watch_status());
        status.update(|s| {
            s.health = health;
            s.health_watch = watch;
        });
        tokio::select! {
            _ = changed.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// What a scrape of the metrics endpoint answers.
fn scrape(plugin: Arc<Plugin>, monitor: Option<Arc<HealthMonitor>>, status: Arc<Status>, metrics: Arc<Metrics>) -> Scrape {
    Arc::new(move |openmetrics| {
        let gpus = plugin.inventory().gpus;
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        let (health, xids) = match &monitor {
            Some(m) => (m.report(&indices), m.xids()),
            None => (Vec::new(), Default::default()),
        };
        let view = View { gpus, status: status.get(), policy: plugin.settings.memory, health, xids };
        metrics::encode(&metrics.registry(&view), openmetrics)
    })
}

async fn run(args: RunArgs) -> Result<(), RunError> {
    let node = args.node_name.clone().filter(|n| !n.is_empty()).ok_or(RunError::NoNode)?;
    let fgpu = find_fgpu(args.fgpu.as_deref())?;
    let front = fgpu_cdi::shimpath::locate()?.path;
    let payload = Payload::read(&front, Some(&fgpu))?;
    let state_dir = fgpu_cdi::files::absolute(&args.state_dir)?;
    prepare_dir(&state_dir, None)?;
    payload.install(&state_dir, None)?;

    let policy = MemoryPolicy { reserve: args.memory_reserve, step: args.memory_step };
    let mig = MigProbe { managed: args.mig_gpus.clone(), record: state_dir.join("mig") };
    let (path, root, probe_mig) = (fgpu.clone(), args.driver_root.clone(), mig.clone());
    let found = tokio::task::spawn_blocking(move || inventory::probe(&path, root.as_deref(), &probe_mig))
        .await
        .map_err(RunError::ProbeTask)?
        .map_err(|e| RunError::Inventory(e.to_string()))?;
    log(&format!("node {node}: {}", inventory::describe(&found)));
    for note in &found.mig_notes {
        log(note);
    }
    check_policy(&found, &policy)?;
    let api = Arc::new(Api::connect(args.kubeconfig.as_deref()).await?);
    log(&format!("API server {}", api.server()));

    let plugins_dir = fgpu_cdi::files::absolute(&args.dirs.kubelet_plugins_directory_path)?;
    let registrar_dir = fgpu_cdi::files::absolute(&args.dirs.kubelet_registrar_directory_path)?;
    let plugin_dir = server::plugin_dir(&plugins_dir);
    std::fs::create_dir_all(&plugins_dir).map_err(|source| RunError::CreateDir { path: plugins_dir.clone(), source })?;
    server::private_dir(&plugin_dir, server::PLUGIN_DIR_MODE)?;
    let status = Arc::new(Status::new(Some(plugin_dir.join(status::FILE)), &node));
    let cdi_root = fgpu_cdi::files::absolute(&args.cdi_root)?;
    let nvidia = match args.nvidia_cdi_device {
        Some(template) => NvidiaNames::Template(template),
        None if !args.cdi_spec_dirs.is_empty() => NvidiaNames::Search(args.cdi_spec_dirs.clone()),
        None => {
            let mut dirs = vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")];
            if !dirs.contains(&cdi_root) {
                dirs.push(cdi_root.clone());
            }
            NvidiaNames::Search(dirs)
        }
    };
    let mig_tool = MigTool {
        fgpu: fgpu.clone(),
        library_dir: args.driver_root.as_deref().map(inventory::nvml_dir).transpose().map_err(|e| RunError::Inventory(e.to_string()))?,
        record: state_dir.join("mig"),
        minors: args.mig_minors.clone(),
        device_root: args.device_root.clone(),
    };
    let settings = Settings { node: node.clone(), checkpoint: plugin_dir.join("checkpoint.json"), nvidia, memory: policy, mig: mig_tool };
    let mut files = ClaimFiles::new(cdi_root, state_dir, PathBuf::from(fgpu_core::hostpid::SERVICE_DIR));
    files.device_root = args.device_root.clone();
    let plugin = Arc::new(Plugin::new(settings, api.clone(), files, found, status.clone()));
    plugin.collect_instances().await;
    plugin.restore().await.map_err(|e| RunError::Restore(e.to_string()))?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // The GPUs' health, watched in a child process (NVML stays out of this one).
    let monitor = args.device_health.then(|| Arc::new(HealthMonitor::new(XidPolicy::new(&args.additional_xids_to_ignore))));
    let mut background = Vec::new();
    if let Some(monitor) = &monitor {
        let library_dir = args.driver_root.as_deref().map(inventory::nvml_dir).transpose().map_err(|e| RunError::Inventory(e.to_string()))?;
        let ignored: Vec<String> = XidPolicy::new(&args.additional_xids_to_ignore).ignored().iter().map(u64::to_string).collect();
        log(&format!("device health: a GPU is unhealthy while it is off the bus, and after any XID error but {} until it is reset", ignored.join(", ")));
        background.push(tokio::spawn(Helper { fgpu: fgpu.clone(), library_dir }.run(monitor.clone())));
        background.push(tokio::spawn(show_health(plugin.clone(), monitor.clone(), status.clone())));
    }
    let metrics = Arc::new(Metrics::default());
    if let Some(address) = args.metrics_address {
        let listener = metrics_http::listen(address).await?;
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| address.to_string());
        status.update(|s| s.metrics = Some(bound.clone()));
        log(&format!("serving metrics on http://{bound}/metrics"));
        background.push(tokio::spawn(metrics_http::serve(listener, scrape(plugin.clone(), monitor.clone(), status.clone(), metrics.clone()))));
    }

    let dra_socket = server::dra_socket(&plugins_dir);
    let reg_socket = server::registration_socket(&registrar_dir);
    let dra_listener = server::listen(&dra_socket)?;
    let health_service = monitor.as_ref().map(|m| HealthService::new(m.clone(), plugin.clone(), stop_rx.clone()));
    let (dra_notice, reg_notice) = (Notice::new(&dra_socket), Notice::new(&reg_socket));
    let mut dra = tokio::spawn(server::serve_dra(plugin.clone(), metrics.clone(), health_service, dra_listener, dra_notice.clone(), stopped(stop_rx.clone())));
    let reg_listener = server::listen(&reg_socket)?;
    let versions = server::supported_versions(monitor.is_some());
    let mut registration =
        tokio::spawn(server::serve_registration(dra_socket.clone(), versions, status.clone(), reg_listener, reg_notice.clone(), stopped(stop_rx.clone())));
    log(&format!("serving {} and {}", reg_socket.display(), dra_socket.display()));

    let publisher = Arc::new(Publisher::new(api.clone(), &node, status.clone()));
    let kick = Arc::new(Notify::new());
    let looking = tokio::spawn(looks(Looks {
        plugin: plugin.clone(),
        publisher: publisher.clone(),
        fgpu,
        driver_root: args.driver_root.clone(),
        mig,
        interval: Duration::from_secs(args.resync_interval),
        kick: kick.clone(),
    }));
    let watching = tokio::spawn(watch::run(api.clone(), publisher, node, kick, status));
    let forgetting = tokio::spawn({
        let plugin = plugin.clone();
        async move { plugin.forget_deleted_claims().await }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(RunError::Signal)?;
    let outcome = tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = tokio::signal::ctrl_c() => Ok("SIGINT"),
        r = &mut dra => Err(stopped_why(r, "DRA")),
        r = &mut registration => Err(stopped_why(r, "registration")),
    };
    looking.abort();
    watching.abort();
    forgetting.abort();
    for task in &background {
        task.abort();
    }
    // kubelet deregisters the plugin when its registration socket goes; the calls in flight
    // finish, and new connections are refused.
    let _ = std::fs::remove_file(&reg_socket);
    let _ = stop_tx.send(true);
    if outcome.is_ok() {
        log(&format!("stopping: the calls in flight finish (at most {} s)", STOP_GRACE.as_secs()));
        let both = async {
            let _ = (&mut dra).await;
            let _ = (&mut registration).await;
        };
        if tokio::time::timeout(STOP_GRACE, both).await.is_err() {
            log("calls still in flight after the grace period are cut");
        }
        // The servers are done; their last answers are still on their way through the
        // relays to kubelet.
        let drained = dra_notice.drained(RELAY_DRAIN).await & reg_notice.drained(RELAY_DRAIN).await;
        if !drained {
            log(&format!("a connection was still passing answers to kubelet after {} s, and is cut", RELAY_DRAIN.as_secs()));
        }
    }
    let _ = std::fs::remove_file(&dra_socket);
    let signal = outcome?;
    log(&format!("stopped on {signal}; prepared claims stay prepared"));
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            log(&format!("cannot start: {e}"));
            std::process::exit(1);
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        None => runtime().block_on(run(cli.run)),
        Some(Command::Check(dirs)) => {
            let socket = server::registration_socket(&dirs.kubelet_registrar_directory_path);
            match runtime().block_on(check::run(&socket)) {
                Ok(found) => {
                    println!("ok: {found}");
                    Ok(())
                }
                Err(e) => Err(RunError::Check(e)),
            }
        }
        Some(Command::Status(dirs)) => status::read(&server::plugin_dir(&dirs.kubelet_plugins_directory_path)).map_err(RunError::from).map(|s| {
            println!("{}", serde_json::to_string_pretty(&s).expect("a status serialises"));
        }),
    };
    if let Err(e) = result {
        log(&e.to_string());
        std::process::exit(1);
    }
}
