//! Support for fgpu's integration tests: a temp directory per test with its own simulated
//! GPU and ledger, commands whose failures show everything, and C clients built on demand.
//!
//! The tests drive the release build (`cargo build --release` first; `tests/run.sh` does).
//!
//! The rule every test follows (tests/README.md says it in full): every load proves it
//! happened ([`assert_load`], [`Background::assert_running`], [`process_alive`]), every
//! skip goes through [`prerequisite`] and is counted, and every range is as tight as the
//! ground truth (the simulator's own figures) allows.

pub mod c_layout;
pub mod dra;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target"));
    if target.is_absolute() {
        target
    } else {
        workspace().join(target)
    }
}

/// Where the release build lives.
pub fn release_dir() -> PathBuf {
    target_dir().join("release")
}

/// The front, `libfgpu.so`: the small C library that is preloaded (`LD_PRELOAD`,
/// `/etc/ld.so.preload`) and loads the shim on a process's first CUDA or NVML call.
pub fn front_path() -> PathBuf {
    let path = release_dir().join("libfgpu.so");
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// The shim proper, `libfgpu_shim.so` (the Rust library the front loads from its own
/// directory): what keeps the ledger and holds the caps. Never preloaded by itself.
pub fn shim_library_path() -> PathBuf {
    let path = release_dir().join("libfgpu_shim.so");
    assert!(path.exists(), "{} is missing: run `cargo build --release` first", path.display());
    path
}

/// The front of the build with crash points (`--features crash-points`, into target/crash;
/// tests/run.sh builds it), beside its shim: `FGPU_CRASH_AT=NAME` kills the process at
/// that point.
pub fn crash_front_path() -> PathBuf {
    let target = release_dir().parent().unwrap().join("crash/release/libfgpu.so");
    assert!(
        target.exists(),
        "{} is missing: run `cargo build --release -p fgpu-shim --features crash-points --target-dir target/crash` (tests/run.sh does)",
        target.display()
    );
    target
}

pub fn fgpu_bin() -> PathBuf {
    release_dir().join("fgpu")
}

/// A directory holding the simulated driver under the real sonames.
pub fn sim_lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = release_dir().join("sim-driver");
        std::fs::create_dir_all(&dir).unwrap();
        for (built, soname) in [("libfgpu_sim_cuda.so", "libcuda.so.1"), ("libfgpu_sim_nvml.so", "libnvidia-ml.so.1")] {
            let source = release_dir().join(built);
            assert!(source.exists(), "{} is missing: run `cargo build --release` first", source.display());
            let link = dir.join(soname);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&source, &link).unwrap();
            if soname == "libcuda.so.1" {
                let dev_link = dir.join("libcuda.so");
                let _ = std::fs::remove_file(&dev_link);
                std::os::unix::fs::symlink(&source, &dev_link).unwrap();
            }
        }
        dir
    })
    .clone()
}

/// Compiles `tests/clients/<name>.c` once per test run; `linked` links it against the
/// simulated libcuda instead of resolving at run time.
pub fn client(name: &str) -> PathBuf {
    client_with(name, &[])
}

pub fn client_with(name: &str, defines: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap();
    let suffix: String = defines.iter().map(|d| format!("-{}", d.to_lowercase())).collect();
    let out = release_dir().join("test-clients").join(format!("{name}{suffix}"));
    let source = workspace().join("tests/clients").join(format!("{name}.c"));
    if !built_after(&out, &source) {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-Wall", "-o"]).arg(&out).arg(&source);
        for d in defines {
            cc.arg(format!("-D{d}"));
        }
        if defines.contains(&"LINKED") {
            cc.arg(format!("-L{}", sim_lib_dir().display())).arg("-l:libcuda.so.1");
        }
        cc.args(["-ldl", "-lpthread"]);
        Cmd(cc).success();
    }
    out
}

/// Whether `out` exists and is newer than `source` and every header beside it (the
/// clients share `tests/clients/*.h`).
fn built_after(out: &Path, source: &Path) -> bool {
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let Some(built) = modified(out) else { return false };
    let headers =
        std::fs::read_dir(source.parent().unwrap()).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "h"));
    std::iter::once(source.to_path_buf()).chain(headers).all(|p| modified(&p).is_some_and(|m| m <= built))
}

/// Builds a helper shared library from `tests/clients/<name>.c`.
pub fn helper_library(name: &str) -> PathBuf {
    let out = release_dir().join("test-clients").join(format!("lib{name}.so"));
    let source = workspace().join("tests/clients").join(format!("{name}.c"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut cc = Command::new("cc");
    cc.args(["-O1", "-Wall", "-shared", "-fPIC", "-o"]).arg(&out).arg(&source).arg("-ldl");
    Cmd(cc).success();
    out
}

/// Copies of the front and the shim, the simulated driver and the test clients where every user can
/// reach them (a clone under a private home directory is not reachable by user 65534).
pub struct Reachable {
    pub dir: PathBuf,
    /// The front (`libfgpu.so`), with the shim beside it.
    pub front: PathBuf,
    pub sim_lib_dir: PathBuf,
}

pub fn reachable() -> &'static Reachable {
    static REACHABLE: OnceLock<Reachable> = OnceLock::new();
    REACHABLE.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        sweep_earlier_runs();
        let dir = std::env::temp_dir().join(format!("fgpu-it-reachable-{}", std::process::id()));
        let sim = dir.join("sim-driver");
        std::fs::create_dir_all(&sim).unwrap();
        let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        open(&dir, 0o755);
        open(&sim, 0o755);
        let front = dir.join("libfgpu.so");
        std::fs::copy(front_path(), &front).unwrap();
        open(&front, 0o755);
        // The shim proper, which the front loads from its own directory.
        let shim = dir.join("libfgpu_shim.so");
        std::fs::copy(shim_library_path(), &shim).unwrap();
        open(&shim, 0o755);
        for entry in std::fs::read_dir(sim_lib_dir()).unwrap() {
            let entry = entry.unwrap();
            let to = sim.join(entry.file_name());
            std::fs::copy(entry.path(), &to).unwrap();
            open(&to, 0o755);
        }
        Reachable { dir, front, sim_lib_dir: sim }
    })
}

/// A copy of a test client (see [`client`]) that every user can run.
pub fn reachable_client(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let to = reachable().dir.join(name);
    if !to.exists() {
        std::fs::copy(client(name), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    to
}

/// A copy of the `fgpu` binary that every user can run (beside the reachable front, which
/// it finds next to itself).
pub fn reachable_fgpu() -> PathBuf {
    let to = reachable().dir.join("fgpu");
    if !to.exists() {
        std::fs::copy(fgpu_bin(), &to).unwrap();
    }
    to
}

/// A free TCP port on the loopback address.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` over HTTP/1.0 with `Accept: accept`: the response's head and body.
pub fn http_get(port: u16, path: &str, accept: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\nAccept: {accept}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((head.to_string(), body.to_string()))
}

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

/// Removes what earlier test runs left in the temporary directory, once per run: this
/// run's shared directory (a static is never dropped) and the directories of tests that
/// failed (kept for a look, see [`Env`]'s drop), once the process that made them is gone.
/// `FGPU_TEST_KEEP=1` keeps them all.
fn sweep_earlier_runs() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if std::env::var_os("FGPU_TEST_KEEP").is_some() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("fgpu-it-") else { continue };
            let rest = rest.strip_prefix("reachable-").unwrap_or(rest);
            let digits = rest.split('-').next().unwrap_or_default();
            let Ok(pid) = digits.parse::<u32>() else { continue };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
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

/// A command whose failures print the command, its status, stdout and stderr.
pub struct Cmd(pub Command);

impl Cmd {
    /// Runs the command under fgpu: preloads the front, which loads the shim.
    pub fn shim(mut self) -> Self {
        self.0.env("LD_PRELOAD", front_path());
        self
    }

    pub fn limit(mut self, limit: &str) -> Self {
        self.0.env("FGPU_LIMIT", limit);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.0.env(key, value);
        self
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Self {
        self.0.arg(arg);
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        self.0.args(args);
        self
    }

    pub fn describe(&self) -> String {
        let envs: Vec<String> = self
            .0
            .get_envs()
            .filter(|(k, _)| k.to_string_lossy().starts_with("FGPU_") || *k == "LD_PRELOAD")
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.map(|v| v.to_string_lossy().into_owned()).unwrap_or_default()))
            .collect();
        format!("{} {:?} {:?}", envs.join(" "), self.0.get_program(), self.0.get_args().collect::<Vec<_>>())
    }

    pub fn run(mut self) -> Run {
        let description = self.describe();
        let output = self.0.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
        Run { description, output }
    }

    /// Runs and asserts a zero exit status.
    pub fn success(self) -> Run {
        let run = self.run();
        assert!(run.output.status.success(), "command failed\n{run}");
        run
    }

    /// Starts in the background with stdin piped (closing it ends a `hold`).
    pub fn spawn(mut self) -> Background {
        let description = self.describe();
        let mut child =
            self.0.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Background { description, child: Some(child), lines: Vec::new(), receiver }
    }
}

pub struct Run {
    pub description: String,
    pub output: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The first stdout line starting with `prefix`.
    pub fn line(&self, prefix: &str) -> String {
        self.stdout().lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line starting with {prefix:?}\n{self}")).to_string()
    }

    /// All stdout lines starting with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        self.stdout().lines().filter(|l| l.starts_with(prefix)).map(String::from).collect()
    }

    /// `key=value` from the first line starting with `prefix`.
    pub fn field(&self, prefix: &str, key: &str) -> String {
        field(&self.line(prefix), key).unwrap_or_else(|| panic!("no {key}= in {prefix:?}\n{self}"))
    }

    pub fn rc(&self, prefix: &str) -> i64 {
        self.field(prefix, "rc").parse().unwrap()
    }
}

pub fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).map(String::from)
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "command: {}\nstatus: {}\n--- stdout ---\n{}--- stderr ---\n{}", self.description, self.output.status, self.stdout(), self.stderr())
    }
}

/// A process running in the background; its stdout is read line by line by a thread.
pub struct Background {
    pub description: String,
    pub child: Option<Child>,
    pub lines: Vec<String>,
    receiver: std::sync::mpsc::Receiver<String>,
}

impl Background {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Reads stdout until a line starts with `prefix`; panics if the process ends first or
    /// nothing comes for 30 s.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            match self.receiver.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    self.lines.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => {
                    let out = self.finish();
                    panic!("{} did not print {prefix:?}\n{out}", out.description);
                }
            }
        }
    }

    /// Whether the process is still running: started, not finished, and not exited.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Panics, with the process's output, unless it is still running: for a test whose
    /// finding means nothing once the process it relies on (a holder, a neighbour, a job that
    /// must be waiting) has gone.
    #[track_caller]
    pub fn assert_running(&mut self, why: &str) {
        if !self.running() {
            let out = self.finish();
            panic!("{why}: the process ended\n{out}");
        }
    }

    /// The lines the process has printed so far, without waiting for more.
    pub fn lines_so_far(&mut self) -> &[String] {
        while let Ok(line) = self.receiver.try_recv() {
            self.lines.push(line);
        }
        &self.lines
    }

    /// Kills the process with `signal` and reaps it.
    pub fn kill(&mut self, signal: i32) {
        if let Some(child) = self.child.as_mut() {
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(child.id() as i32, signal) };
            let _ = child.wait();
        }
    }

    /// Closes stdin (ends a `hold`) and collects the output.
    pub fn finish(&mut self) -> Run {
        let mut child = self.child.take().expect("already finished");
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(line) = self.receiver.recv_timeout(Duration::from_millis(200)) {
            self.lines.push(line);
        }
        let mut stderr = Vec::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_end(&mut stderr);
        }
        let mut stdout = self.lines.join("\n").into_bytes();
        if !stdout.is_empty() {
            stdout.push(b'\n');
        }
        Run { description: self.description.clone(), output: Output { status, stdout, stderr } }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether the process `pid` is alive: it exists and is neither a zombie nor dead (a
/// zombie has ended and only waits for its parent to read its status).
pub fn process_alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X' | 'x'))
}

/// The state letter of `/proc/PID/stat` (R, S, D, T, Z, ...), if the process exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next())
}

/// Proves that a test's load happened before its absence of harm means anything: `done`
/// (connections held, requests answered, kernels run, bytes held) must be at least
/// `at_least`, the least the setup gives when it works. A test whose setup can fail
/// quietly (a flood whose connections are refused, a load that crashed) calls this before
/// asserting that nothing went wrong.
#[track_caller]
pub fn assert_load<T: PartialOrd + std::fmt::Display>(what: &str, done: T, at_least: T) {
    assert!(done >= at_least, "the test's load did not happen: {what}: {done}, the setup gives at least {at_least}");
}

/// The PID, in this namespace, of the first child of `pid` (the process `unshare --fork`
/// started, PID 1 of its new PID namespace), waiting up to 10 s for it to exist.
pub fn first_child(pid: u32) -> u32 {
    let mut found = 0;
    eventually("the process's child", Duration::from_secs(10), || {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        found = children.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
        found != 0
    });
    found
}

/// Waits until `condition` holds, polling; panics with `what` after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The Python of the test venv (FGPU_TEST_PYTHON, set by tests/run.sh), if it can import
/// `module`. Missing under CI is a failure; elsewhere the test prints why it skipped.
pub fn python_with(module: &str) -> Option<PathBuf> {
    let found = std::env::var_os("FGPU_TEST_PYTHON").map(PathBuf::from).or_else(|| {
        let venv = workspace().join(".venv/bin/python");
        venv.exists().then_some(venv)
    });
    let usable = found.filter(|p| Command::new(p).args(["-c", &format!("import {module}")]).output().map(|o| o.status.success()).unwrap_or(false));
    prerequisite(usable.is_some(), &format!("no Python with {module} (tests/run.sh creates .venv with it)"));
    usable
}

/// Whether the tests run under CI: `CI` set to anything but empty, `0`, `false` or `no`
/// (CI services set `CI=true`; `CI=false` is how one says "not CI").
pub fn under_ci() -> bool {
    ci_value_means_ci(std::env::var_os("CI").as_deref())
}

fn ci_value_means_ci(value: Option<&std::ffi::OsStr>) -> bool {
    let Some(value) = value else { return false };
    let value = value.to_string_lossy().trim().to_ascii_lowercase();
    !matches!(value.as_str(), "" | "0" | "false" | "no")
}

/// The one skip policy of the tests: whether a test's prerequisite (root, a tool, a file
/// tests/run.sh prepares) is there. Under CI ([`under_ci`]) a missing one is a failure: CI
/// runs as root and tests/run.sh installs every tool, so a test never passes there without
/// having run. Elsewhere the skip is counted ([`record_skip`]) and the caller skips the
/// test, or the part of it that needs the prerequisite (`if prerequisite(..) { .. }`).
/// Never skip any other way.
pub fn prerequisite(present: bool, what: &str) -> bool {
    if !present {
        assert!(!under_ci(), "missing under CI: {what} (CI runs as root; tests/run.sh installs the tools)");
        record_skip(what);
    }
    present
}

/// The variable naming the file every skip is written to, one line each (tests/run.sh sets
/// it, counts the lines in its summary, and fails under CI when there is any).
pub const SKIP_LOG_VAR: &str = "FGPU_TEST_SKIP_LOG";

/// Makes a skip visible and counted. cargo test captures what a passing test prints, so
/// the line `SKIPPED: <test>: <why>` goes to the process's own standard error, which the
/// capture does not take, and is appended to the file [`SKIP_LOG_VAR`] names, if any.
/// Called by [`prerequisite`]; a test never calls it itself.
fn record_skip(what: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("(a test)");
    let line = format!("SKIPPED: {test}: {}\n", what.replace('\n', " "));
    // Written whole in one call each, so lines of tests running at once do not interleave.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os(SKIP_LOG_VAR).filter(|p| !p.is_empty()) {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        let written = file.and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!("cannot record the skip in {SKIP_LOG_VAR}={}: {e}", Path::new(&log).display());
        }
    }
}

/// A path tests/run.sh provides through the variable `var` (a Python venv, a tool it
/// fetched), under [`prerequisite`]'s policy: `None` after saying why when it is not set.
pub fn provided_path(var: &str, what: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from);
    if let Some(path) = &path {
        assert!(path.exists(), "{var}={} does not exist", path.display());
    }
    prerequisite(path.is_some(), &format!("{var} is not set: {what} (tests/run.sh sets it)")).then_some(path).flatten()
}

/// Whether a program is on PATH.
pub fn tool(name: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {name} >/dev/null")]).status().map(|s| s.success()).unwrap_or(false)
}

/// Whether we run as root (namespace and mount tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// CPU-bound busy loops (`sh -c 'while :; do :; done'`), one per CPU this process may run
/// on unless told how many, running until dropped: a loaded host, as one where every core
/// is busy with data loading. Each is killed by its own PID.
pub struct BusyLoops {
    children: Vec<Child>,
}

impl BusyLoops {
    /// As many loops as CPUs this process may run on.
    pub fn one_per_cpu() -> BusyLoops {
        BusyLoops::start(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2))
    }

    pub fn start(n: usize) -> BusyLoops {
        let children = (0..n)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start a busy loop: {e}"))
            })
            .collect();
        BusyLoops { children }
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ci_means_a_true_value_of_ci() {
        let means = |v: Option<&str>| super::ci_value_means_ci(v.map(std::ffi::OsStr::new));
        for ci in ["true", "TRUE", "1", "yes", "github"] {
            assert!(means(Some(ci)), "{ci}");
        }
        for not in [None, Some(""), Some("false"), Some("False"), Some("0"), Some("no"), Some(" false ")] {
            assert!(!means(not), "{not:?}");
        }
    }

    /// tests/run.sh decides whether it runs under CI (skips fail, prerequisites must be
    /// there) by the same rule as the tests: `bash tests/run.sh --is-ci` agrees with
    /// `under_ci` on every value.
    #[test]
    fn run_sh_decides_ci_by_the_same_rule() {
        let script = super::workspace().join("tests/run.sh");
        for value in [None, Some(""), Some("true"), Some("TRUE"), Some("1"), Some("yes"), Some("github"), Some("false"), Some(" False "), Some("0"), Some("no")]
        {
            let mut bash = std::process::Command::new("bash");
            bash.arg(&script).arg("--is-ci");
            match value {
                Some(v) => bash.env("CI", v),
                None => bash.env_remove("CI"),
            };
            let status = bash.status().expect("bash");
            let tests_say = super::ci_value_means_ci(value.map(std::ffi::OsStr::new));
            assert_eq!(status.success(), tests_say, "CI={value:?}: tests/run.sh --is-ci exits {status}, the tests say {tests_say}");
        }
    }
}
