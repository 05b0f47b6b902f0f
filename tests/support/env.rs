//! One test's world ([`Env`]): a temp dir, a simulated GPU and a ledger, and the commands
//! that run in it.

use crate::clients::{client, reachable, sweep_earlier_runs};
use crate::paths::sim_lib_dir;
use crate::process::Cmd;
use crate::skips::{is_root, prerequisite, tool};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// One test's world: a temp dir, a simulated GPU (state file) and a ledger.
pub struct Env {
    pub dir: PathBuf,
    pub sim_state: PathBuf,
    pub ledger: PathBuf,
    pub sim_memory: String,
    pub context_overhead: String,
    pub devices: u32,
    pub driver_version: String,
    /// `FGPU_SIM_NVML_PIDS`; empty for the simulator's default (`caller`, as current drivers).
    pub nvml_pids: String,
}

impl Env {
    pub fn new(name: &str) -> Env {
        sweep_earlier_runs();
        let dir = std::env::temp_dir().join(format!("fgpu-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Env {
            sim_state: dir.join("sim-state"),
            ledger: dir.join("ledger"),
            dir,
            sim_memory: "80G".into(),
            context_overhead: "300M".into(),
            devices: 1,
            driver_version: "12080".into(),
            nvml_pids: String::new(),
        }
    }

    /// Which PIDs the simulated NVML gives a caller outside the host's PID namespace:
    /// `host`, `caller`, `caller-no-memory` or `none` (docs/simulator.md).
    pub fn nvml_pids(mut self, mode: &str) -> Self {
        self.nvml_pids = mode.into();
        self
    }

    /// Keeps the simulated driver's host PIDs known, as the kernel driver's always are: a
    /// thread of the test, in the host's PID namespace, looks at the simulator's process
    /// table every 5 ms (docs/simulator.md). Creates the state file first.
    pub fn driver_watch(&self) -> DriverWatch {
        self.command(client("cuclient")).args(["init"]).success();
        let sim = self.sim();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                sim.watch_host_pids();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        DriverWatch(stop, Some(thread))
    }

    pub fn sim_memory(mut self, size: &str) -> Self {
        self.sim_memory = size.into();
        self
    }

    pub fn context_overhead(mut self, size: &str) -> Self {
        self.context_overhead = size.into();
        self
    }

    pub fn driver_version(mut self, version: &str) -> Self {
        self.driver_version = version.into();
        self
    }

    pub fn devices(mut self, n: u32) -> Self {
        self.devices = n;
        self
    }

    /// A command that sees the simulated driver, without the shim.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Cmd {
        let mut cmd = Command::new(program);
        let lib_path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(existing) if !existing.is_empty() => format!("{}:{existing}", sim_lib_dir().display()),
            _ => sim_lib_dir().display().to_string(),
        };
        cmd.env("LD_LIBRARY_PATH", lib_path)
            .env("FGPU_SIM_STATE", &self.sim_state)
            .env("FGPU_SIM_MEMORY", &self.sim_memory)
            .env("FGPU_SIM_CONTEXT_OVERHEAD", &self.context_overhead)
            .env("FGPU_SIM_DEVICES", self.devices.to_string())
            .env("FGPU_SIM_DRIVER_VERSION", &self.driver_version)
            .env("FGPU_SIM_NVML_PIDS", &self.nvml_pids)
            .env_remove("LD_PRELOAD")
            .env_remove("FGPU_LIMIT")
            .env_remove("FGPU_LOG")
            .env("FGPU_LEDGER", &self.ledger)
            .current_dir(&self.dir);
        Cmd(cmd)
    }

    /// `program` run as user and group `uid` (through setpriv; root only), seeing the
    /// simulated driver; preload with `.env("LD_PRELOAD", &reachable().front)`.
    pub fn command_as(&self, uid: u32, program: impl AsRef<std::ffi::OsStr>) -> Cmd {
        use std::os::unix::fs::PermissionsExt;
        assert!(is_root() && tool("setpriv"), "running as another user needs root and setpriv(1) (CI has both)");
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = self.command("setpriv");
        cmd.0.args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "--"]).arg(program);
        cmd.0.env("LD_LIBRARY_PATH", &reachable().sim_lib_dir);
        cmd
    }

    /// A command running a test client.
    pub fn client(&self, args: &[&str]) -> Cmd {
        let mut cmd = self.command(client("cuclient"));
        cmd.0.args(args);
        cmd
    }

    /// `sh -c script` in a private mount namespace where /etc is an overlay the test may
    /// write (root only; `None` with a printed reason otherwise, a failure under CI).
    pub fn with_private_etc(&self, script: &str) -> Option<Cmd> {
        self.with_private_etc_in(&[], script)
    }

    /// [`Env::with_private_etc`], in new namespaces of the kinds `unshare` flags name besides
    /// (`--ipc`: an IPC namespace of its own, as a pod or a container has).
    pub fn with_private_etc_in(&self, namespaces: &[&str], script: &str) -> Option<Cmd> {
        if !prerequisite(is_root() && tool("unshare"), "needs root and unshare(1) to give the test its own /etc") {
            return None;
        }
        let ov = self.dir.join("etc-overlay");
        let setup = format!(
            "set -e; mkdir -p {ov}; mount -t tmpfs fgpu-test {ov}; mkdir {ov}/up {ov}/work; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir={ov}/up,workdir={ov}/work /etc; {script}",
            ov = ov.display()
        );
        Some(self.command("unshare").arg("--mount").args(namespaces).args(["sh", "-c", &setup]))
    }

    /// The socket of this test's ledger keeper (see [`Env::keep_ledger`]).
    pub fn ledger_socket(&self) -> PathBuf {
        self.dir.join("ledger.sock")
    }

    /// Serves this test's ledger (`self.ledger`) from this process, as fgpu-kubelet-plugin
    /// serves a claim's (`fgpu_core::ledger::keeper`): its processes are given
    /// `FGPU_LEDGER_SOCKET` = [`Env::ledger_socket`]. Stops when dropped, as a keeper whose
    /// process died.
    pub fn keep_ledger(&self) -> (fgpu_core::ledger::keeper::Serving, fgpu_core::ledger::keeper::Settled) {
        use fgpu_core::ledger::keeper::{serve, Keeper, KeeperPaths};
        let paths = KeeperPaths { lock: self.ledger.clone(), recorded: self.ledger.clone(), socket: self.ledger_socket(), label: "test".into() };
        let (keeper, settled) = Keeper::open(paths).expect("a keeper of the test's ledger");
        (serve(keeper).expect("the keeper's socket"), settled)
    }

    /// The simulated driver's ground truth.
    pub fn sim(&self) -> fgpu_sim_state::SimState {
        fgpu_sim_state::SimState::open(&self.sim_state).expect("open simulated driver state")
    }

    /// The ledger, opened the way `fgpu status` opens it (while some process uses it).
    pub fn ledger(&self) -> fgpu_core::ledger::Ledger {
        fgpu_core::ledger::Ledger::open_existing(&self.ledger).expect("open ledger")
    }

    /// What the ledger's processes hold on its first device once dead ones are dropped; 0
    /// when no process uses the ledger any more (it went away with the last one).
    pub fn ledger_used(&self) -> u64 {
        match fgpu_core::ledger::Ledger::open_existing(&self.ledger) {
            Ok(ledger) => {
                ledger.reclaim_dead(None);
                ledger.snapshot(None).devices.first().map(|d| d.used).unwrap_or(0)
            }
            Err(fgpu_core::ledger::LedgerError::NotInUse { .. }) => 0,
            Err(e) => panic!("cannot open the ledger {}: {e}", self.ledger.display()),
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Kept on failure (and with FGPU_TEST_KEEP=1) for a look at the ledger and sim state;
        // the next run's sweep_earlier_runs removes it.
        if !std::thread::panicking() && std::env::var_os("FGPU_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {} for a look (the next test run removes it, unless FGPU_TEST_KEEP is set)", self.dir.display());
        }
    }
}

/// Stops [`Env::driver_watch`]'s thread when dropped.
pub struct DriverWatch(std::sync::Arc<std::sync::atomic::AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Drop for DriverWatch {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}
