//! The devices this process uses, as the ledger knows them: registered on first use (its
//! UUID and memory from the driver, its cap from the configuration and the ledger,
//! `fgpu_core::view`), found again by ordinal without a lock.

use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use fgpu_core::config::Config;
use fgpu_core::ledger::{DeviceId, Ledger, SlotId};
use fgpu_core::limit::format_bytes;
use fgpu_core::log::Level;
use fgpu_core::log_at;
use fgpu_core::uuid::DeviceUuid;
use fgpu_core::view::{Kept, MemoryView};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Highest CUDA device ordinal fgpu tracks per process.
pub const MAX_ORDINALS: usize = 64;

/// A device this process uses, as the ledger knows it.
#[derive(Debug)]
pub struct Dev {
    pub ordinal: CUdevice,
    pub id: DeviceId,
    pub uuid: DeviceUuid,
    /// The cap this process is held to: the smaller of its own and the ledger's
    /// (`fgpu_core::view`).
    pub limit: u64,
    /// The memory this process is told the device has: the cap, never more than the device.
    pub shown: u64,
    /// Physical memory of the device.
    pub total: u64,
}

/// The devices registered so far, by ordinal.
pub struct Devices {
    table: [OnceLock<Dev>; MAX_ORDINALS],
    registering: Mutex<()>,
    registered: AtomicUsize,
    only_ordinal: AtomicI32,
}

impl Default for Devices {
    fn default() -> Self {
        Devices {
            table: [const { OnceLock::new() }; MAX_ORDINALS],
            registering: Mutex::new(()),
            registered: AtomicUsize::new(0),
            only_ordinal: AtomicI32::new(-1),
        }
    }
}

impl Devices {
    /// The device `ordinal`, registered through `register` on first use.
    pub fn get_or_register(&self, ordinal: CUdevice, register: impl FnOnce() -> Result<Dev, CUresult>) -> Result<&Dev, CUresult> {
        let index = usize::try_from(ordinal).ok().filter(|i| *i < MAX_ORDINALS).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if let Some(dev) = self.table[index].get() {
            return Ok(dev);
        }
        let _guard = self.registering.lock();
        if let Some(dev) = self.table[index].get() {
            return Ok(dev);
        }
        let _ = self.table[index].set(register()?);
        if self.registered.fetch_add(1, Ordering::AcqRel) == 0 {
            self.only_ordinal.store(ordinal, Ordering::Release);
        } else {
            self.only_ordinal.store(-1, Ordering::Release);
        }
        Ok(self.table[index].get().expect("just set"))
    }

    /// The one device registered, while there is only one (the current device's fast path).
    #[inline]
    pub fn only(&self) -> Option<&Dev> {
        if self.registered.load(Ordering::Acquire) != 1 {
            return None;
        }
        let only = self.only_ordinal.load(Ordering::Acquire);
        if only < 0 {
            return None;
        }
        self.table[only as usize].get()
    }

    /// Every device registered.
    pub fn registered(&self) -> impl Iterator<Item = &Dev> {
        self.table.iter().filter_map(|cell| cell.get())
    }

    /// A device already registered, by ordinal (for frees).
    pub fn known(&self, ordinal: CUdevice) -> Option<&Dev> {
        self.table.get(usize::try_from(ordinal).ok()?)?.get()
    }
}

/// Registers `ordinal` in `ledger`: its UUID and memory from the driver, the cap this
/// process asks for (a device its configuration does not name stays uncapped but
/// counted), the ledger's own, and what it is held to. `slot` is asked once the device is
/// known to exist.
pub fn register(config: &Config, ledger: &Ledger, slot: impl FnOnce() -> Option<SlotId>, ordinal: CUdevice) -> Result<Dev, CUresult> {
    let uuid = driver().device_uuid(ordinal)?;
    let total = driver().device_total_mem(ordinal)?;
    let uuid_text = uuid.to_string();
    let own = config.cap_for(&uuid_text, total);
    let wanted = own.unwrap_or(total);
    let slot = slot().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let registration = ledger.register_device(uuid, total, wanted, Some(slot)).map_err(|e| {
        log_at!(Level::Error, "{e}; GPU memory allocations on {uuid_text} are refused");
        CUDA_ERROR_OUT_OF_MEMORY
    })?;
    let kept = Kept::Cap { asked: wanted, ledger: registration.ledger_cap };
    if let Some(line) = kept.message(&uuid_text, ledger.path()) {
        log_at!(Level::Warn, "{line}");
    }
    let view = MemoryView::new(own, Some(registration.ledger_cap), total);
    log_at!(Level::Debug, "device {ordinal} is {uuid_text}: {} of memory, cap {}", format_bytes(total), format_bytes(view.cap));
    Ok(Dev { ordinal, id: registration.device, uuid, limit: view.cap, shown: view.total, total })
}
