//! This process in its ledger: the configuration, the ledger, its slot (claimed on first
//! need), its devices and the PIDs NVML knows it by, and the moves of its count: taking
//! against the cap, giving back, settling a count to what the driver took. The layers above read
//! it through these functions; its fields are its own.

use super::devices::{self, Dev, Devices};
use super::nvml_pid::NvmlPid;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use fgpu_core::config::Config;
use fgpu_core::ledger::{Ledger, SlotId};
use fgpu_core::limit::format_bytes;
use fgpu_core::log::{self, Level, RateLimit};
use fgpu_core::log_at;
use std::sync::OnceLock;

pub struct Account {
    config: Config,
    ledger: Ledger,
    /// This process's host PID, and the PIDs NVML knows it by (`nvml_pid.rs`).
    nvml_pid: NvmlPid,
    slot: OnceLock<Option<SlotId>>,
    devices: Devices,
    /// What the accounting runs to have NVML's lists looked at (`set_nvml_look`).
    nvml_look: OnceLock<fn()>,
}

impl Account {
    pub fn new(config: Config, ledger: Ledger) -> Account {
        Account { config, ledger, nvml_pid: NvmlPid::default(), slot: OnceLock::new(), devices: Devices::default(), nvml_look: OnceLock::new() }
    }

    /// The configuration this process runs under.
    #[inline]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ledger this process counts in.
    #[inline]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// This process's host PID, and the PIDs NVML knows it by.
    #[inline]
    pub fn nvml_pid(&self) -> &NvmlPid {
        &self.nvml_pid
    }

    /// This process's slot, claimed on first need.
    pub fn slot(&self) -> Option<SlotId> {
        *self.slot.get_or_init(|| match self.ledger.join() {
            Ok(slot) => {
                // Sent now, answered by the time anything needs it; nothing waits for it.
                self.nvml_pid.ask();
                Some(slot)
            }
            Err(e) => {
                log_at!(Level::Error, "{e}; GPU memory allocations in this process are refused");
                None
            }
        })
    }

    /// The slot if this process already has one (NVML-only processes never take one).
    pub fn slot_if_joined(&self) -> Option<SlotId> {
        self.slot.get().copied().flatten()
    }

    /// This process's host PID if known by now (recorded in its slot when learnt).
    pub fn own_host_pid(&self) -> Option<u32> {
        self.nvml_pid.host(|pid| {
            if let Some(slot) = self.slot_if_joined() {
                self.ledger.set_host_pid(slot, pid);
            }
        })
    }

    /// The ledger entry for a CUDA device ordinal, registering it on first use.
    pub fn device(&self, ordinal: CUdevice) -> Result<&Dev, CUresult> {
        self.devices.get_or_register(ordinal, || devices::register(&self.config, &self.ledger, || self.slot(), ordinal))
    }

    /// The device of the calling thread's current context.
    #[inline]
    pub fn current_device(&self) -> Result<&Dev, CUresult> {
        if let Some(dev) = self.devices.only() {
            return Ok(dev);
        }
        self.device(driver().context_device()?)
    }

    /// Every device this process has registered.
    pub fn registered_devices(&self) -> impl Iterator<Item = &Dev> {
        self.devices.registered()
    }

    /// A device already registered by ordinal (for frees).
    pub fn known_device(&self, ordinal: CUdevice) -> Option<&Dev> {
        self.devices.known(ordinal)
    }

    /// Takes `bytes` on `dev` against the cap through the ledger's reserve step
    /// (`Ledger::reserve`, which, before saying no, takes back other processes' unspent
    /// credit and drops dead processes), or refuses: the refusal is counted and said in one
    /// line (rate-limited), and `CUDA_ERROR_OUT_OF_MEMORY` returned. (The accounting's
    /// `Active::count_ahead` calls it, after a look at NVML.)
    pub fn take_or_refuse(&self, slot: SlotId, dev: &Dev, bytes: u64, call: &str) -> Result<(), CUresult> {
        let refusal = match self.ledger.reserve(slot, dev.id, bytes, dev.limit) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        self.ledger.count_refusal(dev.id);
        static LIMIT: RateLimit = RateLimit::new(1_000_000_000);
        if let Some(held_back) = LIMIT.check(log::monotonic_ns()) {
            let more = if held_back > 0 { format!(" ({held_back} more refusals not shown)") } else { String::new() };
            if refusal.lock_timeout {
                log_at!(
                    Level::Error,
                    "{call} of {} refused on {}: ledger {} stayed locked by another process for too long{more}",
                    format_bytes(refusal.requested),
                    dev.uuid,
                    self.ledger.path().display()
                );
            } else {
                log_at!(
                    Level::Warn,
                    "{call} of {} refused on {}: the container already holds {} of its {} cap{more}",
                    format_bytes(refusal.requested),
                    dev.uuid,
                    format_bytes(refusal.used),
                    format_bytes(refusal.cap)
                );
            }
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Returns bytes to the ledger (through this process's credit).
    pub fn release(&self, dev: &Dev, bytes: u64) {
        if let Some(slot) = self.slot_if_joined() {
            self.ledger.release(slot, dev.id, bytes);
        }
    }

    /// Returns `bytes` on the device `ordinal`, if it is registered.
    pub fn release_on(&self, ordinal: CUdevice, bytes: u64) {
        if let Some(dev) = self.known_device(ordinal) {
            self.release(dev, bytes);
        }
    }

    /// Counts memory the driver has already handed out (corrections upwards).
    pub fn force_add(&self, dev: &Dev, bytes: u64) {
        if let Some(slot) = self.slot_if_joined() {
            self.ledger.force_add(slot, dev.id, bytes);
        }
    }

    /// Moves a reservation of `reserved` bytes to the `actual` amount the driver took.
    pub fn settle(&self, dev: &Dev, reserved: u64, actual: u64) {
        if actual > reserved {
            log_at!(
                Level::Debug,
                "device {}: the driver took {} bytes more than reserved ({reserved} reserved, {actual} taken); counted",
                dev.ordinal,
                actual - reserved
            );
            self.force_add(dev, actual - reserved);
        } else if reserved > actual {
            self.release(dev, reserved - actual);
        }
    }

    /// Counts `bytes` more (or, negative, fewer) as context memory of this process on `dev`
    /// (`fgpu status` shows them under the context).
    pub fn add_context(&self, dev: &Dev, bytes: i64) {
        if let Some(slot) = self.slot_if_joined() {
            self.ledger.add_context(slot, dev.id, bytes);
        }
    }

    /// Returns `bytes` of context memory on `ordinal` (counted and shown as context memory).
    pub fn forget_context(&self, ordinal: CUdevice, bytes: u64) {
        if let Some(dev) = self.known_device(ordinal) {
            self.release(dev, bytes);
            self.add_context(dev, -(bytes as i64));
        }
    }

    /// What every process of the ledger holds on `dev`.
    pub fn container_used(&self, dev: &Dev) -> u64 {
        self.ledger.used(dev.id)
    }

    /// Sets what [`Account::sampled_pid`] runs to have NVML's lists looked at while the PID
    /// NVML knows this process by is not known: the accounting's count of what NVML shows
    /// the process holding, which takes that look (`accounting/records/untracked.rs`). Set
    /// once, by the accounting, when it is built.
    pub fn set_nvml_look(&self, look: fn()) {
        let _ = self.nvml_look.set(look);
    }

    /// The PID NVML's utilisation samples name this process by, once known (the compute
    /// sampler's). While it is not, a look at NVML's lists is taken now and then.
    /// Where the driver gives PIDs as this namespace sees them, a process of the ledger that
    /// this namespace cannot see keeps its raw host PID in the samples: if that equals this
    /// process's PID, the samples under it could be either's, and none is taken as this
    /// process's (its events measure it instead).
    pub fn sampled_pid(&self) -> Option<u32> {
        if self.slot_if_joined().is_some() {
            let _ = self.own_host_pid();
        }
        if self.nvml_pid.needs_a_look() {
            if let Some(look) = self.nvml_look.get() {
                look();
            }
        }
        let pid = self.nvml_pid.listed()?;
        if self.nvml_pid.behaviour().lists_in_caller_namespace() {
            let own = self.slot_if_joined();
            let snapshot = self.ledger.snapshot(own);
            if snapshot.processes.iter().any(|p| p.alive && Some(p.slot) != own && p.pid_here.is_none() && p.host_pid == Some(pid)) {
                return None;
            }
        }
        Some(pid)
    }
}
