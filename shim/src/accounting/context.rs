//! CUDA contexts hold device memory that no allocation call shows (hundreds of MiB).
//!
//! Before a context is created, its expected size is reserved: the last size measured on
//! that device by any process of the ledger, or 512 MiB before anyone has measured. A
//! context that does not fit is refused with `CUDA_ERROR_OUT_OF_MEMORY`. Once it exists,
//! the reservation is corrected to the size measured through NVML (this process's own
//! usage where its host PID is known, else the device's usage before and after,
//! `nvml_look.rs`), and it is returned when the context is destroyed.

use super::active::Active;
use super::nvml_look;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::process::devices::Dev;
use fgpu_core::log::Level;
use fgpu_core::log_at;

const FIRST_ESTIMATE: u64 = 512 << 20;
/// Measurements outside (0, this] are treated as noise and the estimate is kept.
const MAX_PLAUSIBLE: u64 = 16 << 30;

impl Active {
    fn context_estimate(&self, dev: &Dev) -> u64 {
        match self.account.ledger().context_hint(dev.id) {
            0 => FIRST_ESTIMATE,
            hint => hint,
        }
    }

    /// Reserves, creates (through `create`), measures and counts one context; its size.
    fn counted_creation(&self, dev: &Dev, call: &str, create: impl FnOnce() -> CUresult) -> Result<u64, CUresult> {
        self.untracked.settling(|| {
            let estimate = self.context_estimate(dev);
            let provisional = self.provisional(dev, estimate, call)?;
            fgpu_core::crash_point!("context.reserved");
            let before = nvml_look::before_context(self.account, dev);
            let rc = create();
            fgpu_core::crash_point!("context.created");
            if rc != CUDA_SUCCESS {
                return Err(rc);
            }
            let measured = nvml_look::context_size(self.account, dev, estimate, before).filter(|m| *m > 0 && *m <= MAX_PLAUSIBLE);
            let actual = measured.unwrap_or(estimate);
            if let Some(m) = measured {
                self.account.ledger().set_context_hint(dev.id, m);
            }
            log_at!(
                Level::Debug,
                "{call}: context on device {} takes {} bytes ({})",
                dev.ordinal,
                actual,
                if measured.is_some() { "measured" } else { "estimated" }
            );
            provisional.settle(actual);
            self.account.add_context(dev, actual as i64);
            Ok(actual)
        })
    }

    /// A `cuCtxCreate*` on `ordinal`: counted through `create`; on success the new
    /// context's handle (`created`, which reads what the driver wrote) is recorded. A
    /// device that cannot be registered is left to the driver.
    pub fn create_context(&self, call: &str, ordinal: CUdevice, create: impl FnOnce() -> CUresult, created: impl FnOnce() -> usize) -> CUresult {
        let dev = match self.account.device(ordinal) {
            Ok(dev) => dev,
            Err(_) => return create(),
        };
        match self.counted_creation(dev, call, create) {
            Ok(bytes) => {
                self.contexts.created(created(), ordinal, bytes);
                CUDA_SUCCESS
            }
            Err(rc) => rc,
        }
    }

    /// A `cuCtxDestroy*` through `destroy`: the context's memory goes back.
    pub fn destroy_context(&self, ctx: usize, destroy: impl FnOnce() -> CUresult) -> CUresult {
        let rc = destroy();
        fgpu_core::crash_point!("context.destroyed");
        if rc == CUDA_SUCCESS {
            if let Some((ordinal, bytes)) = self.contexts.destroyed(ctx) {
                self.account.forget_context(ordinal, bytes);
                self.untracked.forget_if_no_context(self.account, &self.contexts, ordinal);
            }
        }
        rc
    }

    /// A `cuDevicePrimaryCtxRetain` through `retain`: the retain that creates the primary
    /// context counts it (this process's retains and releases take turns, so exactly one
    /// does); the others pass on.
    pub fn retain_primary(&self, ordinal: CUdevice, retain: impl FnOnce() -> CUresult) -> CUresult {
        let Ok(dev) = self.account.device(ordinal) else { return retain() };
        let mut primary = self.contexts.lock_primary();
        if primary.counted(ordinal) || driver().primary_context_active(ordinal) == Some(true) {
            return retain();
        }
        match self.counted_creation(dev, "cuDevicePrimaryCtxRetain", retain) {
            Ok(bytes) => {
                primary.insert(ordinal, bytes);
                CUDA_SUCCESS
            }
            Err(rc) => rc,
        }
    }

    /// A `cuDevicePrimaryCtxRelease` or `Reset` through `release`: a primary context that
    /// is no longer active gives its memory back.
    pub fn release_primary(&self, ordinal: CUdevice, release: impl FnOnce() -> CUresult) -> CUresult {
        let mut primary = self.contexts.lock_primary();
        let rc = release();
        fgpu_core::crash_point!("context.released");
        if rc == CUDA_SUCCESS && driver().primary_context_active(ordinal) != Some(true) {
            if let Some(bytes) = primary.remove(ordinal) {
                self.account.forget_context(ordinal, bytes);
                drop(primary);
                self.untracked.forget_if_no_context(self.account, &self.contexts, ordinal);
            }
        }
        rc
    }
}
