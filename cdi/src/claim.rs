//! One CDI device per Kubernetes ResourceClaim, for fgpu-kubelet-plugin: the claim's GPUs
//! capped at what the scheduler allocated (its consumed memory, and its compute share),
//! with a ledger of the claim's own.
//!
//! A claim's spec mounts, read-only, the same library and preload list as `fgpu cdi
//! generate`'s specs (written by [`crate::files::Payload::install`] under a directory of
//! the plugin's), and the claim's own configuration directory at
//! [`crate::CONTAINER_CONFIG_DIR`]. Its ledger is a host directory of the claim's own,
//! mounted read-write at [`crate::LEDGER_DIR`]: every container of every pod of the claim
//! mounts the same directory, so they share one ledger file. Its data is served (a sealed
//! memory file the plugin hands out on the socket [`LEDGER_SOCKET`], in the configuration
//! directory: `fgpu_core::ledger::served`), so that pods, which have IPC namespaces of
//! their own, share one cap. A tmpfs would be each container's own: each would get the
//! whole cap.

use crate::{bind, library_mounts, service_mount, Gpu, CDI_VERSION, CONTAINER_CONFIG_DIR, FILE_MOUNT_OPTIONS, GIB, KIND, LEDGER, LEDGER_DIR, MIB};
use fgpu_core::limit::format_bytes;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

/// The socket of the claim's ledger keeper, as the claim's containers see it (in the
/// configuration directory, mounted read-only: no process of the claim can replace it).
pub const LEDGER_SOCKET: &str = "/etc/fgpu/ledger.sock";

/// First line of every claim's `fgpu.conf`.
pub const CLAIM_HEADER: &str = "# Written by fgpu-kubelet-plugin";

/// The ledger directory is written by every process of the claim's containers, so it is
/// read-write; nothing in it is executed or a device.
const LEDGER_MOUNT_OPTIONS: [&str; 5] = ["rw", "nosuid", "nodev", "noexec", "bind"];

/// 100 % in the unit of [`ClaimCap::compute_millipercent`].
pub const WHOLE_COMPUTE: u64 = 100_000;

/// What a claim gives on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCap {
    pub gpu: Gpu,
    /// The memory cap in bytes.
    pub memory: u64,
    /// The compute share in thousandths of a percent (30 % is 30 000); `None`, 0 or
    /// [`WHOLE_COMPUTE`] and more: no ceiling.
    pub compute_millipercent: Option<u64>,
}

impl ClaimCap {
    /// The share to write, when it is a ceiling at all.
    fn compute(&self) -> Option<u64> {
        self.compute_millipercent.filter(|&m| m > 0 && m < WHOLE_COMPUTE)
    }
}

/// An amount of memory in fgpu.conf's limit syntax, exact to the byte.
fn limit_amount(bytes: u64) -> String {
    if bytes.is_multiple_of(GIB) {
        format!("{}G", bytes / GIB)
    } else if bytes.is_multiple_of(MIB) {
        format!("{}M", bytes / MIB)
    } else {
        format!("{bytes}B")
    }
}

/// A share in fgpu.conf's compute syntax: `30%`, `12.5%`.
fn percent_amount(millipercent: u64) -> String {
    let (whole, fraction) = (millipercent / 1000, millipercent % 1000);
    if fraction == 0 {
        format!("{whole}%")
    } else {
        format!("{whole}.{}%", format!("{fraction:03}").trim_end_matches('0'))
    }
}

/// The text of the claim's `/etc/fgpu/fgpu.conf`. `what` names the claim in the comment
/// (`the ResourceClaim default/train (uid ...)`). Like `fgpu cdi generate`'s devices, the
/// limit ends with `*=1`, so any other GPU the container is given gives nothing. `served`:
/// the ledger's data is served on [`LEDGER_SOCKET`] (claims prepared before served ledgers
/// keep a System V segment, which their running pods use).
pub fn config_text(what: &str, caps: &[ClaimCap], served: bool) -> String {
    let mut text = format!("{CLAIM_HEADER} for {what}.\n");
    let mut limits = Vec::new();
    let mut shares = Vec::new();
    for cap in caps {
        let share = match cap.compute() {
            Some(m) => format!(", at most {} of its time", percent_amount(m)),
            None => String::new(),
        };
        let _ = writeln!(text, "# {} on GPU {} ({}, {}){share}.", format_bytes(cap.memory), cap.gpu.index, cap.gpu.uuid, format_bytes(cap.gpu.total));
        limits.push(format!("{}={}", cap.gpu.uuid, limit_amount(cap.memory)));
        if let Some(m) = cap.compute() {
            shares.push(format!("{}={}", cap.gpu.uuid, percent_amount(m)));
        }
    }
    text.push_str("# *=1 (one byte): no memory on any other GPU the container is given.\n");
    limits.push("*=1".into());
    let _ = writeln!(text, "limit = {}", limits.join(","));
    if !shares.is_empty() {
        let _ = writeln!(text, "compute = {}", shares.join(","));
    }
    let _ = writeln!(text, "ledger = {LEDGER}");
    if served {
        text.push_str("# The ledger is shared by every pod of the claim: fgpu-kubelet-plugin serves it here.\n");
        let _ = writeln!(text, "ledger_socket = {LEDGER_SOCKET}");
    }
    text
}

/// Whether `name` is a valid CDI device name: letters, digits, `_`, `-`, `.` and `:`,
/// starting and ending with a letter or digit.
pub fn valid_device_name(name: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
    !name.is_empty()
        && name.chars().all(ok_char)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The spec of one claim's device `name` (kind [`KIND`]): the library and preload under
/// `library_dir`, the claim's `fgpu.conf` in `config_dir`, its ledger directory
/// `ledger_dir`, and `fgpu service`'s directory when there is one.
pub fn spec(name: &str, library_dir: &Path, config_dir: &Path, ledger_dir: &Path, service_dir: Option<&Path>) -> Value {
    let mut mounts = library_mounts(library_dir);
    mounts.extend(service_mount(service_dir));
    let device = json!({
        "name": name,
        "containerEdits": {
            "mounts": [
                bind(config_dir, CONTAINER_CONFIG_DIR, &FILE_MOUNT_OPTIONS),
                bind(ledger_dir, LEDGER_DIR, &LEDGER_MOUNT_OPTIONS),
            ]
        }
    });
    json!({ "cdiVersion": CDI_VERSION, "kind": KIND, "containerEdits": { "mounts": mounts }, "devices": [device] })
}

/// Adds to the claim's device (the only one of `spec`) the device nodes `nodes` (path in
/// the container, path on the host) and the environment `env` (`NAME=value`): a MIG
/// instance's `nvidia-caps` access nodes and the variables that select its MIG device.
pub fn add_device_edits(spec: &mut Value, nodes: &[(String, String)], env: &[String]) {
    let Some(edits) = spec["devices"].get_mut(0).and_then(|d| d.get_mut("containerEdits")).and_then(Value::as_object_mut) else { return };
    if !nodes.is_empty() {
        let list: Vec<Value> = nodes.iter().map(|(path, host)| json!({ "path": path, "hostPath": host })).collect();
        edits.insert("deviceNodes".into(), Value::Array(list));
    }
    if !env.is_empty() {
        edits.insert("env".into(), json!(env));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U0: &str = "GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505";
    const U1: &str = "GPU-11111111-2222-3333-4444-555555555555";

    fn cap(index: u32, uuid: &str, memory: u64, compute: Option<u64>) -> ClaimCap {
        ClaimCap { gpu: Gpu { index, uuid: uuid.into(), total: 80 * GIB }, memory, compute_millipercent: compute }
    }

    fn line<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.strip_prefix(key))
    }

    #[test]
    fn config_caps_memory_and_compute_by_uuid_and_nothing_elsewhere() {
        let text = config_text("the ResourceClaim default/train (uid 1234)", &[cap(0, U0, 8 * GIB, Some(30_000))], true);
        assert!(text.starts_with(CLAIM_HEADER), "{text}");
        assert_eq!(line(&text, "limit = "), Some(format!("{U0}=8G,*=1").as_str()), "{text}");
        assert_eq!(line(&text, "compute = "), Some(format!("{U0}=30%").as_str()), "{text}");
        assert_eq!(line(&text, "ledger = "), Some("/run/fgpu/ledger"));
        assert_eq!(line(&text, "ledger_socket = "), Some("/etc/fgpu/ledger.sock"));
        assert_eq!(line(&config_text("x", &[cap(0, U0, GIB, None)], false), "ledger_socket = "), None, "an earlier release's claim");
        // The socket is in the read-only configuration directory, under the keeper's name.
        assert_eq!(LEDGER_SOCKET, format!("{CONTAINER_CONFIG_DIR}/{}", fgpu_core::ledger::served::SOCKET_NAME));
        // As the shim reads it: 8 GiB and 30 % on GPU 0, one byte on any other GPU.
        let limit = fgpu_core::limit::parse_limit(line(&text, "limit = ").unwrap()).unwrap();
        assert_eq!(limit.cap_for(U0, 80 * GIB), Some(8 * GIB));
        assert_eq!(limit.cap_for(U1, 80 * GIB), Some(1));
        let share = fgpu_core::compute::parse_share(line(&text, "compute = ").unwrap()).unwrap();
        assert_eq!(share.share_for(U0), Some(300_000));
        assert_eq!(share.share_for(U1), None);
    }

    #[test]
    fn amounts_are_exact() {
        let text = config_text("x", &[cap(0, U0, 1536 * MIB, Some(12_500)), cap(1, U1, 8 * GIB + 1, None)], true);
        let limit = line(&text, "limit = ").unwrap();
        assert_eq!(limit, format!("{U0}=1536M,{U1}=8589934593B,*=1"));
        let parsed = fgpu_core::limit::parse_limit(limit).unwrap();
        assert_eq!(parsed.cap_for(U1, 80 * GIB), Some(8 * GIB + 1));
        let share = fgpu_core::compute::parse_share(line(&text, "compute = ").unwrap()).unwrap();
        assert_eq!(share.share_for(U0), Some(125_000));
    }

    #[test]
    fn no_share_zero_and_the_whole_gpu_set_no_ceiling() {
        for compute in [None, Some(0), Some(WHOLE_COMPUTE)] {
            let text = config_text("x", &[cap(0, U0, 8 * GIB, compute)], true);
            assert_eq!(line(&text, "compute = "), None, "{compute:?}: {text}");
        }
    }

    #[test]
    fn spec_mounts_the_claims_config_read_only_and_its_ledger_read_write() {
        let spec = spec(
            "claim-0b1f",
            Path::new("/var/lib/fgpu/dra"),
            Path::new("/var/lib/fgpu/dra/claims/0b1f/config"),
            Path::new("/var/lib/fgpu/dra/claims/0b1f/ledger"),
            Some(Path::new("/run/fgpu-service")),
        );
        assert_eq!(spec["kind"], "fgpu.io/gpu");
        assert_eq!(spec["cdiVersion"], "0.5.0");
        let shared: Vec<&str> = spec["containerEdits"]["mounts"].as_array().unwrap().iter().map(|m| m["containerPath"].as_str().unwrap()).collect();
        assert_eq!(shared, ["/usr/lib/fgpu", "/etc/ld.so.preload", "/run/fgpu-service"]);
        assert_eq!(spec["containerEdits"]["mounts"][0]["hostPath"], "/var/lib/fgpu/dra/lib");
        let device = &spec["devices"][0];
        assert_eq!(device["name"], "claim-0b1f");
        let mounts = device["containerEdits"]["mounts"].as_array().unwrap();
        assert_eq!(mounts[0]["containerPath"], "/etc/fgpu");
        assert_eq!(mounts[0]["hostPath"], "/var/lib/fgpu/dra/claims/0b1f/config");
        assert_eq!(mounts[0]["options"][0], "ro");
        assert_eq!(mounts[1]["containerPath"], "/run/fgpu");
        assert_eq!(mounts[1]["hostPath"], "/var/lib/fgpu/dra/claims/0b1f/ledger");
        assert_eq!(mounts[1]["options"][0], "rw");
        assert!(mounts.iter().all(|m| m["options"].as_array().unwrap().iter().any(|o| o == "nosuid")));
    }

    #[test]
    fn mig_edits_go_to_the_claims_device() {
        let mut s = spec("claim-1", Path::new("/l"), Path::new("/c"), Path::new("/g"), None);
        add_device_edits(
            &mut s,
            &[("/dev/nvidia-caps/nvidia-cap12".into(), "/host/dev/nvidia-caps/nvidia-cap12".into())],
            &["CUDA_VISIBLE_DEVICES=MIG-a".into()],
        );
        let edits = &s["devices"][0]["containerEdits"];
        assert_eq!(edits["deviceNodes"][0]["path"], "/dev/nvidia-caps/nvidia-cap12");
        assert_eq!(edits["deviceNodes"][0]["hostPath"], "/host/dev/nvidia-caps/nvidia-cap12");
        assert_eq!(edits["env"][0], "CUDA_VISIBLE_DEVICES=MIG-a");
        assert_eq!(edits["mounts"].as_array().unwrap().len(), 2, "the mounts stay");
        let mut plain = spec("claim-1", Path::new("/l"), Path::new("/c"), Path::new("/g"), None);
        add_device_edits(&mut plain, &[], &[]);
        assert!(plain["devices"][0]["containerEdits"].get("deviceNodes").is_none());
    }

    #[test]
    fn device_names() {
        assert!(valid_device_name("claim-8e2b7f0a-54c1-4c1b-9d68-2f1d0f7c3a11"));
        assert!(!valid_device_name("claim-"));
        assert!(!valid_device_name("claim/x"));
        assert!(!valid_device_name(""));
    }
}
