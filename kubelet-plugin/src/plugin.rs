//! NodePrepareResources and NodeUnprepareResources: a claim's allocation becomes a CDI
//! device of fgpu's (kind `fgpu.io/gpu`, name `claim-<uid>`) that caps its GPUs at what the
//! scheduler allocated, beside NVIDIA's device for each GPU.
//!
//! For each claim the driver writes, under `--state-dir`:
//! - `claims/<uid>/config/fgpu.conf`: the caps (root-owned 0644, mounted read-only);
//! - `claims/<uid>/ledger/`: the claim's ledger directory, a 16 MiB tmpfs (mode 1777) where
//!   mounts are allowed, mounted read-write in every container of the claim;
//!
//! and `fgpu-claim-<uid>.json` under `--cdi-root`. The library and the preload list are
//! shared by all claims (`lib/`, `ld.so.preload`, written at start). The result is kept in
//! the checkpoint, so that preparing again answers the same, even after a restart, and the
//! files a reboot took are written again.
//!
//! **Sharing.** The containers of one pod share an IPC namespace, where the ledger's
//! shared memory lives, and mount the same ledger directory: they share one ledger and one
//! cap. Pods do not share an IPC namespace, and the ledger refuses processes of a second
//! IPC namespace while the first one's use it ("in use by processes of another IPC
//! namespace"): a claim reserved for several pods gives its cap to the pod whose processes
//! use the GPU first, and the others are refused GPU memory until they stop. No pod ever
//! gets the whole amount beside another.

use crate::api::{AllocationResult, Api, Claim};
use crate::checkpoint::{CapRecord, Checkpoint, DeviceRecord, PreparedClaim, Store};
use crate::nvidia::{self, NvidiaNames};
use crate::quantity::Quantity;
use crate::slices::{self, DriverInfo, GpuInfo, MemoryPolicy, COMPUTE, COMPUTE_WHOLE, DRIVER, MEMORY};
use fgpu_cdi::claim::{ClaimCap, WHOLE_COMPUTE};
use fgpu_cdi::files::{create_dir, prepare_dir, write_file};
use fgpu_cdi::Gpu;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use tokio::sync::Mutex;

/// Size of a claim's ledger tmpfs: the ledger's lock file is a few hundred bytes.
const LEDGER_TMPFS: &str = "size=16m,mode=1777";

pub struct Settings {
    pub node: String,
    pub cdi_root: PathBuf,
    /// Holds `lib/`, `ld.so.preload` and `claims/`.
    pub state_dir: PathBuf,
    pub checkpoint: PathBuf,
    pub nvidia: NvidiaNames,
    pub memory: MemoryPolicy,
    /// `fgpu service`'s directory, mounted when it exists.
    pub service_dir: PathBuf,
}

/// What the node has, as last probed.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub driver: DriverInfo,
}

pub struct Plugin {
    pub settings: Settings,
    api: Api,
    inventory: RwLock<Inventory>,
    store: Store,
    state: Mutex<Checkpoint>,
    warned_no_tmpfs: AtomicBool,
}

/// The CDI device name of a claim's device.
pub fn fgpu_device_name(uid: &str) -> String {
    format!("claim-{uid}")
}

/// A claim UID as kubelet passes it: lowercase letters, digits and `-` (it names files).
fn check_uid(uid: &str) -> Result<(), String> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| alnum(b) || b == b'-')
        && uid.bytes().next().is_some_and(alnum)
        && uid.bytes().last().is_some_and(alnum);
    if ok {
        Ok(())
    } else {
        Err(format!("claim UID {uid:?} is not a Kubernetes UID"))
    }
}

/// What a claim's allocation gives on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    /// One per GPU, by index.
    pub caps: Vec<CapRecord>,
    /// One per allocated device of this driver: (request, device name, GPU index).
    pub results: Vec<(String, String, u32)>,
}

fn consumed(result: &AllocationResult, name: &str) -> Result<Option<Quantity>, String> {
    let Some(value) = result.consumed_capacity.as_ref().and_then(|c| c.get(name)) else { return Ok(None) };
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(format!("consumed {name} {other} is not a quantity")),
    };
    Quantity::parse(&text).map(Some)
}

/// The caps of a claim's allocation on this node: each device of this driver must be a GPU
/// of this node's pool; its consumed memory is the cap (none consumed: the whole GPU, as on
/// a cluster without DRAConsumableCapacity, where the device is the claim's alone), its
/// consumed compute the share. Anything else is refused: the pod must not start uncapped.
pub fn plan(claim: &Claim, node: &str, gpus: &[GpuInfo]) -> Result<ClaimPlan, String> {
    let allocation = claim.status.allocation.as_ref().ok_or("it is not allocated")?;
    let mut caps: BTreeMap<u32, CapRecord> = BTreeMap::new();
    let mut results = Vec::new();
    let have = || gpus.iter().map(|g| slices::device_name(g.index)).collect::<Vec<_>>().join(", ");
    for r in allocation.devices.results.iter().filter(|r| r.driver == DRIVER) {
        let device = format!("{}/{}", r.pool, r.device);
        if r.pool != node {
            return Err(format!("device {device} is in pool {:?}, not this node's ({node:?})", r.pool));
        }
        let gpu = slices::device_index(&r.device)
            .and_then(|i| gpus.iter().find(|g| g.index == i))
            .ok_or_else(|| format!("device {device} is not on this node (it has {})", if gpus.is_empty() { "no GPU".into() } else { have() }))?;
        if let Some(other) = r.consumed_capacity.as_ref().and_then(|c| c.keys().find(|k| *k != MEMORY && *k != COMPUTE)) {
            return Err(format!("device {device}: consumed capacity {other:?} is not one this driver publishes"));
        }
        let memory = match consumed(r, MEMORY).map_err(|e| format!("device {device}: {e}"))? {
            Some(q) => q.floor_units().ok_or_else(|| format!("device {device}: negative memory"))?,
            None => gpu.total,
        };
        let compute = match consumed(r, COMPUTE).map_err(|e| format!("device {device}: {e}"))? {
            Some(q) => q.floor_milli().ok_or_else(|| format!("device {device}: negative compute"))?,
            None => 0,
        };
        if memory == 0 {
            return Err(format!("device {device}: the allocation consumes no memory"));
        }
        let cap = caps.entry(gpu.index).or_insert_with(|| CapRecord {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            total: gpu.total,
            memory: 0,
            compute_millipercent: Some(0),
        });
        cap.memory = cap.memory.saturating_add(memory);
        cap.compute_millipercent = cap.compute_millipercent.map(|c| c.saturating_add(compute));
        if cap.memory > gpu.total {
            return Err(format!("device {device}: the allocation consumes {} bytes of memory, more than the GPU's {}", cap.memory, gpu.total));
        }
        if cap.compute_millipercent.unwrap_or(0) > COMPUTE_WHOLE * 1000 {
            return Err(format!("device {device}: the allocation consumes more than {COMPUTE_WHOLE} compute"));
        }
        results.push((r.request.clone(), r.device.clone(), gpu.index));
    }
    Ok(ClaimPlan { caps: caps.into_values().collect(), results })
}

impl Plugin {
    pub fn new(settings: Settings, api: Api, inventory: Inventory) -> Plugin {
        let store = Store::new(settings.checkpoint.clone());
        let (checkpoint, problem) = store.load();
        if let Some(problem) = problem {
            crate::log(&problem);
        }
        Plugin { settings, api, inventory: RwLock::new(inventory), store, state: Mutex::new(checkpoint), warned_no_tmpfs: AtomicBool::new(false) }
    }

    pub fn api(&self) -> &Api {
        &self.api
    }

    pub fn inventory(&self) -> Inventory {
        self.inventory.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets what the node has; says whether it changed.
    pub fn set_inventory(&self, inventory: Inventory) -> bool {
        let mut current = self.inventory.write().unwrap_or_else(|e| e.into_inner());
        let changed = current.gpus != inventory.gpus || current.driver != inventory.driver;
        *current = inventory;
        changed
    }

    /// Writes again the files of every prepared claim (after a reboot, `/var/run/cdi` and
    /// the ledger mounts are gone, and kubelet does not prepare its claims again).
    /// Files of claims the checkpoint does not know (the plugin stopped between writing
    /// them and the checkpoint, or the checkpoint was set aside) are kept: a running pod may
    /// mount them, and its processes read the claim's fgpu.conf whenever they start, so
    /// removing it would leave them uncapped. kubelet's NodeUnprepareResources removes them.
    pub async fn restore(&self) {
        let state = self.state.lock().await;
        let unknown: Vec<String> = self.claims_on_disk().into_iter().filter(|uid| !state.claims.contains_key(uid)).collect();
        if !unknown.is_empty() {
            crate::log(&format!(
                "files of {} claim{} not in the checkpoint are kept until kubelet unprepares them: {}",
                unknown.len(),
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(" ")
            ));
        }
        for (uid, claim) in &state.claims {
            if let Err(e) = self.write_claim_files(uid, claim) {
                crate::log(&format!("cannot restore the files of claim {}/{} ({uid}): {e}", claim.namespace, claim.name));
            }
        }
        if !state.claims.is_empty() {
            crate::log(&format!("{} prepared claim{} in {}", state.claims.len(), if state.claims.len() == 1 { "" } else { "s" }, self.store.path().display()));
        }
    }

    /// NodePrepareResources for one claim: its devices, or why it cannot be prepared.
    pub async fn prepare(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<DeviceRecord>, String> {
        check_uid(uid)?;
        let what = format!("ResourceClaim {namespace}/{name}");
        let mut state = self.state.lock().await;
        if let Some(done) = state.claims.get(uid) {
            self.write_claim_files(uid, done).map_err(|e| format!("{what}: {e}"))?;
            return Ok(done.devices.clone());
        }
        let claim = self.api.claim(namespace, name).await.map_err(|e| format!("cannot read {what}: {e}"))?.ok_or_else(|| format!("{what} does not exist"))?;
        if claim.metadata.uid != uid {
            return Err(format!("{what} has UID {:?}, not {uid:?}: it was deleted and created again", claim.metadata.uid));
        }
        let inventory = self.inventory();
        let plan = plan(&claim, &self.settings.node, &inventory.gpus).map_err(|e| format!("{what}: {e}"))?;
        let fgpu_id = format!("{}={}", fgpu_cdi::KIND, fgpu_device_name(uid));
        let mut nvidia_ids: BTreeMap<u32, String> = BTreeMap::new();
        for cap in &plan.caps {
            let id = nvidia::device_id(&self.settings.nvidia, cap.index, &cap.uuid).map_err(|e| format!("{what}: {e}"))?;
            nvidia_ids.insert(cap.index, id);
        }
        let devices = plan
            .results
            .iter()
            .map(|(request, device, index)| DeviceRecord {
                requests: vec![request.clone()],
                pool: self.settings.node.clone(),
                device: device.clone(),
                cdi_ids: vec![nvidia_ids[index].clone(), fgpu_id.clone()],
            })
            .collect();
        let record = PreparedClaim { namespace: namespace.into(), name: name.into(), caps: plan.caps, devices };
        // On a failure the files written so far stay: kubelet prepares the claim again, and
        // they may be a running pod's (written before a checkpoint that was lost), whose
        // processes read the claim's fgpu.conf when they start.
        self.write_claim_files(uid, &record).map_err(|e| format!("{what}: {e}"))?;
        state.claims.insert(uid.to_string(), record.clone());
        if let Err(e) = self.store.save(&state) {
            state.claims.remove(uid);
            return Err(format!("{what}: {e}"));
        }
        let pods: Vec<&str> = claim.status.reserved_for.iter().filter(|c| c.resource == "pods").map(|c| c.name.as_str()).collect();
        if pods.len() > 1 {
            crate::log(&format!(
                "{what} is reserved for {} pods ({}): they share one cap, and while one pod's processes use the GPU the others are refused GPU memory (docs/kubernetes.md, Sharing a claim)",
                pods.len(),
                pods.join(", ")
            ));
        }
        let caps: Vec<String> =
            record.caps.iter().map(|c| format!("GPU {} {}{}", c.index, crate::quantity::format_bytes(c.memory), share_text(c.compute_millipercent))).collect();
        crate::log(&format!("prepared {what} ({uid}): {}", caps.join(", ")));
        Ok(record.devices)
    }

    /// NodeUnprepareResources for one claim: its spec, its files and its checkpoint entry
    /// go. A claim this driver does not know is already unprepared.
    pub async fn unprepare(&self, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        check_uid(uid)?;
        let mut state = self.state.lock().await;
        self.remove_claim_files(uid).map_err(|e| format!("ResourceClaim {namespace}/{name}: {e}"))?;
        if state.claims.remove(uid).is_some() {
            self.store.save(&state).map_err(|e| format!("ResourceClaim {namespace}/{name}: {e}"))?;
            crate::log(&format!("unprepared ResourceClaim {namespace}/{name} ({uid})"));
        }
        Ok(())
    }

    /// The UIDs of the claims whose spec or directory this plugin's files hold.
    fn claims_on_disk(&self) -> Vec<String> {
        let names = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()).unwrap_or_default()
        };
        let mut uids: Vec<String> = names(&self.settings.cdi_root)
            .iter()
            .filter_map(|n| n.strip_prefix("fgpu-claim-")?.strip_suffix(".json").map(str::to_string))
            .chain(names(&self.settings.state_dir.join("claims")))
            .filter(|uid| check_uid(uid).is_ok())
            .collect();
        uids.sort();
        uids.dedup();
        uids
    }

    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.settings.state_dir.join("claims").join(uid)
    }

    /// The claim's spec file.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.settings.cdi_root.join(format!("fgpu-claim-{uid}.json"))
    }

    fn write_claim_files(&self, uid: &str, claim: &PreparedClaim) -> Result<(), String> {
        let dir = self.claim_dir(uid);
        prepare_dir(&self.settings.state_dir.join("claims"), None)?;
        prepare_dir(&dir, None)?;
        let config_dir = dir.join("config");
        prepare_dir(&config_dir, None)?;
        let caps: Vec<ClaimCap> = claim
            .caps
            .iter()
            .map(|c| ClaimCap {
                gpu: Gpu { index: c.index, uuid: c.uuid.clone(), total: c.total },
                memory: c.memory,
                compute_millipercent: c.compute_millipercent,
            })
            .collect();
        let what = format!("the ResourceClaim {}/{} (uid {uid})", claim.namespace, claim.name);
        write_file(&config_dir.join(fgpu_cdi::CONFIG_FILE), fgpu_cdi::claim::config_text(&what, &caps).as_bytes(), 0o644, None)?;
        let ledger_dir = dir.join("ledger");
        self.ledger_dir(&ledger_dir)?;
        let service = self.settings.service_dir.is_dir().then_some(self.settings.service_dir.as_path());
        let spec = fgpu_cdi::claim::spec(&fgpu_device_name(uid), &self.settings.state_dir, &config_dir, &ledger_dir, service);
        create_dir(&self.settings.cdi_root)?;
        let text = serde_json::to_string_pretty(&spec).expect("a spec serialises") + "\n";
        write_file(&self.spec_path(uid), text.as_bytes(), 0o644, None)
    }

    /// The claim's ledger directory: a tmpfs of its own where this process may mount one,
    /// else a plain directory; either way writable by every user, sticky.
    fn ledger_dir(&self, dir: &Path) -> Result<(), String> {
        create_dir(dir)?;
        if is_mount_point(dir) {
            return Ok(());
        }
        match mount_tmpfs(dir) {
            Ok(()) => return Ok(()),
            Err(e) => {
                if !self.warned_no_tmpfs.swap(true, Ordering::Relaxed) {
                    crate::log(&format!(
                        "cannot mount a tmpfs for a claim's ledger ({e}): the ledger directories are plain directories of {}, not limited in size",
                        self.settings.state_dir.display()
                    ));
                }
            }
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(|e| format!("cannot chmod {}: {e}", dir.display()))
    }

    fn remove_claim_files(&self, uid: &str) -> Result<(), String> {
        let spec = self.spec_path(uid);
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", spec.display())),
        }
        let dir = self.claim_dir(uid);
        let ledger = dir.join("ledger");
        if is_mount_point(&ledger) {
            unmount(&ledger)?;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
        }
    }
}

fn share_text(compute: Option<u64>) -> String {
    match compute.filter(|&c| c > 0 && c < WHOLE_COMPUTE) {
        Some(c) if c % 1000 == 0 => format!(" and {}% of its time", c / 1000),
        Some(c) => format!(" and {:.3}% of its time", c as f64 / 1000.0),
        None => String::new(),
    }
}

/// Whether `dir` is a mount point: another file system than its parent's.
fn is_mount_point(dir: &Path) -> bool {
    let (Ok(this), Some(Ok(parent))) = (std::fs::symlink_metadata(dir), dir.parent().map(std::fs::symlink_metadata)) else { return false };
    this.is_dir() && this.dev() != parent.dev()
}

fn c_path(path: &Path) -> Result<std::ffi::CString, String> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", path.display()))
}

fn mount_tmpfs(dir: &Path) -> Result<(), String> {
    let target = c_path(dir)?;
    let options = std::ffi::CString::new(LEDGER_TMPFS).expect("no NUL");
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(c"fgpu-ledger".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, options.as_ptr().cast())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

fn unmount(dir: &Path) -> Result<(), String> {
    let target = c_path(dir)?;
    // SAFETY: umount2(2) with a NUL-terminated path that outlives the call. MNT_DETACH:
    // a process still inside (none should be, once kubelet unprepares) keeps it alive.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("cannot unmount {}: {}", dir.display(), std::io::Error::last_os_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AllocatedDevices, Allocation, ClaimStatus};

    const GIB: u64 = 1 << 30;

    fn gpus() -> Vec<GpuInfo> {
        (0..2).map(|i| GpuInfo { index: i, uuid: format!("GPU-{i}"), product: "H100".into(), total: 80 * GIB }).collect()
    }

    fn result(device: &str, consumed: &[(&str, serde_json::Value)]) -> AllocationResult {
        AllocationResult {
            request: "gpu".into(),
            driver: DRIVER.into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: Some("s".into()),
            consumed_capacity: (!consumed.is_empty()).then(|| consumed.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()),
        }
    }

    fn claim(results: Vec<AllocationResult>) -> Claim {
        Claim { status: ClaimStatus { allocation: Some(Allocation { devices: AllocatedDevices { results } }), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn consumed_memory_and_compute_are_the_caps() {
        let c = claim(vec![result("gpu-1", &[("memory", "8Gi".into()), ("compute", "30".into())])]);
        let p = plan(&c, "node-a", &gpus()).unwrap();
        assert_eq!(p.caps, [CapRecord { index: 1, uuid: "GPU-1".into(), total: 80 * GIB, memory: 8 * GIB, compute_millipercent: Some(30_000) }]);
        assert_eq!(p.results, [("gpu".to_string(), "gpu-1".to_string(), 1)]);
    }

    #[test]
    fn no_consumed_capacity_is_the_whole_gpu() {
        let p = plan(&claim(vec![result("gpu-0", &[])]), "node-a", &gpus()).unwrap();
        assert_eq!((p.caps[0].memory, p.caps[0].compute_millipercent), (80 * GIB, Some(0)));
    }

    #[test]
    fn two_shares_of_one_gpu_in_one_claim_add_up() {
        let mut second = result("gpu-0", &[("memory", "2Gi".into()), ("compute", 10.into())]);
        second.request = "aux".into();
        let c = claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("compute", "30".into())]), second]);
        let p = plan(&c, "node-a", &gpus()).unwrap();
        assert_eq!((p.caps.len(), p.caps[0].memory, p.caps[0].compute_millipercent), (1, 10 * GIB, Some(40_000)));
        assert_eq!(p.results.len(), 2);
    }

    #[test]
    fn other_drivers_are_left_to_them() {
        let mut other = result("gpu-9", &[]);
        other.driver = "gpu.nvidia.com".into();
        let p = plan(&claim(vec![other]), "node-a", &gpus()).unwrap();
        assert!(p.caps.is_empty() && p.results.is_empty());
    }

    #[test]
    fn what_this_node_cannot_honour_is_refused() {
        let err = |c: Claim| plan(&c, "node-a", &gpus()).unwrap_err();
        assert!(err(claim(vec![result("gpu-7", &[])])).contains("gpu-7 is not on this node (it has gpu-0, gpu-1)"));
        assert!(err(claim(vec![result("mig-0", &[])])).contains("not on this node"));
        let mut elsewhere = result("gpu-0", &[]);
        elsewhere.pool = "node-b".into();
        assert!(err(claim(vec![elsewhere])).contains("not this node's"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "81Gi".into())])])).contains("more than the GPU"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "0".into())])])).contains("no memory"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("compute", "101".into())])])).contains("more than 100"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "8Gi".into()), ("cores", "4".into())])])).contains("\"cores\""));
        assert!(err(claim(vec![result("gpu-0", &[("memory", "eight".into())])])).contains("not a Kubernetes quantity"));
        assert!(err(claim(vec![result("gpu-0", &[("memory", serde_json::json!([1]))])])).contains("not a quantity"));
        assert!(err(Claim::default()).contains("not allocated"));
    }

    #[test]
    fn uids_name_files_safely() {
        assert!(check_uid("8e2b7f0a-54c1-4c1b-9d68-2f1d0f7c3a11").is_ok());
        for bad in ["", "../x", "a/b", "A", "-a", "a b", &"a".repeat(129)] {
            assert!(check_uid(bad).is_err(), "{bad}");
        }
    }
}
