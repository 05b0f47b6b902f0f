//! Pure model of a CUDA stream-ordered memory pool (`cuMemPool*`, `cuMemAllocAsync`).
//!
//! The model, which the simulated driver follows and the unit tests pin down:
//! - A pool reserves device memory in [`POOL_GRANULE`] (2 MiB) steps. Growing the
//!   reservation is what takes device memory; the caller performs that reservation.
//! - `cuMemFreeAsync` returns an allocation to the pool, never to the device.
//! - At a synchronisation point (stream, event or context synchronise) the pool gives back
//!   memory above its release threshold (default 0), but never memory still in use:
//!   it shrinks to `max(round_up(threshold), round_up(used))`.
//! - `cuMemPoolTrimTo(min)` shrinks to `max(round_up(min), round_up(used))` at once.
//! - Fragmentation is not modelled: free space inside the reservation is one block.

/// Reservation step of a pool (what `cuMemGetAllocationGranularity` reports too).
pub const POOL_GRANULE: u64 = 2 << 20;

/// Round `v` up to a multiple of `g` (a power of two), saturating.
pub fn round_up(v: u64, g: u64) -> u64 {
    debug_assert!(g.is_power_of_two());
    v.checked_add(g - 1).map(|x| x & !(g - 1)).unwrap_or(!(g - 1))
}

/// Counters of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolModel {
    /// Device memory the pool holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// High-water mark of `reserved` (`..._RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
    /// Bytes handed out and not yet freed (`..._USED_MEM_CURRENT`).
    pub used: u64,
    /// High-water mark of `used` (`..._USED_MEM_HIGH`).
    pub used_high: u64,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, bytes.
    pub release_threshold: u64,
}

impl PoolModel {
    /// A new, empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// How much more device memory the pool must reserve before it can hand out `size`
    /// more bytes (a multiple of [`POOL_GRANULE`], 0 when the reservation suffices).
    pub fn grow_needed(&self, size: u64) -> u64 {
        let need = self.used.saturating_add(size);
        if need <= self.reserved {
            0
        } else {
            round_up(need - self.reserved, POOL_GRANULE)
        }
    }

    /// Records that the caller reserved `grown` more bytes (from [`Self::grow_needed`]) and
    /// handed out `size` bytes.
    pub fn commit_alloc(&mut self, size: u64, grown: u64) {
        self.reserved = self.reserved.saturating_add(grown);
        self.used = self.used.saturating_add(size);
        self.reserved_high = self.reserved_high.max(self.reserved);
        self.used_high = self.used_high.max(self.used);
    }

    /// `cuMemFreeAsync`: the bytes go back to the pool, which keeps them reserved.
    pub fn free(&mut self, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    fn shrink_to(&mut self, keep: u64) -> u64 {
        let floor = round_up(self.used, POOL_GRANULE).max(round_up(keep, POOL_GRANULE));
        if self.reserved > floor {
            let released = self.reserved - floor;
            self.reserved = floor;
            released
        } else {
            0
        }
    }

    /// A synchronisation point: returns the bytes the pool gives back to the device.
    pub fn sync(&mut self) -> u64 {
        self.shrink_to(self.release_threshold)
    }

    /// `cuMemPoolTrimTo(min_bytes_to_keep)`: returns the bytes given back to the device.
    pub fn trim_to(&mut self, min_bytes_to_keep: u64) -> u64 {
        self.shrink_to(min_bytes_to_keep)
    }

    /// Everything the pool holds, for its destruction: returns the bytes to give back.
    pub fn destroy(&mut self) -> u64 {
        let r = self.reserved;
        self.reserved = 0;
        self.used = 0;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn reserves_in_granules_and_keeps_freed_memory() {
        let mut p = PoolModel::new();
        let g = p.grow_needed(MIB);
        assert_eq!(g, 2 * MIB);
        p.commit_alloc(MIB, g);
        // A second 1 MiB fits in the granule already reserved.
        assert_eq!(p.grow_needed(MIB), 0);
        p.commit_alloc(MIB, 0);
        assert_eq!((p.reserved, p.used), (2 * MIB, 2 * MIB));
        let g = p.grow_needed(5 * MIB);
        assert_eq!(g, 6 * MIB);
        p.commit_alloc(5 * MIB, g);
        assert_eq!(p.reserved, 8 * MIB);
        p.free(5 * MIB);
        // Freed memory stays reserved until a synchronisation point.
        assert_eq!(p.reserved, 8 * MIB);
        assert_eq!(p.used, 2 * MIB);
        assert_eq!(p.used_high, 7 * MIB);
    }

    #[test]
    fn sync_releases_down_to_threshold_only() {
        let mut p = PoolModel::new();
        let g = p.grow_needed(64 * MIB);
        p.commit_alloc(64 * MIB, g);
        p.free(64 * MIB);
        p.release_threshold = 16 * MIB;
        assert_eq!(p.sync(), 48 * MIB);
        assert_eq!(p.reserved, 16 * MIB);
        assert_eq!(p.sync(), 0);
        // Default threshold 0 releases everything unused.
        p.release_threshold = 0;
        assert_eq!(p.sync(), 16 * MIB);
        assert_eq!(p.reserved, 0);
        assert_eq!(p.reserved_high, 64 * MIB);
    }

    #[test]
    fn max_threshold_never_releases_and_used_memory_is_kept() {
        let mut p = PoolModel::new();
        p.release_threshold = u64::MAX;
        let g = p.grow_needed(10 * MIB);
        p.commit_alloc(10 * MIB, g);
        p.free(10 * MIB);
        assert_eq!(p.sync(), 0);
        assert_eq!(p.reserved, 10 * MIB);
        // Trim gives memory back regardless of the threshold, but not what is in use.
        let g = p.grow_needed(3 * MIB);
        assert_eq!(g, 0);
        p.commit_alloc(3 * MIB, 0);
        assert_eq!(p.trim_to(0), 6 * MIB);
        assert_eq!(p.reserved, 4 * MIB);
        p.free(3 * MIB);
        assert_eq!(p.trim_to(0), 4 * MIB);
        assert_eq!(p.destroy(), 0);
    }

    #[test]
    fn round_up_saturates() {
        assert_eq!(round_up(0, POOL_GRANULE), 0);
        assert_eq!(round_up(1, POOL_GRANULE), POOL_GRANULE);
        assert_eq!(round_up(u64::MAX, POOL_GRANULE), !(POOL_GRANULE - 1));
    }
}
