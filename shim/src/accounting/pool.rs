//! Stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): before an
//! allocation, what its pool may have to grow by is reserved, so a pool that would pass the
//! cap is refused before the driver is asked; after it, and after every synchronisation,
//! trim and pool destruction, each pool's count settles to what it reserves
//! (`records/pools.rs`). No lock is held across the allocation itself: streams of one
//! process allocate in parallel.

use super::active::Active;
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;

impl Active {
    /// A stream-ordered allocation of `bytes` through `alloc`, from `pool` (`None`: the
    /// current device's current pool).
    pub fn pool_alloc(&self, bytes: u64, pool: Option<CUmemoryPool>, alloc: impl FnOnce() -> CUresult) -> CUresult {
        let dev = match self.account.current_device() {
            Ok(dev) => dev,
            Err(rc) => return rc,
        };
        let Some(pool) = pool.or_else(|| driver().device_mem_pool(dev.ordinal)) else {
            return alloc();
        };
        self.untracked.settling(|| {
            let in_flight = match self.pools.begin(dev, pool, bytes, |growth| self.count_ahead(dev, growth, "cuMemAllocAsync")) {
                Ok(in_flight) => in_flight,
                Err(rc) => return rc,
            };
            fgpu_core::crash_point!("pool.reserved");
            let rc = alloc();
            fgpu_core::crash_point!("pool.allocated");
            self.pools.finish(self.account, pool, in_flight);
            rc
        })
    }

    /// After a synchronisation point or a trim, where pools may have shrunk: every pool and
    /// graph pool is read again, and (at most every half second) NVML's figure for this
    /// process compared with its count.
    pub fn after_sync(&self) {
        self.pools.refresh(self.account);
        self.graphs.refresh(self.account);
        self.count_untracked();
    }

    /// `cuMemPoolDestroy` succeeded: what the pool was counted at goes back.
    pub fn pool_destroyed(&self, pool: CUmemoryPool) {
        if let Some((ordinal, counted)) = self.pools.destroyed(pool) {
            self.account.release_on(ordinal, counted);
        }
    }
}
