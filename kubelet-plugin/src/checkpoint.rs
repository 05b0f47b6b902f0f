//! What the driver prepared, kept in a file so that a restarted driver answers kubelet's
//! repeated NodePrepareResources with the same devices (and rewrites the files a reboot
//! took, without asking the API server), and still knows what to undo.
//!
//! A claim allocated a MIG partition is prepared in steps, each saved before the next: its
//! intent (`preparing`, before any instance is created), each instance it created (as soon
//! as it exists), then the claim prepared (its files written). A plugin stopped between
//! two steps finds the half-done claim in `preparing` at start and undoes it.
//!
//! The file is JSON, replaced atomically after every change. One that cannot be read is set
//! aside (`.corrupt`) and the driver starts from nothing: a claim kubelet prepares again is
//! read from the API server again, and unpreparing needs only the claim's UID.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's format; a file of another version is set aside like a corrupt one.
const VERSION: u32 = 1;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, PreparedClaim>,
    /// Claims whose preparing is under way (or was cut short), by UID.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub preparing: BTreeMap<String, Preparing>,
    /// Prepared claims whose MIG instance is gone and could not be made again at start, and
    /// why: their specs are not written (not saved: found again at each start).
    #[serde(skip)]
    pub lost: BTreeMap<String, String>,
}

/// A claim being prepared on MIG partitions: what it was allocated, and the instances
/// created for it so far (to destroy when the preparing is undone).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Preparing {
    pub namespace: String,
    pub name: String,
    /// The partitions' device names.
    pub partitions: Vec<String>,
    pub created: Vec<MigInstance>,
}

/// A MIG instance a claim holds (created for it, or for another claim that shares it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigInstance {
    /// The partition's device name.
    pub device: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// N of the GPU's `/dev/nvidiaN`.
    pub gpu_minor: u32,
    pub profile: String,
    /// First memory slice, slice count.
    pub placement: (u32, u32),
    pub mig_uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// The instance's memory in bytes.
    pub memory: u64,
    /// The `nvidia-caps` minors of the GPU instance's and the compute instance's access.
    pub caps_minors: (u32, u32),
}

impl Checkpoint {
    /// The prepared claims (other than `except`) that hold the instance `mig_uuid`.
    pub fn owners(&self, mig_uuid: &str, except: &str) -> Vec<&str> {
        self.claims.iter().filter(|(u, c)| *u != except && c.mig.iter().any(|m| m.mig_uuid == mig_uuid)).map(|(u, _)| u.as_str()).collect()
    }

    /// The instance of partition `device` of GPU `gpu_uuid` a prepared claim holds.
    pub fn instance_of(&self, device: &str, gpu_uuid: &str) -> Option<&MigInstance> {
        self.claims.values().flat_map(|c| c.mig.iter()).find(|m| m.device == device && m.gpu_uuid == gpu_uuid)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    /// The caps written to the claim's fgpu.conf, one per GPU.
    pub caps: Vec<CapRecord>,
    /// What NodePrepareResources answered.
    pub devices: Vec<DeviceRecord>,
    /// The claim's ledger is served by the plugin (shared by all its pods); false for a
    /// claim an earlier release prepared, whose running pods keep a System V segment.
    #[serde(default)]
    pub served_ledger: bool,
    /// The MIG instances of the partitions allocated to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInstance>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CapRecord {
    pub index: u32,
    pub uuid: String,
    pub total: u64,
    pub memory: u64,
    pub compute_millipercent: Option<u64>,
    /// Allocated with no consumed capacity: the GPU is this claim's alone.
    #[serde(default)]
    pub exclusive: bool,
    /// Allocated with admin access only: not a tenant's share, and not counted.
    #[serde(default)]
    pub admin: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceRecord {
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
    /// The allocation's `shareID`, which kubelets from 1.35 read.
    #[serde(default)]
    pub share_id: Option<String>,
}

pub struct Store {
    path: PathBuf,
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpoint on disk; an empty one when there is none. A file that cannot be read
    /// is renamed aside, and the reason returned beside the empty checkpoint.
    pub fn load(&self) -> (Checkpoint, Option<String>) {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Self::empty(), None),
            Err(e) => return (Self::empty(), Some(format!("cannot read {}: {e}", self.path.display()))),
        };
        match serde_json::from_slice::<Checkpoint>(&text) {
            Ok(c) if c.version == VERSION => (c, None),
            result => {
                let why = match result {
                    Ok(c) => format!("version {} (this driver writes {VERSION})", c.version),
                    Err(e) => e.to_string(),
                };
                let aside = self.path.with_extension("json.corrupt");
                let _ = std::fs::rename(&self.path, &aside);
                (Self::empty(), Some(format!("{} cannot be used ({why}); set aside as {}", self.path.display(), aside.display())))
            }
        }
    }

    fn empty() -> Checkpoint {
        Checkpoint { version: VERSION, claims: BTreeMap::new(), preparing: BTreeMap::new(), lost: BTreeMap::new() }
    }

    pub fn save(&self, checkpoint: &Checkpoint) -> Result<(), fgpu_cdi::files::FileError> {
        let text = serde_json::to_vec_pretty(checkpoint).expect("a checkpoint serialises");
        fgpu_cdi::files::write_file(&self.path, &text, 0o600, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_checkpoints_load_and_corrupt_ones_are_set_aside() {
        let dir = std::env::temp_dir().join(format!("fgpu-checkpoint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::new(dir.join("checkpoint.json"));
        assert_eq!(store.load(), (Store::empty(), None));
        let mut c = Store::empty();
        c.claims.insert(
            "u1".into(),
            PreparedClaim {
                namespace: "ml".into(),
                name: "train".into(),
                caps: vec![CapRecord {
                    index: 0,
                    uuid: "GPU-a".into(),
                    total: 80 << 30,
                    memory: 8 << 30,
                    compute_millipercent: Some(30_000),
                    ..Default::default()
                }],
                devices: vec![DeviceRecord {
                    requests: vec!["gpu".into()],
                    pool: "n".into(),
                    device: "gpu-0".into(),
                    cdi_ids: vec!["x.io/y=z".into()],
                    share_id: Some("s".into()),
                }],
                served_ledger: true,
                mig: vec![MigInstance { device: "gpu-0-mig-3g-40gb-4".into(), mig_uuid: "MIG-a".into(), ..Default::default() }],
            },
        );
        c.preparing
            .insert("u2".into(), Preparing { namespace: "ml".into(), name: "b".into(), partitions: vec!["gpu-0-mig-1g-10gb-6".into()], created: vec![] });
        assert_eq!(c.owners("MIG-a", "u2"), ["u1"]);
        assert!(c.owners("MIG-a", "u1").is_empty());
        assert_eq!(c.instance_of("gpu-0-mig-3g-40gb-4", "").map(|m| m.mig_uuid.as_str()), Some("MIG-a"));
        store.save(&c).unwrap();
        assert_eq!(store.load(), (c, None));
        std::fs::write(store.path(), b"{ not json").unwrap();
        let (loaded, why) = store.load();
        assert_eq!(loaded, Store::empty());
        assert!(why.unwrap().contains("set aside"));
        assert!(dir.join("checkpoint.json.corrupt").exists());
        assert!(!store.path().exists());
        // A checkpoint of the release before exclusive, admin and share_id were kept loads.
        std::fs::write(
            store.path(),
            br#"{"version":1,"claims":{"u":{"namespace":"a","name":"b","caps":[{"index":0,"uuid":"GPU-a","total":1,"memory":1,"compute_millipercent":null}],"devices":[{"requests":["gpu"],"pool":"n","device":"gpu-0","cdi_ids":[]}]}}}"#,
        )
        .unwrap();
        let (old, why) = store.load();
        assert_eq!((old.claims["u"].caps[0].exclusive, old.claims["u"].devices[0].share_id.clone(), why), (false, None, None));
        assert!(!old.claims["u"].served_ledger, "an earlier release's claim keeps its System V ledger");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
