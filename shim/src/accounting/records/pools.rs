//! The stream-ordered pools this process allocates from, each counted as what the pool
//! reserves (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`): `cuMemFreeAsync` returns memory to
//! the pool, not to the device, and a pool gives memory back only at synchronisation
//! points and only down to its release threshold. Overlapping calls are counted as
//! `counted_pool.rs` says; no lock is held across the driver's allocation.

use super::counted_pool::{CountedPool, InFlight};
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::process::account::Account;
use crate::process::devices::Dev;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Pools grow in granules of this size.
const POOL_GRANULE: u64 = 2 << 20;

#[derive(Default)]
pub struct Pools {
    /// Pool -> what is counted for it.
    counted: Mutex<HashMap<usize, CountedPool>>,
    /// Whether any pool was counted (synchronisations skip the re-read until then).
    any: AtomicBool,
}

/// A pool's reserved memory as the driver says it now.
fn reserved_now(pool: CUmemoryPool) -> Option<u64> {
    driver().mem_pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
}

/// Brings the count for one pool to its reserved memory, once `done` has run.
fn settle_one(account: &Account, pools: &mut HashMap<usize, CountedPool>, pool: usize, done: InFlight) {
    let Some(counted) = pools.get_mut(&pool) else { return };
    let Some(dev) = account.known_device(counted.ordinal) else { return };
    let (before, after) = counted.finish(done, reserved_now(pool as CUmemoryPool));
    account.settle(dev, before, after);
}

impl Pools {
    /// Before an allocation of `bytes` from `pool` on `dev`: reserves (through `reserve`)
    /// what the pool may have to grow by — the request less the free reserve the pool is
    /// sure to keep, in granules — and records the call as in flight.
    pub fn begin(&self, dev: &Dev, pool: CUmemoryPool, bytes: u64, reserve: impl FnOnce(u64) -> Result<(), CUresult>) -> Result<InFlight, CUresult> {
        let mut pools = self.counted.lock();
        let counted = pools.entry(pool as usize).or_insert_with(|| CountedPool::new(dev.ordinal));
        self.any.store(true, Ordering::Release);
        let reserved = driver().mem_pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
        let used = driver().mem_pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(0);
        // What a synchronisation leaves the pool (its release threshold, in granules).
        let kept = driver()
            .mem_pool_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
            .map_or(0, |t| t.saturating_add(POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE);
        let growth = counted.growth_for(bytes, reserved, used, kept, POOL_GRANULE);
        if growth > 0 {
            reserve(growth)?;
        }
        Ok(counted.begin(growth, bytes))
    }

    /// After the allocation: the pool's count settles to what it reserves now.
    pub fn finish(&self, account: &Account, pool: CUmemoryPool, in_flight: InFlight) {
        settle_one(account, &mut self.counted.lock(), pool as usize, in_flight);
    }

    /// Re-reads every known pool (after synchronisation points, where pools shrink).
    pub fn refresh(&self, account: &Account) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut pools = self.counted.lock();
        let keys: Vec<usize> = pools.keys().copied().collect();
        for pool in keys {
            settle_one(account, &mut pools, pool, InFlight::default());
        }
    }

    /// `cuMemPoolDestroy` succeeded: what the pool was counted at, on which device.
    pub fn destroyed(&self, pool: CUmemoryPool) -> Option<(CUdevice, u64)> {
        self.counted.lock().remove(&(pool as usize)).map(|c| (c.ordinal, c.counted()))
    }
}
