//! The MIG instances of prepared claims: taken at prepare (shared with the claims that
//! hold one, or created with the intent checkpointed first), rolled back when a prepare
//! fails, released at unprepare (destroyed with the last claim that holds one), and
//! collected at start (the plugin's own, that no prepared claim holds).

use super::{ClaimError, InstanceError, Plugin, StepError};
use crate::checkpoint::{CapRecord, Checkpoint, MigInstance, PreparedClaim, Preparing};
use crate::mig::MigOpError;
use crate::partitions::Partition;
use crate::plan::PlannedPartition;

impl Plugin {
    /// The instances of a claim's partitions, each shared with the claims that hold it or
    /// created (the intent checkpointed first, each instance as soon as it exists), and the
    /// claim's cap inside each. On a failure what was created is destroyed again.
    pub(super) async fn take_instances(
        &self,
        state: &mut Checkpoint,
        uid: &str,
        what: &str,
        partitions: &[PlannedPartition],
        record: &mut PreparedClaim,
    ) -> Result<(), ClaimError> {
        let intent = Preparing {
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            partitions: partitions.iter().map(|p| p.partition.device_name()).collect(),
            created: Vec::new(),
        };
        state.preparing.insert(uid.to_string(), intent);
        if let Err(e) = self.store.save(state) {
            state.preparing.remove(uid);
            return Err(ClaimError::step(what, e));
        }
        for p in partitions {
            let device = p.partition.device_name();
            let held = record.mig.iter().chain(state.claims.values().flat_map(|c| c.mig.iter()));
            let shared = held.into_iter().find(|m| m.device == device && m.gpu_uuid == p.partition.gpu_uuid).cloned();
            let instance = match shared {
                Some(instance) => instance,
                None => {
                    let made = self.create_instance(&p.partition).await.map_err(InstanceError::from);
                    let made = made.and_then(|m| {
                        state.preparing.get_mut(uid).expect("the intent").created.push(m.clone());
                        self.store.save(state).map(|()| m).map_err(InstanceError::from)
                    });
                    match made {
                        Ok(m) => m,
                        Err(e) => {
                            self.roll_back(state, uid, what).await;
                            return Err(ClaimError::step(what, StepError::Instance { device, why: e }));
                        }
                    }
                }
            };
            if let Err(e) = add_cap(record, &instance, p) {
                self.roll_back(state, uid, what).await;
                return Err(ClaimError::step(what, StepError::Instance { device, why: e }));
            }
            if !record.mig.contains(&instance) {
                record.mig.push(instance);
            }
        }
        Ok(())
    }

    /// Creates the instance of `partition` and reads its capability minors; destroys it
    /// again when they cannot be read.
    pub(super) async fn create_instance(&self, partition: &Partition) -> Result<MigInstance, MigOpError> {
        let made = self.settings.mig.create(partition).await?;
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
                return Err(e);
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
    pub(super) async fn roll_back(&self, state: &mut Checkpoint, uid: &str, what: &str) {
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
    pub(super) async fn release_instances(&self, state: &mut Checkpoint, uid: &str, what: &str) -> Result<(), StepError> {
        let held: Vec<MigInstance> = state.claims.get(uid).map(|c| c.mig.clone()).unwrap_or_default();
        for m in held.iter().filter(|m| state.owners(&m.mig_uuid, uid).is_empty()) {
            match self.settings.mig.destroy(&m.mig_uuid).await {
                Ok(()) => {
                    crate::log(&format!("{what}: destroyed {} ({} at {}:{} on GPU {})", m.mig_uuid, m.profile, m.placement.0, m.placement.1, m.gpu_index))
                }
                Err(MigOpError::InUse(why)) => return Err(StepError::InUse(why)),
                Err(source) => return Err(StepError::Destroy { mig_uuid: m.mig_uuid.clone(), source }),
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
}

/// The claim's cap inside `instance` for partition `p` (added to the claim's cap there when
/// two of its requests share the instance).
pub(super) fn add_cap(record: &mut PreparedClaim, instance: &MigInstance, p: &PlannedPartition) -> Result<(), InstanceError> {
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
        return Err(InstanceError::OverInstance { consumed: cap.memory, profile: instance.profile.clone(), memory: instance.memory });
    }
    Ok(())
}
