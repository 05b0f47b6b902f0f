//! Keeps the node's pool on the API server as it should be: the slices of
//! [`crate::slices`], for what the cluster keeps.
//!
//! Each look lists this node's slices of this driver, and writes only what differs: a
//! missing slice is created, a different one replaced, and every slice of the pool then
//! carries the next generation (the scheduler reads a pool only whole, at one generation);
//! slices of this driver and node that are not the pool's (another name, another pool) are
//! deleted. A look that finds everything as it should be writes nothing.
//!
//! **What the cluster keeps.** An API server whose DRAConsumableCapacity gate is off
//! silently drops `allowMultipleAllocations` and `requestPolicy` from every slice written.
//! The driver finds out by comparing what the server stored with what was sent: first with
//! a dry run (a slice the server only checks, made to hold every gated field) at start, and
//! again every [`FEATURE_LOOK`] while the fields are dropped; then on every real write.
//! Where the fields are dropped it publishes whole GPUs, which that cluster can use (one
//! claim each, capped at the GPU's size), says so once in the log and in the status, and
//! compares with that: it never writes the same slice over and over. A cluster whose gate
//! is turned on later is found at the next dry run. A server that does not do dry runs
//! (it refuses them, or stores the slice all the same) is not asked again; what it keeps is
//! learnt from the real writes.
//!
//! **Partitions.** Where the inventory holds managed GPUs in MIG mode, a second dry run asks
//! whether the server keeps DRAPartitionableDevices' fields (`sharedCounters`,
//! `consumesCounters`), and where: a slice holding a counter set and a device that
//! consumes it is what Kubernetes 1.34 wants and 1.35 refuses (a slice holds counters or
//! devices from 1.35); when it is refused, a slice holding the counter set alone is tried.
//! Where the fields are dropped, GPUs in MIG mode are published whole, said once in the
//! log and in the status (`partitionableDevices`), as for consumable capacity. A server
//! that does not do dry runs is taken for 1.35 or later; dropped fields are learnt from the
//! real writes.
//!
//! Where the server cannot list slices, each of the pool's slices is read by name instead.

use crate::api::{Api, Written};
use crate::inventory::Inventory;
use crate::slices::{self, CounterLayout, Features, MemoryPolicy, SliceContent, CONSUMABLE_CAPACITY, PARTITIONABLE_DEVICES};
use crate::status::{LeftOutGpu, Status};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often, while the server drops the fields, a dry run asks it again.
pub const FEATURE_LOOK: Duration = Duration::from_secs(600);

/// What is known of the cluster's features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Unknown,
    On,
    Off,
}

struct FeatureState {
    consumable: Known,
    partitionable: Known,
    layout: CounterLayout,
    last_dry_run: Option<Instant>,
    last_partition_dry_run: Option<Instant>,
    /// The server refuses dry runs, or stored one: none is made again.
    no_dry_runs: bool,
}

/// Why one look at the node's pool did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Api(#[from] crate::api::ApiError),
    #[error("ResourceSlice {0} changed while it was being replaced; looking again")]
    Changed(String),
    #[error("ResourceSlice {0} cannot be replaced (conflict)")]
    Conflict(String),
}

pub struct Publisher {
    api: Arc<Api>,
    node: String,
    status: Arc<Status>,
    features: Mutex<FeatureState>,
    /// The pool generation this driver last wrote or saw: a pool written anew never goes
    /// back in generation while the plugin runs.
    generation: AtomicI64,
    writes: AtomicU64,
    /// The resourceVersions of this driver's own writes: their watch events are not news.
    own: Mutex<HashSet<String>>,
    /// The GPUs left out last time, so each is logged once.
    left_out: Mutex<Vec<slices::LeftOut>>,
}

impl Publisher {
    pub fn new(api: Arc<Api>, node: &str, status: Arc<Status>) -> Publisher {
        Publisher {
            api,
            node: node.into(),
            status,
            features: Mutex::new(FeatureState {
                consumable: Known::Unknown,
                partitionable: Known::Unknown,
                layout: CounterLayout::Split,
                last_dry_run: None,
                last_partition_dry_run: None,
                no_dry_runs: false,
            }),
            generation: AtomicI64::new(0),
            writes: AtomicU64::new(0),
            own: Mutex::new(HashSet::new()),
            left_out: Mutex::new(Vec::new()),
        }
    }

    /// Whether a slice at this resourceVersion is one this driver wrote.
    pub fn is_own(&self, resource_version: &str) -> bool {
        self.own.lock().unwrap_or_else(|e| e.into_inner()).contains(resource_version)
    }

    fn wrote(&self, stored: &Value) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Some(rv) = stored.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
            let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
            if own.len() > 4096 {
                own.clear();
            }
            own.insert(rv.to_string());
        }
    }

    fn features(&self) -> Features {
        let f = self.features.lock().unwrap_or_else(|e| e.into_inner());
        Features { consumable_capacity: f.consumable != Known::Off, partitionable_devices: f.partitionable != Known::Off, counter_layout: f.layout }
    }

    /// Records whether the server keeps partitionable devices' fields, and where it wants
    /// the counter sets; says so when it changed.
    fn learn_partitions(&self, kept: Option<CounterLayout>, how: &str) {
        let mut f = self.features.lock().unwrap_or_else(|e| e.into_inner());
        let now = if kept.is_some() { Known::On } else { Known::Off };
        if f.partitionable == now && kept.is_none_or(|l| l == f.layout) {
            return;
        }
        f.partitionable = now;
        if let Some(layout) = kept {
            f.layout = layout;
        }
        drop(f);
        let reason = match kept {
            Some(layout) => format!(
                "the API server keeps sharedCounters and consumesCounters ({how}): {PARTITIONABLE_DEVICES} is on, the managed GPUs in MIG mode are published with their partitions ({})",
                match layout {
                    CounterLayout::Combined => "each GPU's counter set in the slice of its devices, as Kubernetes 1.34 wants",
                    CounterLayout::Split => "the counter sets in slices of their own, as Kubernetes 1.35 and later want",
                }
            ),
            None => format!("the API server drops sharedCounters and consumesCounters ({how}): {PARTITIONABLE_DEVICES} is off, so the GPUs in MIG mode are published whole"),
        };
        crate::log(&reason);
        self.status.update(|s| {
            s.partitionable_devices = if kept.is_some() { "on" } else { "off" }.into();
            s.partitionable_devices_reason = Some(reason);
        });
    }

    /// The dry runs that find whether and where partitions can be published, when due: when
    /// there are GPUs to partition, at first, then while the fields are dropped.
    async fn look_at_partitions(&self) {
        let due = {
            let f = self.features.lock().unwrap_or_else(|e| e.into_inner());
            !f.no_dry_runs && f.last_partition_dry_run.is_none_or(|t| f.partitionable == Known::Off && t.elapsed() >= FEATURE_LOOK)
        };
        if !due {
            return;
        }
        self.features.lock().unwrap_or_else(|e| e.into_inner()).last_partition_dry_run = Some(Instant::now());
        for layout in [CounterLayout::Combined, CounterLayout::Split] {
            let probe = slices::mig::partition_probe(&self.node, layout);
            match self.api.create_slice(&probe, true).await {
                Ok(Written::Stored(stored)) => {
                    let kept = !slices::counters_dropped(&probe, &stored);
                    return self.learn_partitions(kept.then_some(layout), "a dry run");
                }
                Ok(Written::Conflict) => return,
                // 1.35 and later refuse a slice holding counter sets and devices: try alone.
                Err(e) if layout == CounterLayout::Combined => {
                    crate::log(&format!("a dry run of a counter set beside its devices was refused ({e}); trying one alone"))
                }
                Err(e) => {
                    crate::log(&format!("a dry run of a counter set was refused ({e}): the GPUs in MIG mode are published whole"));
                    return self.learn_partitions(None, "dry runs");
                }
            }
        }
    }

    /// Records what the server keeps, and says so when it changed.
    fn learn(&self, consumable: bool, how: &str) {
        let mut f = self.features.lock().unwrap_or_else(|e| e.into_inner());
        let now = if consumable { Known::On } else { Known::Off };
        if f.consumable == now {
            return;
        }
        f.consumable = now;
        drop(f);
        let reason = if consumable {
            format!(
                "the API server keeps allowMultipleAllocations and requestPolicy ({how}): {CONSUMABLE_CAPACITY} is on, GPUs are shared by memory and compute"
            )
        } else {
            format!(
                "the API server drops allowMultipleAllocations and requestPolicy ({how}): {CONSUMABLE_CAPACITY} is off, so each GPU is published whole (one claim at a time, capped at the GPU's size)"
            )
        };
        crate::log(&reason);
        self.status.update(|s| {
            s.consumable_capacity = if consumable { "on" } else { "off" }.into();
            s.consumable_capacity_reason = Some(reason);
        });
    }

    /// The dry run, when it is due: at start, then while the fields are dropped.
    async fn look_at_features(&self) {
        let due = {
            let f = self.features.lock().unwrap_or_else(|e| e.into_inner());
            !f.no_dry_runs && f.last_dry_run.is_none_or(|t| f.consumable == Known::Off && t.elapsed() >= FEATURE_LOOK)
        };
        if !due {
            return;
        }
        let probe = slices::feature_probe(&self.node);
        let outcome = self.api.create_slice(&probe, true).await;
        let mut f = self.features.lock().unwrap_or_else(|e| e.into_inner());
        f.last_dry_run = Some(Instant::now());
        match outcome {
            Ok(Written::Stored(stored)) => {
                drop(f);
                self.learn(!slices::dropped(&probe, &stored).contains(CONSUMABLE_CAPACITY), "a dry run");
            }
            Ok(Written::Conflict) => {}
            Err(e) => {
                crate::log(&format!("a dry run of a slice failed ({e}): what the server keeps is learnt from the slices written"));
                f.no_dry_runs = true;
            }
        }
    }

    /// A server that stored a dry run's slice: no more dry runs.
    fn dry_run_stored(&self, name: &str) {
        let mut f = self.features.lock().unwrap_or_else(|e| e.into_inner());
        if !f.no_dry_runs {
            crate::log(&format!("the API server stored the slice of a dry run ({name}): it is deleted, and no dry run is made again"));
            f.no_dry_runs = true;
        }
    }

    /// One look: makes the node's pool what `inventory` and the cluster's features make
    /// it. Says what it wrote, or `None` when nothing needed writing.
    pub async fn sync(&self, inventory: &Inventory, policy: &MemoryPolicy) -> Result<Option<String>, SyncError> {
        self.look_at_features().await;
        if !inventory.mig.is_empty() {
            self.look_at_partitions().await;
        }
        let owner = match self.api.node_uid(&self.node).await {
            Ok(Some(uid)) => Some(uid),
            Ok(None) => {
                crate::log(&format!("node {} not found: the ResourceSlices are published without an owner", self.node));
                None
            }
            Err(e) => {
                crate::log(&format!("cannot read node {} ({e}): the ResourceSlices are published without an owner", self.node));
                None
            }
        };
        // Three times at most: a write that finds a feature dropped changes what is wanted.
        let mut said = Vec::new();
        for _ in 0..3 {
            let features = self.features();
            let (plain, parts, left_out) = slices::mig::pool_devices(&inventory.gpus, &inventory.mig, &inventory.driver, policy, features);
            self.note_left_out(&left_out);
            let published: Vec<String> = plain.iter().chain(parts.iter().flat_map(|p| &p.devices)).map(|d| d.name.clone()).collect();
            let contents = slices::mig::pack_pool(plain, parts, features.counter_layout);
            match self.reconcile(owner.as_deref(), contents, &mut said).await {
                Ok(None) => {
                    self.status.update(|s| {
                        s.published = published.clone();
                        s.slice_writes = self.writes.load(Ordering::Relaxed);
                        s.pool_generation = self.generation.load(Ordering::Relaxed);
                        s.last_publish = Some(if said.is_empty() { "unchanged".into() } else { said.join("; ") });
                        s.last_publish_error = None;
                    });
                    return Ok((!said.is_empty()).then(|| said.join("; ")));
                }
                Ok(Some(gate)) if gate == PARTITIONABLE_DEVICES => self.learn_partitions(None, "the fields were missing from a slice the server stored"),
                Ok(Some(gate)) => self.learn(false, &format!("{gate}'s fields were missing from a slice the server stored")),
                Err(e) => {
                    self.status.update(|s| {
                        s.slice_writes = self.writes.load(Ordering::Relaxed);
                        s.last_publish_error = Some(e.to_string());
                    });
                    return Err(e);
                }
            }
        }
        Ok(Some(said.join("; ")))
    }

    fn note_left_out(&self, left_out: &[slices::LeftOut]) {
        let mut last = self.left_out.lock().unwrap_or_else(|e| e.into_inner());
        for l in left_out {
            if !last.contains(l) {
                crate::log(&format!("GPU {} ({}) is not published: {}", l.index, l.uuid, l.why));
            }
        }
        *last = left_out.to_vec();
        let list: Vec<LeftOutGpu> = left_out.iter().map(|l| LeftOutGpu { index: l.index, uuid: l.uuid.clone(), reason: l.why.clone() }).collect();
        self.status.update(|s| s.left_out = list);
    }

    /// Writes what differs. `Ok(Some(gate))`: the server dropped that gate's fields from a
    /// slice written (look again with what it keeps).
    async fn reconcile(&self, owner: Option<&str>, contents: Vec<SliceContent>, said: &mut Vec<String>) -> Result<Option<&'static str>, SyncError> {
        let count = contents.len();
        let names: Vec<String> = (0..count).map(|i| slices::slice_name(&self.node, i)).collect();
        let listed = match self.api.list_slices(&self.node).await {
            Ok((items, _)) => Some(items),
            Err(e) => {
                crate::log(&format!("cannot list the ResourceSlices ({e}); reading them by name"));
                None
            }
        };
        let existing: BTreeMap<String, Value> = match &listed {
            Some(items) => items
                .iter()
                .filter_map(|s| Some((s.pointer("/metadata/name")?.as_str()?.to_string(), s.clone())))
                .filter(|(_, s)| s.pointer("/spec/pool/name").and_then(Value::as_str) == Some(self.node.as_str()))
                .collect(),
            None => {
                let mut found = BTreeMap::new();
                for name in &names {
                    match self.api.get_slice(name).await {
                        Ok(Some(s)) => {
                            found.insert(name.clone(), s);
                        }
                        Ok(None) => {}
                        // Write it all the same: a server that cannot read it back may take it.
                        Err(e) => crate::log(&format!("cannot read ResourceSlice {name} ({e}); writing it anyway")),
                    }
                }
                found
            }
        };
        for s in existing.values() {
            if let Some(g) = s.pointer("/spec/pool/generation").and_then(Value::as_i64) {
                self.generation.fetch_max(g, Ordering::Relaxed);
            }
        }
        let mut desired: Vec<k8s_openapi::api::resource::v1::ResourceSlice> =
            contents.into_iter().enumerate().map(|(i, c)| slices::slice(&self.node, owner, i, count, c, 0)).collect();
        for d in &mut desired {
            let name = d.metadata.name.clone().unwrap_or_default();
            if d.metadata.owner_references.is_none() {
                // The node could not be read: keep the owner the slice has.
                d.metadata.owner_references =
                    existing.get(&name).and_then(|e| e.pointer("/metadata/ownerReferences")).and_then(|o| serde_json::from_value(o.clone()).ok());
            }
        }
        let generations: HashSet<i64> = names.iter().filter_map(|n| existing.get(n)?.pointer("/spec/pool/generation")?.as_i64()).collect();
        let whole =
            generations.len() == 1 && desired.iter().all(|d| existing.get(d.metadata.name.as_deref().unwrap_or_default()).is_some_and(|e| slices::same(e, d)));
        if !whole {
            let generation = self.generation.load(Ordering::Relaxed).saturating_add(1);
            for mut d in desired {
                let name = d.metadata.name.clone().unwrap_or_default();
                d.spec.pool.generation = generation;
                let sent = serde_json::to_value(&d).expect("a slice serialises");
                let stored = match existing.get(&name) {
                    Some(e) => {
                        d.metadata.resource_version = e.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
                        match self.api.replace_slice(&d).await? {
                            Written::Stored(v) => v,
                            Written::Conflict => return Err(SyncError::Changed(name.clone())),
                        }
                    }
                    None => match self.api.create_slice(&sent, false).await? {
                        Written::Stored(v) => v,
                        Written::Conflict => {
                            // It exists after all (made meanwhile, or not listed): replace it.
                            d.metadata.resource_version = None;
                            match self.api.replace_slice(&d).await? {
                                Written::Stored(v) => v,
                                Written::Conflict => return Err(SyncError::Conflict(name.clone())),
                            }
                        }
                    },
                };
                self.wrote(&stored);
                let verb = if existing.contains_key(&name) { "updated" } else { "wrote" };
                let devices = d.spec.devices.as_ref().map_or(0, Vec::len);
                said.push(format!("{verb} ResourceSlice {name}: {devices} device{}, pool generation {generation}", if devices == 1 { "" } else { "s" }));
                if let Some(gate) = slices::dropped(&sent, &stored).into_iter().next() {
                    self.generation.store(generation, Ordering::Relaxed);
                    return Ok(Some(gate));
                }
            }
            self.generation.store(generation, Ordering::Relaxed);
        }
        // Slices of this driver and node that are not the pool's.
        for item in listed.iter().flatten() {
            let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            let pool = item.pointer("/spec/pool/name").and_then(Value::as_str);
            if names.iter().any(|n| n == name) && pool == Some(self.node.as_str()) {
                continue;
            }
            if name.starts_with(&slices::feature_probe_prefix(&self.node)) {
                self.dry_run_stored(name);
            }
            match self.api.delete_slice(name).await {
                Ok(()) => {
                    self.writes.fetch_add(1, Ordering::Relaxed);
                    said.push(format!("deleted stale ResourceSlice {name}"));
                }
                Err(e) => crate::log(&format!("cannot delete stale ResourceSlice {name}: {e}")),
            }
        }
        self.status.update(|s| s.slices = names.clone());
        Ok(None)
    }
}
