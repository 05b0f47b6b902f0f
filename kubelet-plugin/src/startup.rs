//! What the plugin checks as it starts: its flags' sizes, the fgpu command it ships, and
//! whether the memory flags leave any GPU of the node to publish.

use crate::inventory::Inventory;
use crate::quantity::{format_bytes, Quantity};
use crate::slices::MemoryPolicy;
use std::path::{Path, PathBuf};

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    Quantity::parse(text).map_err(|e| e.to_string())?.floor_units().ok_or_else(|| format!("{text:?} is negative"))
}

pub fn parse_step(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err("the step must be at least 1Mi".into()),
        b if b % (1 << 20) != 0 => Err(format!("{text:?} is not a whole number of Mi")),
        b => Ok(b),
    }
}

/// The fgpu command: `--fgpu`, else beside this binary, else on PATH.
pub fn find_fgpu(flag: Option<&Path>) -> Result<PathBuf, String> {
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

/// Flags that leave no GPU of a node that has some are refused: the plugin would publish
/// nothing.
pub fn check_policy(inventory: &Inventory, policy: &MemoryPolicy) -> Result<(), String> {
    if inventory.gpus.is_empty() || inventory.gpus.iter().any(|g| policy.refusal(g.total).is_none()) {
        return Ok(());
    }
    let largest = inventory.gpus.iter().map(|g| g.total).max().unwrap_or(0);
    Err(format!(
        "--memory-reserve {} and --memory-step {} leave no GPU to publish: the largest GPU here has {}, and a GPU needs at least --memory-reserve + 2 x --memory-step ({})",
        format_bytes(policy.reserve),
        format_bytes(policy.step),
        format_bytes(largest),
        format_bytes(policy.reserve.saturating_add(policy.step.saturating_mul(2)))
    ))
}
