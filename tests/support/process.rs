//! Commands whose failures show everything ([`Cmd`], [`Run`]), processes in the background
//! ([`Background`]), waiting ([`eventually`]), proof of load ([`assert_load`]) and a loaded
//! host ([`BusyLoops`]).

use crate::paths::front_path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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
