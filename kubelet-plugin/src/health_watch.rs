//! Runs `fgpu __nvml-events` (cli/src/nvml_events.rs) for as long as the plugin runs, and
//! hands each line it prints to the [`HealthMonitor`].
//!
//! NVML stays out of the plugin's process, as for the GPUs' inventory (`fgpu __driver-probe`):
//! the driver library is loaded, its event set waited on and its GPUs queried in the child
//! only. A child that exits, crashes or hangs (no line for [`HUNG`]; it prints `alive` every
//! 5 s) is killed if need be and started again, after 1 s, doubling up to 30 s while it keeps
//! failing; the GPUs' health turns Unknown once it has been down for
//! [`crate::health::HELPER_GRACE`]. NVML only delivers XIDs raised while an event set is
//! registered: one raised while the child is being restarted is not seen.

use crate::health::{unix_now, HealthMonitor};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A child that has said nothing for this long is taken for hung.
pub const HUNG: Duration = Duration::from_secs(20);
/// The first pause before a restart, and the longest.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// A child that ran this long is not failing: the next restart pauses [`FIRST_PAUSE`].
const SETTLED: Duration = Duration::from_secs(60);

/// Why the helper could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("the driver's library directory {} cannot go on LD_LIBRARY_PATH: {source}", dir.display())]
    LibraryPath { dir: PathBuf, source: std::env::JoinPathsError },
    #[error("cannot start {} __nvml-events: {source}", fgpu.display())]
    Spawn { fgpu: PathBuf, source: std::io::Error },
}

/// How to run the helper.
pub struct Helper {
    /// The `fgpu` command.
    pub fgpu: PathBuf,
    /// The driver root's library directory, first on the child's library path.
    pub library_dir: Option<PathBuf>,
}

impl Helper {
    fn command(&self) -> Result<tokio::process::Command, HelperError> {
        let mut command = tokio::process::Command::new(&self.fgpu);
        command.arg("__nvml-events").env_remove("LD_PRELOAD").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        if let Some(dir) = &self.library_dir {
            let mut paths = vec![dir.clone()];
            paths.extend(std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
            command.env("LD_LIBRARY_PATH", std::env::join_paths(paths).map_err(|source| HelperError::LibraryPath { dir: dir.clone(), source })?);
        }
        Ok(command)
    }

    /// One run of the child: why it ended.
    async fn run_once(&self, monitor: &HealthMonitor) -> String {
        let spawned = self.command().and_then(|mut c| c.spawn().map_err(|source| HelperError::Spawn { fgpu: self.fgpu.clone(), source }));
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return e.to_string(),
        };
        let pid = child.id().unwrap_or(0);
        monitor.helper_started(pid);
        crate::log(&format!("watching the GPUs' health through NVML's events (fgpu __nvml-events, pid {pid})"));
        let Some(stdout) = child.stdout.take() else { return "its output cannot be read".into() };
        let mut lines = BufReader::new(stdout).lines();
        let ended = loop {
            match tokio::time::timeout(HUNG, lines.next_line()).await {
                Ok(Ok(Some(line))) => match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(value) => {
                        if let Some(said) = monitor.apply(&value, unix_now()) {
                            crate::log(&said);
                        }
                    }
                    Err(_) => crate::log(&format!("fgpu __nvml-events printed something unexpected: {line:?}")),
                },
                Ok(Ok(None)) => break String::new(),
                Ok(Err(e)) => break format!("reading its output failed: {e}"),
                Err(_) => {
                    let _ = child.start_kill();
                    break format!("it said nothing for {} s and was killed", HUNG.as_secs());
                }
            }
        };
        let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                let _ = child.start_kill();
                "it did not exit".into()
            }
        };
        if ended.is_empty() {
            format!("it exited ({status})")
        } else {
            format!("{ended} ({status})")
        }
    }

    /// Runs the child again and again, for as long as the plugin runs.
    pub async fn run(self, monitor: Arc<HealthMonitor>) {
        let mut pause = FIRST_PAUSE;
        loop {
            let started = Instant::now();
            let why = self.run_once(&monitor).await;
            monitor.helper_stopped(&why);
            if started.elapsed() >= SETTLED {
                pause = FIRST_PAUSE;
            }
            crate::log(&format!("fgpu __nvml-events stopped: {why}; starting it again in {} s", pause.as_secs()));
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}
