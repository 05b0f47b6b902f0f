//! After a reboot or a GPU reset: MIG instances survive neither, while the checkpoint still
//! holds the claims prepared on them, and kubelet does not prepare those again. At start,
//! each instance a prepared claim holds that is gone is made again, same profile at the
//! same placement of the same GPU (by UUID); it is a new MIG device (a new MIG UUID, GPU and
//! compute instance IDs, so other `nvidia-caps` minors), and the claims' specs and caps are
//! written with it. Each instance made is checkpointed as soon as it exists, as a prepare
//! does; one made and not checkpointed is an orphan of the plugin's record, collected at the
//! next start.
//!
//! Where it cannot be made (its placement holds someone else's instance, the GPU is gone,
//! or no longer partitioned), the claims that hold it fail closed: one line each names why,
//! their spec is removed and not written again, and preparing them again is refused, so that
//! no container of theirs starts on no device, uncapped, or on another tenant's instance
//! (whose GPU instance may now have the IDs, and so the access nodes, the old spec named).
//! Unpreparing them works as for any claim.

use super::Plugin;
use crate::checkpoint::{Checkpoint, MigInstance};
use crate::mig::Recorded;
use crate::partitions;

impl Plugin {
    /// Makes again the instances of prepared claims that `existing` (the instances of the
    /// plugin's record that exist) lacks; fails their claims closed where it cannot.
    pub(super) async fn remake_instances(&self, state: &mut Checkpoint, existing: &[Recorded]) {
        let mut gone: Vec<MigInstance> = Vec::new();
        for m in state.claims.values().flat_map(|c| c.mig.iter()) {
            if !existing.iter().any(|r| r.mig_uuid == m.mig_uuid) && !gone.iter().any(|g| g.mig_uuid == m.mig_uuid) {
                gone.push(m.clone());
            }
        }
        for old in gone {
            let new = match self.remake(&old).await {
                Ok(new) => new,
                Err(why) => {
                    let why = format!(
                        "its MIG instance {} ({} at {}:{} on GPU {}) is gone and cannot be made again: {why}",
                        old.mig_uuid, old.profile, old.placement.0, old.placement.1, old.gpu_uuid
                    );
                    self.fail_closed(state, Some(&old.mig_uuid), &why);
                    continue;
                }
            };
            let mut holders = Vec::new();
            for (uid, claim) in state.claims.iter_mut().filter(|(_, c)| c.mig.iter().any(|m| m.mig_uuid == old.mig_uuid)) {
                for m in claim.mig.iter_mut().filter(|m| m.mig_uuid == old.mig_uuid) {
                    *m = new.clone();
                }
                for cap in claim.caps.iter_mut().filter(|c| c.uuid == old.mig_uuid) {
                    cap.uuid = new.mig_uuid.clone();
                    cap.index = new.gpu_index;
                }
                holders.push(format!("{}/{} ({uid})", claim.namespace, claim.name));
            }
            if let Err(e) = self.store.save(state) {
                crate::log(&format!("{e}: the next start collects {} and makes it again", new.mig_uuid));
            }
            crate::log(&format!(
                "made {} at {}:{} on GPU {} again (gone after a reboot or a GPU reset): {} is now {}, for ResourceClaim {}",
                new.profile,
                new.placement.0,
                new.placement.1,
                new.gpu_uuid,
                old.mig_uuid,
                new.mig_uuid,
                holders.join(", ")
            ));
            // Its record entry names a device that is no more.
            if let Err(e) = self.settings.mig.destroy(&old.mig_uuid).await {
                crate::log(&format!("cannot drop {} from the plugin's MIG record: {e}", old.mig_uuid));
            }
        }
    }

    /// The instance `old` was, made again; `Err` says why it cannot be.
    async fn remake(&self, old: &MigInstance) -> Result<MigInstance, RemakeError> {
        let inventory = self.inventory();
        let partition = partitions::partitions(&inventory.mig)
            .into_iter()
            .find(|p| p.gpu_uuid == old.gpu_uuid && p.profile == old.profile && (p.start, p.size) == old.placement);
        let Some(partition) = partition else {
            let gpu = old.gpu_uuid.clone();
            return Err(if !inventory.gpus.iter().any(|g| g.uuid == old.gpu_uuid) {
                RemakeError::GpuGone { gpu }
            } else if inventory.mig.iter().any(|g| g.uuid == old.gpu_uuid) {
                RemakeError::NoPlacement { gpu, profile: old.profile.clone(), placement: old.placement }
            } else {
                RemakeError::NotPartitioned { gpu }
            });
        };
        let mut new = self.create_instance(&partition).await?;
        new.device = old.device.clone();
        Ok(new)
    }

    /// Fails closed the claims that hold instance `mig_uuid` (every claim on a partition,
    /// for `None`): one line each, and their spec is not written (see the module's doc).
    pub(super) fn fail_closed(&self, state: &mut Checkpoint, mig_uuid: Option<&str>, why: &str) {
        let lost: Vec<String> = state
            .claims
            .iter()
            .filter(|(_, c)| c.mig.iter().any(|m| mig_uuid.is_none_or(|u| m.mig_uuid == u)))
            .map(|(uid, c)| {
                crate::log(&format!(
                    "ResourceClaim {}/{} ({uid}): {why}; no container of it starts (its CDI spec is removed) until kubelet unprepares it",
                    c.namespace, c.name
                ));
                uid.clone()
            })
            .collect();
        for uid in lost {
            self.remove_spec(&uid);
            state.lost.insert(uid, why.to_string());
        }
    }

    /// Removes the claim's spec alone: its ledger and configuration stay for its running
    /// processes.
    pub(super) fn remove_spec(&self, uid: &str) {
        let path = self.files.spec_path(uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => crate::log(&format!("cannot remove {}: {e}", path.display())),
        }
    }
}

/// Why a prepared claim's instance cannot be made again.
#[derive(Debug, thiserror::Error)]
enum RemakeError {
    #[error("GPU {gpu} is gone")]
    GpuGone { gpu: String },
    #[error("GPU {gpu} has no {profile} placement at {}:{}", .placement.0, .placement.1)]
    NoPlacement { gpu: String, profile: String, placement: (u32, u32) },
    #[error("GPU {gpu} is not partitioned now (its MIG mode is off, or --mig-gpus leaves it out)")]
    NotPartitioned { gpu: String },
    #[error(transparent)]
    Create(#[from] crate::mig::MigOpError),
}
