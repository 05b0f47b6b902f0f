//! What the plugin checks as it starts: its flags' sizes, the fgpu command it ships, and
//! whether the memory flags leave any GPU of the node to publish.

use crate::api::ApiError;
use crate::inventory::Inventory;
use crate::quantity::{format_bytes, Quantity, QuantityError};
use crate::slices::MemoryPolicy;
use crate::{check, metrics_http, server, status};
use std::path::{Path, PathBuf};

/// A memory flag that is not a size the plugin can use.
#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    #[error(transparent)]
    NotAQuantity(#[from] QuantityError),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("the step must be at least 1Mi")]
    ZeroStep,
    #[error("{0:?} is not a whole number of Mi")]
    NotWholeMi(String),
}

/// Why the plugin could not start, or stopped, or a subcommand failed; each says what and why.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("--node-name (or NODE_NAME) is missing or empty")]
    NoNode,
    #[error("--fgpu {}: no such file", .0.display())]
    NoSuchFgpu(PathBuf),
    #[error("cannot find the fgpu command beside this binary or on PATH; install it beside fgpu-kubelet-plugin or pass --fgpu")]
    NoFgpu,
    #[error(transparent)]
    Shim(#[from] fgpu_cdi::shimpath::ShimError),
    #[error(transparent)]
    Files(#[from] fgpu_cdi::files::FileError),
    #[error("the probe failed: {0}")]
    ProbeTask(#[source] tokio::task::JoinError),
    /// What the GPUs' probe (or the search for NVML's directory) says.
    #[error("{0}")]
    Inventory(String),
    #[error(
        "--memory-reserve {} and --memory-step {} leave no GPU to publish: the largest GPU here has {}, and a GPU needs at least --memory-reserve + 2 x --memory-step ({})",
        format_bytes(policy.reserve),
        format_bytes(policy.step),
        format_bytes(*largest),
        format_bytes(policy.reserve.saturating_add(policy.step.saturating_mul(2)))
    )]
    NoGpuLeft { policy: MemoryPolicy, largest: u64 },
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("cannot create {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Socket(#[from] server::SocketError),
    /// What restoring the prepared claims from the checkpoint says.
    #[error("{0}")]
    Restore(String),
    #[error(transparent)]
    Metrics(#[from] metrics_http::ListenError),
    /// SIGTERM's handler could not be set up.
    #[error("{0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    Serve(#[from] server::ServeError),
    /// A server ended without an error while the plugin was running.
    #[error("the {0} service stopped")]
    Stopped(&'static str),
    #[error("{0}")]
    ServeTask(#[source] tokio::task::JoinError),
    #[error("check failed: {0}")]
    Check(#[from] check::CheckError),
    #[error(transparent)]
    Status(#[from] status::ReadError),
}

/// A size flag (`--memory-reserve`): a Kubernetes quantity of bytes, not negative.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    Quantity::parse(text)?.floor_units().ok_or_else(|| SizeError::Negative(text.to_string()))
}

/// `--memory-step`: a whole number of Mi, at least one.
pub fn parse_step(text: &str) -> Result<u64, SizeError> {
    match parse_bytes(text)? {
        0 => Err(SizeError::ZeroStep),
        b if b % (1 << 20) != 0 => Err(SizeError::NotWholeMi(text.to_string())),
        b => Ok(b),
    }
}

/// Why a server's task ended while the plugin was running (`service`: "DRA" or
/// "registration").
pub fn stopped_why(ended: Result<Result<(), server::ServeError>, tokio::task::JoinError>, service: &'static str) -> RunError {
    match ended {
        Err(e) => RunError::ServeTask(e),
        Ok(Err(e)) => e.into(),
        Ok(Ok(())) => RunError::Stopped(service),
    }
}

/// The fgpu command: `--fgpu`, else beside this binary, else on PATH.
pub fn find_fgpu(flag: Option<&Path>) -> Result<PathBuf, RunError> {
    if let Some(path) = flag {
        return if path.is_file() { Ok(path.to_path_buf()) } else { Err(RunError::NoSuchFgpu(path.to_path_buf())) };
    }
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("fgpu")));
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).map(|d| d.join("fgpu"));
    beside.into_iter().chain(on_path).find(|p| p.is_file()).ok_or(RunError::NoFgpu)
}

/// Flags that leave no GPU of a node that has some are refused: the plugin would publish
/// nothing.
pub fn check_policy(inventory: &Inventory, policy: &MemoryPolicy) -> Result<(), RunError> {
    if inventory.gpus.is_empty() || inventory.gpus.iter().any(|g| policy.refusal(g.total).is_none()) {
        return Ok(());
    }
    let largest = inventory.gpus.iter().map(|g| g.total).max().unwrap_or(0);
    Err(RunError::NoGpuLeft { policy: *policy, largest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::GpuInfo;

    const MI: u64 = 1 << 20;

    #[test]
    fn size_flags_say_what_is_wrong() {
        assert_eq!(parse_step("256Mi").unwrap(), 256 * MI);
        assert_eq!(parse_bytes("-1Mi").unwrap_err().to_string(), "\"-1Mi\" is negative");
        assert_eq!(parse_step("0").unwrap_err().to_string(), "the step must be at least 1Mi");
        assert_eq!(parse_step("1500Ki").unwrap_err().to_string(), "\"1500Ki\" is not a whole number of Mi");
        assert!(matches!(parse_bytes("12Qi"), Err(SizeError::NotAQuantity(_))));
    }

    #[test]
    fn a_policy_that_leaves_no_gpu_is_refused_with_the_figures() {
        let gpu = |total| GpuInfo { index: 0, uuid: "GPU-0".into(), product: "sim".into(), total };
        let policy = MemoryPolicy { reserve: 512 * MI, step: 40 << 30 };
        let small = Inventory { gpus: vec![gpu(16 << 30), gpu(24 << 30)], ..Default::default() };
        assert_eq!(
            check_policy(&small, &policy).unwrap_err().to_string(),
            "--memory-reserve 512Mi and --memory-step 40Gi leave no GPU to publish: the largest GPU here has 24Gi, and a GPU needs at least --memory-reserve + 2 x --memory-step (82432Mi)"
        );
        let big = Inventory { gpus: vec![gpu(16 << 30), gpu(96 << 30)], ..Default::default() };
        assert!(check_policy(&big, &policy).is_ok(), "one GPU is enough");
        assert!(check_policy(&Inventory::default(), &policy).is_ok(), "a node without GPUs publishes nothing anyway");
    }

    #[test]
    fn a_missing_fgpu_flag_names_the_path() {
        let missing = Path::new("/nonexistent/fgpu");
        assert_eq!(find_fgpu(Some(missing)).unwrap_err().to_string(), "--fgpu /nonexistent/fgpu: no such file");
    }
}
