//! The ledger's devices: registered by UUID with the cap the first live process asks for,
//! found again by UUID, and the size of a context measured on each.
//!
//! A device is found by its UUID's 16 bytes; its kind (a GPU or a MIG device) is recorded
//! beside them for display. Every MIG device has bytes of its own, new at each creation and
//! never a GPU's, so two MIG instances, or an instance and its GPU, never share an entry,
//! whatever an fgpu that did not know MIG devices recorded (it found devices by the same
//! bytes, so processes of both find the same entry: a ledger it made is read correctly).

use super::layout::*;
use super::*;
use crate::uuid::{DeviceUuid, UuidKind};

impl Ledger {
    /// Finds the entry for a device UUID, creating it with `wanted_cap` if it is new. If no
    /// other live process is in the ledger, the cap is (re)set to `wanted_cap`: a ledger
    /// never imposes a cap nobody currently asks for.
    pub fn register_device(&self, uuid: DeviceUuid, total_memory: u64, wanted_cap: u64, own: Option<SlotId>) -> Result<Registration, LedgerError> {
        let words = uuid_words(uuid.bytes);
        let kind = kind_word(uuid.kind);
        self.with_init_lock(|| {
            let mut empty = None;
            for index in 0..MAX_DEVICES {
                let entry = self.device(DeviceId(index));
                if entry.state.load(Acquire) != DEVICE_READY {
                    empty.get_or_insert(index);
                    continue;
                }
                if entry.uuid[0].load(Relaxed) == words[0] && entry.uuid[1].load(Relaxed) == words[1] {
                    if !self.has_other_live_slot(own) {
                        entry.cap.store(wanted_cap, Relaxed);
                    }
                    // Made by an fgpu that did not record kinds: this process knows.
                    let _ = entry.kind.compare_exchange(KIND_UNKNOWN, kind, Relaxed, Relaxed);
                    entry.total_memory.store(total_memory, Relaxed);
                    return Ok(Registration { device: DeviceId(index), ledger_cap: entry.cap.load(Relaxed) });
                }
            }
            let index = empty.ok_or_else(|| LedgerError::TooManyDevices { path: self.path().to_path_buf() })?;
            let entry = self.device(DeviceId(index));
            entry.uuid[0].store(words[0], Relaxed);
            entry.uuid[1].store(words[1], Relaxed);
            entry.kind.store(kind, Relaxed);
            entry.cap.store(wanted_cap, Relaxed);
            entry.total_memory.store(total_memory, Relaxed);
            entry.registered_unix.store(store::unix_now_ms() as u64 / 1000, Relaxed);
            entry.state.store(DEVICE_READY, Release);
            Ok(Registration { device: DeviceId(index), ledger_cap: wanted_cap })
        })?
    }

    /// Looks a device up by its UUID's bytes (whatever its kind) without registering it.
    pub fn find_device(&self, uuid: [u8; 16]) -> Option<DeviceId> {
        let words = uuid_words(uuid);
        (0..MAX_DEVICES).map(DeviceId).find(|id| {
            let e = self.device(*id);
            e.state.load(Acquire) == DEVICE_READY && e.uuid[0].load(Relaxed) == words[0] && e.uuid[1].load(Relaxed) == words[1]
        })
    }

    /// The last measured size of a CUDA context on a device, shared by all processes.
    pub fn context_hint(&self, device: DeviceId) -> u64 {
        self.device(device).context_hint.load(Relaxed)
    }

    pub fn set_context_hint(&self, device: DeviceId, bytes: u64) {
        self.device(device).context_hint.store(bytes, Relaxed);
    }
}

/// The UUID of an entry as recorded: its bytes, and its kind (a GPU's when an fgpu that
/// did not record kinds made it: it printed every device so).
pub(super) fn entry_uuid(entry: &DeviceEntry) -> DeviceUuid {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&entry.uuid[0].load(Relaxed).to_le_bytes());
    bytes[8..].copy_from_slice(&entry.uuid[1].load(Relaxed).to_le_bytes());
    let kind = if entry.kind.load(Relaxed) == KIND_MIG { UuidKind::Mig } else { UuidKind::Gpu };
    DeviceUuid { kind, bytes }
}

fn kind_word(kind: UuidKind) -> u32 {
    match kind {
        UuidKind::Gpu => KIND_GPU,
        UuidKind::Mig => KIND_MIG,
    }
}

pub(super) fn uuid_words(uuid: [u8; 16]) -> [u64; 2] {
    [u64::from_le_bytes(uuid[..8].try_into().unwrap()), u64::from_le_bytes(uuid[8..].try_into().unwrap())]
}
