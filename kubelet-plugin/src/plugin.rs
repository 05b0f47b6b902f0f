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
use crate::checkpoint::{CapRecord, Checkpoint, DeviceRecord, MigInstance, PreparedClaim, Preparing, Store};
use crate::claimfiles::{check_uid, fgpu_device_name, ClaimFiles};
use crate::inventory::Inventory;
use crate::mig::{MigOpError, MigTool};
use crate::nvidia::{self, NvidiaNames};
use crate::partitions::Partition;
use crate::plan::{self, PlannedPartition};
use crate::slices::MemoryPolicy;
use crate::status::Status;
use fgpu_cdi::claim::WHOLE_COMPUTE;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::Mutex;

mod remake;

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
    pub async fn restore(&self) -> Result<(), String> {
        self.files.make_private().map_err(|e| e.to_string())?;
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
    pub async fn prepare(self: &Arc<Self>, namespace: &str, name: &str, uid: &str) -> Result<Vec<DeviceRecord>, String> {
        let (this, namespace, name, uid) = (self.clone(), namespace.to_string(), name.to_string(), uid.to_string());
        tokio::spawn(async move { this.prepare_claim(&namespace, &name, &uid).await }).await.map_err(|e| format!("preparing a claim failed: {e}"))?
    }

    /// NodeUnprepareResources for one claim, in a task of its own (as [`Plugin::prepare`]).
    pub async fn unprepare(self: &Arc<Self>, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        let (this, namespace, name, uid) = (self.clone(), namespace.to_string(), name.to_string(), uid.to_string());
        tokio::spawn(async move { this.unprepare_claim(&namespace, &name, &uid).await }).await.map_err(|e| format!("unpreparing a claim failed: {e}"))?
    }

    /// NodePrepareResources for one claim: its devices, or why it cannot be prepared.
    async fn prepare_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<DeviceRecord>, String> {
        check_uid(uid).map_err(|e| e.to_string())?;
        let what = format!("ResourceClaim {namespace}/{name}");
        {
            let state = self.state.lock().await;
            if let Some(why) = state.lost.get(uid) {
                return Err(format!("{what}: {why}"));
            }
            if let Some(done) = state.claims.get(uid) {
                self.files.write(uid, done).map_err(|e| format!("{what}: {e}"))?;
                return Ok(done.devices.clone());
            }
        }
        // Read without the lock: other claims are prepared meanwhile.
        let claim = self.api.claim(namespace, name).await.map_err(|e| format!("cannot read {what}: {e}"))?.ok_or_else(|| format!("{what} does not exist"))?;
        if claim.metadata.uid != uid {
            return Err(format!("{what} has UID {:?}, not {uid:?}: it was deleted and created again", claim.metadata.uid));
        }
        let inventory = self.inventory();
        let plan = plan::plan(&claim, &self.settings.node, &inventory.gpus, &inventory.mig).map_err(|e| format!("{what}: {e}"))?;
        let fgpu_id = plan.capped().then(|| format!("{}={}", fgpu_cdi::KIND, fgpu_device_name(uid)));
        let mut nvidia_ids: BTreeMap<u32, String> = BTreeMap::new();
        let parents = plan.partitions.iter().map(|p| (p.partition.gpu_index, &p.partition.gpu_uuid));
        for (index, uuid) in plan.caps.iter().map(|c| (c.index, &c.uuid)).chain(parents) {
            let id = nvidia::device_id(&self.settings.nvidia, index, uuid).map_err(|e| format!("{what}: {e}"))?;
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
            return Err(format!("{what}: {e}"));
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
    fn finish(&self, state: &mut Checkpoint, uid: &str, record: &PreparedClaim) -> Result<(), String> {
        capacity::check(&state.claims, uid, record, &self.settings.memory).map_err(|e| e.to_string())?;
        self.files.write(uid, record).map_err(|e| e.to_string())?;
        let preparing = state.preparing.remove(uid);
        state.claims.insert(uid.to_string(), record.clone());
        if let Err(e) = self.store.save(state) {
            state.claims.remove(uid);
            if let Some(p) = preparing {
                state.preparing.insert(uid.to_string(), p);
            }
            return Err(e.to_string());
        }
        Ok(())
    }

    /// The instances of a claim's partitions, each shared with the claims that hold it or
    /// created (the intent checkpointed first, each instance as soon as it exists), and the
    /// claim's cap inside each. On a failure what was created is destroyed again.
    async fn take_instances(
        &self,
        state: &mut Checkpoint,
        uid: &str,
        what: &str,
        partitions: &[PlannedPartition],
        record: &mut PreparedClaim,
    ) -> Result<(), String> {
        let intent = Preparing {
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            partitions: partitions.iter().map(|p| p.partition.device_name()).collect(),
            created: Vec::new(),
        };
        state.preparing.insert(uid.to_string(), intent);
        if let Err(e) = self.store.save(state) {
            state.preparing.remove(uid);
            return Err(format!("{what}: {e}"));
        }
        for p in partitions {
            let device = p.partition.device_name();
            let held = record.mig.iter().chain(state.claims.values().flat_map(|c| c.mig.iter()));
            let shared = held.into_iter().find(|m| m.device == device && m.gpu_uuid == p.partition.gpu_uuid).cloned();
            let instance = match shared {
                Some(instance) => instance,
                None => {
                    let made = self.create_instance(&p.partition).await;
                    let made = made.and_then(|m| {
                        state.preparing.get_mut(uid).expect("the intent").created.push(m.clone());
                        self.store.save(state).map(|()| m).map_err(|e| e.to_string())
                    });
                    match made {
                        Ok(m) => m,
                        Err(e) => {
                            self.roll_back(state, uid, what).await;
                            return Err(format!("{what}: device {device}: {e}"));
                        }
                    }
                }
            };
            if let Err(e) = add_cap(record, &instance, p) {
                self.roll_back(state, uid, what).await;
                return Err(format!("{what}: device {device}: {e}"));
            }
            if !record.mig.contains(&instance) {
                record.mig.push(instance);
            }
        }
        Ok(())
    }

    /// Creates the instance of `partition` and reads its capability minors; destroys it
    /// again when they cannot be read.
    async fn create_instance(&self, partition: &Partition) -> Result<MigInstance, String> {
        let made = self.settings.mig.create(partition).await.map_err(|e| e.to_string())?;
        let minors = match made.gpu_minor {
            Some(minor) => self.settings.mig.caps_minors(minor, made.gpu_instance, made.compute_instance).map(|m| (minor, m)),
            None => Err(MigOpError::Failed(format!("NVML gives no minor number for GPU {}", made.gpu_uuid))),
        };
        let (gpu_minor, caps_minors) = match minors {
            Ok(m) => m,
            Err(e) => {
                if let Err(d) = self.settings.mig.destroy(&made.mig_uuid).await {
                    crate::log(&format!("cannot destroy {} again: {d}", made.mig_uuid));
                }
                return Err(e.to_string());
            }
        };
        crate::log(&format!(
            "created {} at {}:{} on GPU {} ({}): {}",
            made.profile, made.placement.0, made.placement.1, made.gpu_index, made.gpu_uuid, made.mig_uuid
        ));
        Ok(MigInstance {
            device: partition.device_name(),
            gpu_uuid: made.gpu_uuid,
            gpu_index: made.gpu_index,
            gpu_minor,
            profile: made.profile,
            placement: made.placement,
            mig_uuid: made.mig_uuid,
            gpu_instance: made.gpu_instance,
            compute_instance: made.compute_instance,
            memory: made.memory_mib << 20,
            caps_minors,
        })
    }

    /// Undoes a half-done prepare: its files go, and the instances it created that no
    /// prepared claim holds are destroyed; one that cannot be stays in `preparing` for the
    /// next unprepare or start.
    async fn roll_back(&self, state: &mut Checkpoint, uid: &str, what: &str) {
        if !state.claims.contains_key(uid) {
            if let Err(e) = self.files.remove(uid) {
                crate::log(&format!("{what}: cannot remove its files: {e}"));
            }
        }
        let Some(mut intent) = state.preparing.remove(uid) else { return };
        let mut kept = Vec::new();
        for m in intent.created.drain(..).rev() {
            if !state.owners(&m.mig_uuid, uid).is_empty() {
                continue;
            }
            match self.settings.mig.destroy(&m.mig_uuid).await {
                Ok(()) => crate::log(&format!(
                    "{what}: destroyed {} ({} at {}:{} on GPU {}), created by a prepare undone",
                    m.mig_uuid, m.profile, m.placement.0, m.placement.1, m.gpu_index
                )),
                Err(e) => {
                    crate::log(&format!("{what}: cannot destroy {}: {e}", m.mig_uuid));
                    kept.push(m);
                }
            }
        }
        if !kept.is_empty() {
            intent.created = kept;
            state.preparing.insert(uid.to_string(), intent);
        }
        if let Err(e) = self.store.save(state) {
            crate::log(&format!("{what}: {e}"));
        }
    }

    /// Destroys the instances claim `uid` holds alone; `Err` (the claim staying prepared)
    /// when one is in use or cannot be destroyed.
    async fn release_instances(&self, state: &mut Checkpoint, uid: &str, what: &str) -> Result<(), String> {
        let held: Vec<MigInstance> = state.claims.get(uid).map(|c| c.mig.clone()).unwrap_or_default();
        for m in held.iter().filter(|m| state.owners(&m.mig_uuid, uid).is_empty()) {
            match self.settings.mig.destroy(&m.mig_uuid).await {
                Ok(()) => {
                    crate::log(&format!("{what}: destroyed {} ({} at {}:{} on GPU {})", m.mig_uuid, m.profile, m.placement.0, m.placement.1, m.gpu_index))
                }
                Err(MigOpError::InUse(why)) => {
                    return Err(format!("{what}: {why}: a process still uses the MIG instance; the claim stays prepared until it can be destroyed"))
                }
                Err(e) => return Err(format!("{what}: cannot destroy {}: {e}", m.mig_uuid)),
            }
        }
        if state.preparing.contains_key(uid) {
            self.roll_back(state, uid, what).await;
        }
        Ok(())
    }

    /// At start: undoes the prepares cut short, and destroys the instances of the plugin's
    /// record that no prepared claim holds. Static MIG setups and `fgpu run --mig`
    /// instances are in no record of the plugin's: never touched.
    pub async fn collect_instances(&self) {
        let mut state = self.state.lock().await;
        for uid in state.preparing.keys().cloned().collect::<Vec<_>>() {
            let intent = &state.preparing[&uid];
            let what = format!("ResourceClaim {}/{} ({uid})", intent.namespace, intent.name);
            crate::log(&format!("{what}: its prepare was cut short; undoing it"));
            self.roll_back(&mut state, &uid, &what).await;
        }
        let recorded = if self.settings.mig.record_has_entries() { self.settings.mig.recorded().await } else { Ok(Vec::new()) };
        let recorded = match recorded {
            Ok(r) => r,
            Err(e) => {
                let why = format!("cannot list the MIG instances this plugin created: {e}");
                crate::log(&why);
                return self.fail_closed(&mut state, None, &why);
            }
        };
        for r in &recorded {
            let held = state.claims.values().any(|c| c.mig.iter().any(|m| m.mig_uuid == r.mig_uuid))
                || state.preparing.values().any(|p| p.created.iter().any(|m| m.mig_uuid == r.mig_uuid));
            if held {
                continue;
            }
            match self.settings.mig.destroy(&r.mig_uuid).await {
                Ok(()) => crate::log(&format!(
                    "destroyed {} ({} at {}:{} on {}): created by this plugin, held by no prepared claim",
                    r.mig_uuid, r.profile, r.placement.0, r.placement.1, r.gpu_uuid
                )),
                Err(e) => crate::log(&format!("cannot destroy {}, held by no prepared claim: {e}", r.mig_uuid)),
            }
        }
        self.remake_instances(&mut state, &recorded).await;
    }

    /// NodeUnprepareResources for one claim: the MIG instances it alone holds are
    /// destroyed, then its spec, its files and its checkpoint entry go. A claim this driver
    /// does not know is already unprepared.
    async fn unprepare_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        check_uid(uid).map_err(|e| e.to_string())?;
        let mut state = self.state.lock().await;
        self.release_instances(&mut state, uid, &format!("ResourceClaim {namespace}/{name}")).await?;
        state.lost.remove(uid);
        self.files.remove(uid).map_err(|e| format!("ResourceClaim {namespace}/{name}: {e}"))?;
        if state.claims.remove(uid).is_some() {
            self.store.save(&state).map_err(|e| format!("ResourceClaim {namespace}/{name}: {e}"))?;
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

/// The claim's cap inside `instance` for partition `p` (added to the claim's cap there when
/// two of its requests share the instance).
fn add_cap(record: &mut PreparedClaim, instance: &MigInstance, p: &PlannedPartition) -> Result<(), String> {
    let cap = match record.caps.iter_mut().find(|c| c.uuid == instance.mig_uuid) {
        Some(cap) => cap,
        None => {
            record.caps.push(CapRecord {
                index: instance.gpu_index,
                uuid: instance.mig_uuid.clone(),
                total: instance.memory,
                memory: 0,
                compute_millipercent: Some(0),
                exclusive: false,
                admin: false,
            });
            record.caps.last_mut().expect("pushed")
        }
    };
    cap.memory = cap.memory.saturating_add(p.memory);
    cap.compute_millipercent = cap.compute_millipercent.map(|c| c.saturating_add(p.compute_millipercent));
    cap.exclusive |= p.exclusive;
    if cap.memory > instance.memory {
        return Err(format!("the claim consumes {} bytes of the {} instance's {}", cap.memory, instance.profile, instance.memory));
    }
    Ok(())
}

fn share_text(compute: Option<u64>) -> String {
    match compute.filter(|&c| c > 0 && c < WHOLE_COMPUTE) {
        Some(c) if c % 1000 == 0 => format!(" and {}% of its time", c / 1000),
        Some(c) => format!(" and {:.3}% of its time", c as f64 / 1000.0),
        None => String::new(),
    }
}
