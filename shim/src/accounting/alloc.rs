//! Count ahead, call, settle: plain device allocations (`cuMemAlloc*`, `cuMemAllocPitch*`,
//! `cuMemAllocManaged`) and CUDA arrays. The bytes are counted in the ledger *before* the
//! driver is called ([`Active::count_ahead`], down to the ledger's reserve step,
//! `fgpu_core::ledger::Ledger::reserve`), so racing allocations can never pass the cap
//! together; a [`Provisional`] count not settled (the driver refused, or the call
//! panicked) is given back.
//! A free takes its record out before the driver frees, so a concurrent allocation that
//! reuses the address is never mistaken for it.

use super::active::Active;
use super::records::allocs::Alloc;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::process::devices::Dev;
use std::ffi::c_void;

/// Bytes counted ahead of a driver call in flight: given back when dropped unless
/// [`Provisional::settle`]d, so that neither a failed call nor a panic leaves them counted.
pub struct Provisional<'a> {
    active: &'a Active,
    dev: &'a Dev,
    bytes: u64,
}

impl Provisional<'_> {
    /// The call took what was counted: it stays counted.
    pub fn keep(self) {
        let bytes = self.bytes;
        self.settle(bytes);
    }

    /// The call took `actual` bytes: the count becomes that.
    pub fn settle(self, actual: u64) {
        let this = std::mem::ManuallyDrop::new(self);
        this.active.account.settle(this.dev, this.bytes, actual);
    }
}

impl Drop for Provisional<'_> {
    fn drop(&mut self) {
        self.active.account.release(self.dev, self.bytes);
    }
}

impl Active {
    /// Counts `bytes` on `dev` ahead of a driver call ([`Active::count_ahead`]), given back
    /// unless settled.
    #[inline]
    pub fn provisional<'a>(&'a self, dev: &'a Dev, bytes: u64, call: &str) -> Result<Provisional<'a>, CUresult> {
        self.count_ahead(dev, bytes, call)?;
        Ok(Provisional { active: self, dev, bytes })
    }

    /// Reserves `bytes` on `dev`, runs `allocate` (the driver's result and, on success, the
    /// pointer and the bytes actually taken), and records the allocation.
    #[inline]
    pub fn counted_alloc(&self, dev: &Dev, call: &str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
        let provisional = match self.provisional(dev, bytes, call) {
            Ok(provisional) => provisional,
            Err(rc) => return rc,
        };
        fgpu_core::crash_point!("alloc.reserved");
        #[cfg(feature = "slowed-for-bench")]
        slowed_for_bench();
        let (rc, ptr, actual) = allocate();
        fgpu_core::crash_point!("alloc.allocated");
        if rc == CUDA_SUCCESS {
            provisional.settle(actual);
            self.allocs.insert(ptr, Alloc { ordinal: dev.ordinal, bytes: actual });
        }
        rc
    }

    /// As [`Active::counted_alloc`] on the current device, for a call whose real size is
    /// only known afterwards (a pitch): no comparison with NVML runs meanwhile
    /// (`records/untracked.rs`).
    pub fn counted_alloc_settling(&self, call: &str, bytes: u64, allocate: impl FnOnce() -> (CUresult, u64, u64)) -> CUresult {
        self.untracked.settling(|| match self.account.current_device() {
            Ok(dev) => self.counted_alloc(dev, call, bytes, allocate),
            Err(rc) => rc,
        })
    }

    /// Frees through `free`, then gives back what the allocation held. A free of memory
    /// no counted call made (a stream-ordered allocation's) re-reads the pools instead.
    #[inline]
    pub fn counted_free(&self, ptr: u64, free: impl FnOnce() -> CUresult) -> CUresult {
        let record = self.allocs.remove(ptr);
        let rc = free();
        fgpu_core::crash_point!("free.freed");
        match (rc, record) {
            (CUDA_SUCCESS, Some(alloc)) => {
                if let Some(dev) = self.account.known_device(alloc.ordinal) {
                    self.account.release(dev, alloc.bytes);
                }
            }
            (CUDA_SUCCESS, None) => self.pools.refresh(self.account),
            (_, Some(alloc)) => self.allocs.insert(ptr, alloc),
            (_, None) => {}
        }
        rc
    }

    /// Reserves `estimate` for an array on the current device, creates it through `create`
    /// (the driver's result and the new handle), settles to what the driver says the array
    /// holds (`cu(Mipmapped)ArrayGetMemoryRequirements`, CUDA 11.6+; else the estimate)
    /// and records it.
    pub fn counted_array(&self, call: &str, estimate: u64, mipmapped: bool, create: impl FnOnce() -> (CUresult, *mut c_void)) -> CUresult {
        let dev = match self.account.current_device() {
            Ok(dev) => dev,
            Err(rc) => return rc,
        };
        self.untracked.settling(|| {
            let provisional = match self.provisional(dev, estimate, call) {
                Ok(provisional) => provisional,
                Err(rc) => return rc,
            };
            fgpu_core::crash_point!("array.reserved");
            let (rc, handle) = create();
            fgpu_core::crash_point!("array.created");
            if rc != CUDA_SUCCESS {
                return rc;
            }
            let actual = driver().array_size(handle, mipmapped, dev.ordinal).unwrap_or(estimate);
            provisional.settle(actual);
            self.arrays.insert(handle as usize, Alloc { ordinal: dev.ordinal, bytes: actual });
            rc
        })
    }

    /// Destroys an array through `destroy`, then gives back what it held.
    pub fn counted_array_destroy(&self, handle: *mut c_void, destroy: impl FnOnce() -> CUresult) -> CUresult {
        let record = self.arrays.remove(handle as usize);
        let rc = destroy();
        fgpu_core::crash_point!("array.destroyed");
        match (rc, record) {
            (CUDA_SUCCESS, Some(alloc)) => {
                if let Some(dev) = self.account.known_device(alloc.ordinal) {
                    self.account.release(dev, alloc.bytes);
                }
            }
            (_, Some(alloc)) => self.arrays.insert(handle as usize, alloc),
            _ => {}
        }
        rc
    }
}

/// The `slowed-for-bench` test build's deliberate cost: 200 ns of CPU spun per counted
/// allocation, so that `fgpu-bench --check` can be shown to fail a slower shim.
#[cfg(feature = "slowed-for-bench")]
fn slowed_for_bench() {
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(200);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}
