//! NodePrepareResources and NodeUnprepareResources: a claim's allocation ([`crate::plan`])
//! becomes a CDI device of fgpu's (kind `fgpu.io/gpu`, name `claim-<uid>`) that caps its
//! GPUs at what the scheduler allocated, beside NVIDIA's device for each GPU; its files are
//! [`crate::claimfiles`]'s. The result is kept in the checkpoint, so that preparing again
//! answers the same, even after a restart, and the files a reboot took are written again.
//!
//! **Concurrency.** kubelet prepares the claims of different pods at once, each call with a
//! 45 s deadline. The one lock (the prepared claims) is never held across a call to the API
//! server: a claim is read first, then the lock is taken to check the node's account
//! ([`crate::capacity`]), write the claim's files and the checkpoint, all local.
//!
//! **Sharing.** Every container of every pod of a claim mounts the claim's ledger
//! directory and its configuration directory, where the plugin keeps the claim's ledger
//! (`fgpu_core::ledger::keeper`, run by [`crate::claimfiles`]): a sealed memory file handed
//! to each process over a socket, so that pods, which have IPC namespaces of their own,
//! share one cap and one compute share. A restarted plugin takes the ledger in use over from
//! the claim's processes, or refuses new ones until it can; it never hands them a fresh one.
//!
//! **MIG partitions.** A device that is a MIG partition ([`crate::partitions`]) is an
//! instance created at prepare ([`crate::mig`]) at the allocated placement, or shared with
//! the claims that hold it already (a partition allocated to several claims, each with its
//! consumed capacity). The fgpu command that creates or destroys an instance is a child
//! process awaited on tokio's process driver, so no runtime worker waits on it; the state
//! lock (an async mutex) is held across that wait, so two prepares of one partition never
//! both create it (the second finds the first's instance held, and shares it), an unprepare
//! never destroys an instance a prepare is about to take, and the other calls wait their
//! turn (a create takes well under a second). Each prepare and unprepare runs in a task of
//! its own, so a call kubelet gives up on never stops between two steps. The steps are checkpointed ([`crate::checkpoint::Preparing`]): the
//! intent, each instance created, the claim prepared; a failure at any step destroys what
//! this prepare created. Unpreparing the last claim that holds an instance destroys it; a
//! process still on it (`NVML_ERROR_IN_USE`) is an error kubelet retries, the claim staying
//! prepared. At start, instances of the plugin's own record that no prepared claim holds
//! are destroyed, half-done prepares undone, and the instances of prepared claims that a
//! reboot or a GPU reset took made again, or their claims failed closed ([`remake`]).

use crate::api::Api;
use crate::capacity;
use crate::checkpoint::{Checkpoint, DeviceRecord, PreparedClaim, Store};
use crate::claimfiles::{check_uid, fgpu_device_name, ClaimFiles, ClaimFilesError};
use crate::inventory::Inventory;
use crate::mig::MigTool;
use crate::nvidia::{self, NvidiaNames};
use crate::plan;
use crate::slices::MemoryPolicy;
use crate::status::Status;
use fgpu_cdi::claim::WHOLE_COMPUTE;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::Mutex;

mod error;
mod instances;
mod remake;

pub use error::{ClaimError, InstanceError, StepError};

pub struct Settings {
    pub node: String,
    pub checkpoint: PathBuf,
    pub nvidia: NvidiaNames,
    pub memory: MemoryPolicy,
    /// Creating and destroying the instances of MIG partitions.
    pub mig: MigTool,
}

pub struct Plugin {
    pub settings: Settings,
    api: Arc<Api>,
    files: ClaimFiles,
    inventory: RwLock<Inventory>,
    store: Store,
    state: Mutex<Checkpoint>,
    status: Arc<Status>,
}

impl Plugin {
    pub fn new(settings: Settings, api: Arc<Api>, files: ClaimFiles, inventory: Inventory, status: Arc<Status>) -> Plugin {
        let store = Store::new(settings.checkpoint.clone());
        let (checkpoint, problem) = store.load();
        if let Some(problem) = problem {
            crate::log(&problem);
        }
        Plugin { settings, api, files, inventory: RwLock::new(inventory), store, state: Mutex::new(checkpoint), status }
    }

    pub fn inventory(&self) -> Inventory {
        self.inventory.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets what the node has; says whether it changed.
    pub fn set_inventory(&self, inventory: Inventory) -> bool {
        let mut current = self.inventory.write().unwrap_or_else(|e| e.into_inner());
        let changed = *current != inventory;
        *current = inventory;
        changed
    }

    fn show(&self, state: &Checkpoint) {
        let usage = capacity::usage(&state.claims, &self.settings.memory);
        self.status.update(|s| s.gpus = usage);
    }

    /// Writes again the files of every prepared claim (after a reboot, `/var/run/cdi` and
    /// the ledger mounts are gone, and kubelet does not prepare its claims again), and sets
    /// the claims' directories private. Files of claims the checkpoint does not know (the
    /// plugin stopped between writing them and the checkpoint, or the checkpoint was set
    /// aside) are kept: a running pod may mount them, and its processes read the claim's
    /// fgpu.conf whenever they start, so removing it would leave them uncapped. kubelet's
    /// NodeUnprepareResources removes them.
    pub async fn restore(&self) -> Result<(), ClaimFilesError> {
        self.files.make_private()?;
        let state = self.state.lock().await;
        let unknown: Vec<String> = self.files.claims_on_disk().into_iter().filter(|uid| !state.claims.contains_key(uid)).collect();
        if !unknown.is_empty() {
            crate::log(&format!(
                "files of {} claim{} not in the checkpoint are kept until kubelet unprepares them: {}",
                unknown.len(),
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(" ")
            ));
        }
        for (uid, claim) in &state.claims {
            if state.lost.contains_key(uid) {
                self.remove_spec(uid);
                continue;
            }
            if let Err(e) = self.files.write(uid, claim) {
                crate::log(&format!("cannot restore the files of claim {}/{} ({uid}): {e}", claim.namespace, claim.name));
            }
        }
        if !state.claims.is_empty() {
            crate::log(&format!("{} prepared claim{} in {}", state.claims.len(), if state.claims.len() == 1 { "" } else { "s" }, self.store.path().display()));
        }
        self.show(&state);
        Ok(())
    }

    /// Unprepares the claims whose ResourceClaim is gone (deleted while the plugin was down,
    /// so that kubelet had no one to ask): only where the API server says so, a 404 or a
    /// claim of the same name with another UID; a claim that cannot be read is kept.
    pub async fn forget_deleted_claims(&self) {
        let known: Vec<(String, String, String)> = {
            let state = self.state.lock().await;
            state.claims.iter().map(|(uid, c)| (uid.clone(), c.namespace.clone(), c.name.clone())).collect()
        };
        for (uid, namespace, name) in known {
            let gone = match self.api.claim(&namespace, &name).await {
                Ok(None) => format!("ResourceClaim {namespace}/{name} no longer exists"),
                Ok(Some(c)) if c.metadata.uid != uid => format!("ResourceClaim {namespace}/{name} is another claim now (UID {})", c.metadata.uid),
                Ok(Some(_)) => continue,
                Err(e) => {
                    crate::log(&format!("cannot check whether ResourceClaim {namespace}/{name} ({uid}) still exists ({e}): it stays prepared"));
                    continue;
                }
            };
            match self.unprepare_claim(&namespace, &name, &uid).await {
                Ok(()) => crate::log(&format!("{gone}: its files are removed ({uid})")),
                Err(e) => crate::log(&format!("{gone}, but its files cannot be removed: {e}")),
            }
        }
    }

    /// NodePrepareResources for one claim, in a task of its own: kubelet giving up on the
    /// call (its deadline) drops the caller, never the steps between two checkpoints.
    pub async fn prepare(self: &Arc<Self>, namespace: &str, name: &str, uid: &str) -> Result<Vec<DeviceRecord>, ClaimError> {
        let (this, namespace, name, uid) = (self.clone(), namespace.to_string(), name.to_string(), uid.to_string());
        tokio::spawn(async move { this.prepare_claim(&namespace, &name, &uid).await }).await.map_err(ClaimError::PrepareTask)?
    }

    /// NodeUnprepareResources for one claim, in a task of its own (as [`Plugin::prepare`]).
    pub async fn unprepare(self: &Arc<Self>, namespace: &str, name: &str, uid: &str) -> Result<(), ClaimError> {
        let (this, namespace, name, uid) = (self.clone(), namespace.to_string(), name.to_string(), uid.to_string());
        tokio::spawn(async move { this.unprepare_claim(&namespace, &name, &uid).await }).await.map_err(ClaimError::UnprepareTask)?
    }

    /// NodePrepareResources for one claim: its devices, or why it cannot be prepared.
    async fn prepare_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<DeviceRecord>, ClaimError> {
        check_uid(uid).map_err(ClaimError::Uid)?;
        let what = format!("ResourceClaim {namespace}/{name}");
        {
            let state = self.state.lock().await;
            if let Some(why) = state.lost.get(uid) {
                return Err(ClaimError::step(&what, StepError::Lost(why.clone())));
            }
            if let Some(done) = state.claims.get(uid) {
                self.files.write(uid, done).map_err(|e| ClaimError::step(&what, e))?;
                return Ok(done.devices.clone());
            }
        }
        // Read without the lock: other claims are prepared meanwhile.
        let claim = self
            .api
            .claim(namespace, name)
            .await
            .map_err(|source| ClaimError::Read { what: what.clone(), source })?
            .ok_or_else(|| ClaimError::Missing { what: what.clone() })?;
        if claim.metadata.uid != uid {
            return Err(ClaimError::Recreated { what, found: claim.metadata.uid.clone(), uid: uid.to_string() });
        }
        let inventory = self.inventory();
        let plan = plan::plan(&claim, &self.settings.node, &inventory.gpus, &inventory.mig).map_err(|e| ClaimError::step(&what, e))?;
        let fgpu_id = plan.capped().then(|| format!("{}={}", fgpu_cdi::KIND, fgpu_device_name(uid)));
        let mut nvidia_ids: BTreeMap<u32, String> = BTreeMap::new();
        let parents = plan.partitions.iter().map(|p| (p.partition.gpu_index, &p.partition.gpu_uuid));
        for (index, uuid) in plan.caps.iter().map(|c| (c.index, &c.uuid)).chain(parents) {
            let id = nvidia::device_id(&self.settings.nvidia, index, uuid).map_err(|e| ClaimError::step(&what, e))?;
            nvidia_ids.insert(index, id);
        }
        let record_device = |request: &str, device: String, index: u32, share_id: &Option<String>| DeviceRecord {
            requests: vec![request.to_string()],
            pool: self.settings.node.clone(),
            device,
            cdi_ids: std::iter::once(nvidia_ids[&index].clone()).chain(fgpu_id.clone()).collect(),
            share_id: share_id.clone(),
        };
        let mut devices: Vec<DeviceRecord> = plan.devices.iter().map(|d| record_device(&d.request, d.device.clone(), d.index, &d.share_id)).collect();
        devices.extend(plan.partitions.iter().map(|p| record_device(&p.request, p.partition.device_name(), p.partition.gpu_index, &p.share_id)));
        let mut record = PreparedClaim { namespace: namespace.into(), name: name.into(), caps: plan.caps, devices, served_ledger: true, mig: Vec::new() };

        let mut state = self.state.lock().await;
        if let Some(done) = state.claims.get(uid) {
            // Prepared meanwhile by a call for another pod of the claim.
            return Ok(done.devices.clone());
        }
        if !plan.partitions.is_empty() {
            self.take_instances(&mut state, uid, &what, &plan.partitions, &mut record).await?;
        }
        if let Err(e) = self.finish(&mut state, uid, &record) {
            if !plan.partitions.is_empty() {
                self.roll_back(&mut state, uid, &what).await;
            }
            return Err(ClaimError::step(&what, e));
        }
        self.show(&state);
        drop(state);

        let pods: Vec<&str> = claim.status.reserved_for.iter().filter(|c| c.resource == "pods").map(|c| c.name.as_str()).collect();
        if pods.len() > 1 && record.caps.iter().any(|c| !c.admin) {
            crate::log(&format!("{what} is reserved for {} pods ({}): they share its cap and its compute share", pods.len(), pods.join(", ")));
        }
        let caps: Vec<String> = record
            .caps
            .iter()
            .map(|c| {
                if c.admin {
                    format!("GPU {} whole, with admin access", c.index)
                } else if c.uuid.starts_with("MIG-") {
                    format!("{} of MIG device {} on GPU {}{}", crate::quantity::format_bytes(c.memory), c.uuid, c.index, share_text(c.compute_millipercent))
                } else {
                    format!("GPU {} {}{}", c.index, crate::quantity::format_bytes(c.memory), share_text(c.compute_millipercent))
                }
            })
            .collect();
        crate::log(&format!("prepared {what} ({uid}): {}", caps.join(", ")));
        Ok(record.devices)
    }

    /// The last step of a prepare: the node's account checked, the files written, the claim
    /// prepared in the checkpoint. On a failure the files written so far stay (for a claim
    /// on whole GPUs: kubelet prepares it again, and they may be a running pod's, written
    /// before a checkpoint that was lost, whose processes read the claim's fgpu.conf).
    fn finish(&self, state: &mut Checkpoint, uid: &str, record: &PreparedClaim) -> Result<(), StepError> {
        capacity::check(&state.claims, uid, record, &self.settings.memory)?;
        self.files.write(uid, record)?;
        let preparing = state.preparing.remove(uid);
        state.claims.insert(uid.to_string(), record.clone());
        if let Err(e) = self.store.save(state) {
            state.claims.remove(uid);
            if let Some(p) = preparing {
                state.preparing.insert(uid.to_string(), p);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// NodeUnprepareResources for one claim: the MIG instances it alone holds are
    /// destroyed, then its spec, its files and its checkpoint entry go. A claim this driver
    /// does not know is already unprepared.
    async fn unprepare_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClaimError> {
        check_uid(uid).map_err(ClaimError::Uid)?;
        let what = format!("ResourceClaim {namespace}/{name}");
        let mut state = self.state.lock().await;
        self.release_instances(&mut state, uid, &what).await.map_err(|e| ClaimError::step(&what, e))?;
        state.lost.remove(uid);
        self.files.remove(uid).map_err(|e| ClaimError::step(&what, e))?;
        if state.claims.remove(uid).is_some() {
            self.store.save(&state).map_err(|e| ClaimError::step(&what, e))?;
            crate::log(&format!("unprepared ResourceClaim {namespace}/{name} ({uid})"));
            self.show(&state);
        }
        Ok(())
    }

    /// The claim's spec file.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.files.spec_path(uid)
    }
}

fn share_text(compute: Option<u64>) -> String {
    match compute.filter(|&c| c > 0 && c < WHOLE_COMPUTE) {
        Some(c) if c % 1000 == 0 => format!(" and {}% of its time", c / 1000),
        Some(c) => format!(" and {:.3}% of its time", c as f64 / 1000.0),
        None => String::new(),
    }
}
