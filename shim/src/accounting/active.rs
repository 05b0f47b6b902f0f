//! A capped process's accounting ([`Active`]): its account in the ledger
//! (`crate::process::account`) and what it has counted there, one record per kind of
//! memory. The
//! flows that change the records are `impl Active` blocks of their own files (`alloc.rs`,
//! `context.rs`, `pool.rs`, `graph.rs`, `vmm.rs`, `listing.rs`).

use super::records::allocs::AllocMap;
use super::records::arrays::Arrays;
use super::records::contexts::Contexts;
use super::records::graph_book::GraphBook;
use super::records::pools::Pools;
use super::records::untracked::Untracked;
use super::records::vmm_handles::VmmHandles;
use crate::abi::cuda::*;
use crate::process::account::Account;
use crate::process::devices::Dev;
use fgpu_core::view::MemoryView;

/// A capped process: its account in the ledger, and what it has counted there, one record
/// per kind of memory, each behind its own lock.
pub struct Active {
    pub(super) account: &'static Account,
    /// Live allocations by device pointer (`cuMemAlloc*`).
    pub(super) allocs: AllocMap,
    pub(super) arrays: Arrays,
    pub(super) contexts: Contexts,
    pub(super) pools: Pools,
    pub(super) graphs: GraphBook,
    pub(super) vmm: VmmHandles,
    pub(super) untracked: Untracked,
}

impl Active {
    pub fn new(account: &'static Account) -> Active {
        Active {
            account,
            allocs: AllocMap::default(),
            arrays: Arrays::default(),
            contexts: Contexts::default(),
            pools: Pools::default(),
            graphs: GraphBook::default(),
            vmm: VmmHandles::default(),
            untracked: Untracked::default(),
        }
    }

    /// This process's account in its ledger.
    pub fn account(&self) -> &'static Account {
        self.account
    }

    /// The accounting's step before a driver call that takes memory: counts `bytes` on
    /// `dev` against the cap (through the account, [`Account::take_or_refuse`]), after what
    /// NVML shows this process holding beyond its count (`untracked.rs`).
    #[inline]
    pub fn count_ahead(&self, dev: &Dev, bytes: u64, call: &str) -> Result<(), CUresult> {
        let slot = self.account.slot().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.untracked.before_reserving(self.account, &self.contexts, bytes);
        self.account.take_or_refuse(slot, dev, bytes, call)
    }

    /// Counts, at most every half second, what NVML shows this process holding beyond the
    /// ledger's count (`untracked.rs`).
    pub fn count_untracked(&self) {
        self.untracked.count(self.account, &self.contexts);
    }

    /// Runs a module or library load through `load` and counts what it took
    /// (`records/untracked.rs`).
    pub fn around_load(&self, load: impl FnOnce() -> CUresult) -> CUresult {
        self.untracked.around_load(self.account, &self.contexts, load)
    }

    /// The (free, total) a program is told of `dev` (`fgpu_core::view`), given the driver's
    /// real free memory.
    pub fn memory_view(&self, dev: &Dev, real_free: u64) -> (u64, u64) {
        // A process that died must be gone from `used` at once (the driver freed its memory).
        self.account.ledger().reclaim_dead(self.account.slot_if_joined());
        self.count_untracked();
        let used = self.account.container_used(dev);
        let view = MemoryView { cap: dev.limit, total: dev.shown };
        (view.free(used, Some(real_free)), view.total)
    }

    /// The handles of the contexts this process made with `cuCtxCreate*`.
    pub fn created_contexts(&self) -> Vec<usize> {
        self.contexts.created_handles()
    }
}
