//! `fgpu-kubelet-plugin`: the DRA driver `gpu.fgpu.io` on one node (docs/kubernetes.md).

use clap::Parser;
use fgpu_cdi::files::{prepare_dir, Payload};
use fgpu_kubelet_plugin::api::Api;
use fgpu_kubelet_plugin::nvidia::NvidiaNames;
use fgpu_kubelet_plugin::plugin::{Inventory, Plugin, Settings};
use fgpu_kubelet_plugin::quantity::Quantity;
use fgpu_kubelet_plugin::slices::{self, DriverInfo, GpuInfo, MemoryPolicy};
use fgpu_kubelet_plugin::{log, server};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const AFTER_HELP: &str = "\
Runs on each GPU node (a DaemonSet: deploy/kubernetes/). It publishes the node's GPUs in a
ResourceSlice (pool = the node's name; devices gpu-0, gpu-1, ... with consumable capacity
`memory` and `compute`), registers with kubelet, and answers NodePrepareResources with
NVIDIA's CDI device for each allocated GPU and fgpu's device `fgpu.io/gpu=claim-<uid>`,
which caps the claim's containers at the memory and compute the scheduler allocated.

Examples:
  fgpu-kubelet-plugin --node-name gpu-node-1
  NODE_NAME=gpu-node-1 fgpu-kubelet-plugin --kubeconfig ~/.kube/config --cdi-root /etc/cdi

See docs/kubernetes.md.";

/// The Kubernetes DRA driver gpu.fgpu.io: GPUs shared by memory and compute, each claim capped.
#[derive(Debug, Parser)]
#[command(name = "fgpu-kubelet-plugin", version, after_help = AFTER_HELP)]
struct Args {
    /// The node this plugin runs on: the pool of its ResourceSlice.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: String,

    /// Where the claims' CDI specs are written (/var/run/cdi: generated at run time, gone at
    /// reboot, when the plugin writes them again; CDI reads it after /etc/cdi).
    #[arg(long, default_value = "/var/run/cdi", value_name = "DIR")]
    cdi_root: PathBuf,

    /// kubelet's plugin registration directory, where the registration socket goes.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry", value_name = "DIR")]
    kubelet_registrar_directory_path: PathBuf,

    /// kubelet's plugins directory: the DRA socket and the checkpoint go in its gpu.fgpu.io/.
    #[arg(long, default_value = "/var/lib/kubelet/plugins", value_name = "DIR")]
    kubelet_plugins_directory_path: PathBuf,

    /// The kubeconfig of the API server (default: KUBECONFIG or ~/.kube/config, else the
    /// pod's service account).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,

    /// Where the files the CDI specs mount go: the library, the preload list, and each
    /// claim's configuration and ledger directory. Not writable by group or others.
    #[arg(long, default_value = "/var/lib/fgpu/dra", value_name = "DIR")]
    state_dir: PathBuf,

    /// The fgpu command shipped with this plugin (reads the GPUs; copied into containers).
    /// Default: fgpu beside this binary, else on PATH. The library is found as fgpu finds it
    /// (beside this binary, ../lib/fgpu, ..., FGPU_SHIM).
    #[arg(long, value_name = "FILE")]
    fgpu: Option<PathBuf>,

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

    /// Seconds between two looks at the GPUs and the ResourceSlice.
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86400))]
    resync_interval: u64,
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    Quantity::parse(text)?.floor_units().ok_or_else(|| format!("{text:?} is negative"))
}

fn parse_step(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err("the step must be at least 1Mi".into()),
        b if b % (1 << 20) != 0 => Err(format!("{text:?} is not a whole number of Mi")),
        b => Ok(b),
    }
}

/// The fgpu command: `--fgpu`, else beside this binary, else on PATH.
fn find_fgpu(flag: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return if path.is_file() { Ok(path.to_path_buf()) } else { Err(format!("--fgpu {}: no such file", path.display())) };
    }
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("fgpu")));
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).map(|d| d.join("fgpu"));
    beside
        .into_iter()
        .chain(on_path)
        .find(|p| p.is_file())
        .ok_or_else(|| "cannot find the fgpu command beside this binary or on PATH; install it beside fgpu-kubelet-plugin or pass --fgpu".into())
}

/// The node's GPUs and driver, read by `fgpu __driver-probe`.
fn probe(fgpu: &Path) -> Result<Inventory, String> {
    let probe = fgpu_cdi::probe::run(fgpu)?;
    if !probe.nvml.loaded || probe.nvml.device_count.is_none() {
        let why = probe.nvml.error.clone().unwrap_or_else(|| "it lists no GPU".into());
        return Err(format!("cannot read the GPUs through NVML (libnvidia-ml.so.1: {why})"));
    }
    let mut gpus = Vec::new();
    for d in &probe.devices {
        if d.uuid.is_empty() || d.total_bytes == 0 {
            return Err(format!("NVML did not give the UUID and memory size of GPU {}", d.index));
        }
        gpus.push(GpuInfo { index: d.index, uuid: d.uuid.clone(), product: d.name.clone(), total: d.total_bytes });
    }
    let driver = DriverInfo { driver_version: probe.nvml.driver_version.clone(), cuda_version: probe.cuda.cuda_version.or(probe.nvml.cuda_version) };
    Ok(Inventory { gpus, driver })
}

fn describe(inventory: &Inventory) -> String {
    let gpus: Vec<String> = inventory
        .gpus
        .iter()
        .map(|g| format!("{} {} ({}, {})", slices::device_name(g.index), g.uuid, g.product, fgpu_kubelet_plugin::quantity::format_bytes(g.total)))
        .collect();
    if gpus.is_empty() {
        "no GPU".into()
    } else {
        gpus.join("; ")
    }
}

/// Probes the GPUs and keeps the slice as it should be, every `interval`; a failed publish
/// is tried again sooner.
async fn resync(plugin: Arc<Plugin>, fgpu: PathBuf, interval: Duration) {
    let mut first = true;
    loop {
        if !first {
            let path = fgpu.clone();
            match tokio::task::spawn_blocking(move || probe(&path)).await {
                Ok(Ok(inventory)) => {
                    let text = describe(&inventory);
                    if plugin.set_inventory(inventory) {
                        log(&format!("the GPUs changed: {text}"));
                    }
                }
                Ok(Err(e)) => log(&format!("{e}; keeping the GPUs last seen")),
                Err(e) => log(&format!("the probe failed: {e}")),
            }
        }
        first = false;
        let inventory = plugin.inventory();
        let devices = slices::devices(&inventory.gpus, &inventory.driver, &plugin.settings.memory);
        let wait = match plugin.api().publish(&plugin.settings.node, devices).await {
            Ok(Some(said)) => {
                log(&said);
                interval
            }
            Ok(None) => interval,
            Err(e) => {
                log(&format!("cannot publish the ResourceSlice: {e}"));
                interval.min(Duration::from_secs(5))
            }
        };
        tokio::time::sleep(wait).await;
    }
}

async fn run(args: Args) -> Result<(), String> {
    if args.node_name.is_empty() {
        return Err("--node-name (or NODE_NAME) is empty".into());
    }
    let fgpu = find_fgpu(args.fgpu.as_deref())?;
    let front = fgpu_cdi::shimpath::locate().map_err(|e| e.to_string())?.path;
    let payload = Payload::read(&front, Some(&fgpu))?;
    let state_dir = fgpu_cdi::files::absolute(&args.state_dir)?;
    prepare_dir(&state_dir, None)?;
    payload.install(&state_dir, None)?;

    let path = fgpu.clone();
    let inventory = tokio::task::spawn_blocking(move || probe(&path)).await.map_err(|e| format!("the probe failed: {e}"))??;
    log(&format!("node {}: {}", args.node_name, describe(&inventory)));
    let api = Api::connect(args.kubeconfig.as_deref()).await?;
    log(&format!("API server {}", api.server()));

    let plugins_dir = fgpu_cdi::files::absolute(&args.kubelet_plugins_directory_path)?;
    let registrar_dir = fgpu_cdi::files::absolute(&args.kubelet_registrar_directory_path)?;
    let plugin_dir = server::plugin_dir(&plugins_dir);
    std::fs::create_dir_all(&plugin_dir).map_err(|e| format!("cannot create {}: {e}", plugin_dir.display()))?;
    let nvidia = match args.nvidia_cdi_device {
        Some(template) => NvidiaNames::Template(template),
        None if !args.cdi_spec_dirs.is_empty() => NvidiaNames::Search(args.cdi_spec_dirs.clone()),
        None => {
            let mut dirs = vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")];
            let root = fgpu_cdi::files::absolute(&args.cdi_root)?;
            if !dirs.contains(&root) {
                dirs.push(root);
            }
            NvidiaNames::Search(dirs)
        }
    };
    let settings = Settings {
        node: args.node_name.clone(),
        cdi_root: fgpu_cdi::files::absolute(&args.cdi_root)?,
        state_dir,
        checkpoint: plugin_dir.join("checkpoint.json"),
        nvidia,
        memory: MemoryPolicy { reserve: args.memory_reserve, step: args.memory_step },
        service_dir: PathBuf::from(fgpu_core::hostpid::SERVICE_DIR),
    };
    let plugin = Arc::new(Plugin::new(settings, api, inventory));
    plugin.restore().await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let dra_socket = server::dra_socket(&plugins_dir);
    let dra = tokio::spawn(server::serve_dra(plugin.clone(), server::listen(&dra_socket)?, stopped(stop_rx.clone())));
    let reg_socket = server::registration_socket(&registrar_dir);
    let registration = tokio::spawn(server::serve_registration(dra_socket.clone(), server::listen(&reg_socket)?, stopped(stop_rx.clone())));
    log(&format!("serving {} and {}", reg_socket.display(), dra_socket.display()));
    let sync = tokio::spawn(resync(plugin.clone(), fgpu, Duration::from_secs(args.resync_interval)));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let outcome = tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = tokio::signal::ctrl_c() => Ok("SIGINT"),
        r = dra => Err(r.map_err(|e| e.to_string()).and_then(|r| r).err().unwrap_or_else(|| "the DRA service stopped".into())),
        r = registration => Err(r.map_err(|e| e.to_string()).and_then(|r| r).err().unwrap_or_else(|| "the registration service stopped".into())),
    };
    sync.abort();
    let _ = stop_tx.send(true);
    // kubelet deregisters the plugin when its registration socket goes.
    let _ = std::fs::remove_file(&reg_socket);
    let _ = std::fs::remove_file(&dra_socket);
    let signal = outcome?;
    log(&format!("stopped on {signal}; prepared claims stay prepared"));
    Ok(())
}

fn main() {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            log(&format!("cannot start: {e}"));
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(args)) {
        log(&e);
        std::process::exit(1);
    }
}
