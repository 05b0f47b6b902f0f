//! The CUDA contexts this process holds, with what each is counted at: contexts made with
//! `cuCtxCreate*`, and primary contexts retained.

use crate::abi::cuda::CUdevice;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;

#[derive(Default)]
pub struct Contexts {
    /// Contexts made with cuCtxCreate*: context -> (device, bytes counted).
    created: Mutex<HashMap<usize, (CUdevice, u64)>>,
    /// Primary contexts this process holds: device -> bytes counted.
    primary: Mutex<HashMap<CUdevice, u64>>,
}

/// The primary contexts, locked: retains and releases of this process hold it across their
/// driver call, so that exactly one retain counts the creation of each primary context.
pub struct Primary<'a>(MutexGuard<'a, HashMap<CUdevice, u64>>);

impl Primary<'_> {
    /// Whether a primary context on `ordinal` is counted.
    pub fn counted(&self, ordinal: CUdevice) -> bool {
        self.0.contains_key(&ordinal)
    }

    pub fn insert(&mut self, ordinal: CUdevice, bytes: u64) {
        self.0.insert(ordinal, bytes);
    }

    /// What the primary context on `ordinal` was counted at, taken out.
    pub fn remove(&mut self, ordinal: CUdevice) -> Option<u64> {
        self.0.remove(&ordinal)
    }
}

impl Contexts {
    pub fn created(&self, ctx: usize, ordinal: CUdevice, bytes: u64) {
        self.created.lock().insert(ctx, (ordinal, bytes));
    }

    /// The record of a context made with `cuCtxCreate*`, taken out: (device, bytes).
    pub fn destroyed(&self, ctx: usize) -> Option<(CUdevice, u64)> {
        self.created.lock().remove(&ctx)
    }

    /// The handles of the contexts made with `cuCtxCreate*`.
    pub fn created_handles(&self) -> Vec<usize> {
        self.created.lock().keys().copied().collect()
    }

    pub fn lock_primary(&self) -> Primary<'_> {
        Primary(self.primary.lock())
    }

    /// Whether any context of this process is counted on `ordinal`.
    pub fn any_on(&self, ordinal: CUdevice) -> bool {
        self.primary.lock().contains_key(&ordinal) || self.created.lock().values().any(|(o, _)| *o == ordinal)
    }

    /// As [`Contexts::any_on`], but `false` while a retain or release holds the books: never
    /// waits for them (a context creation holds them around calls that come back here).
    pub fn holds_on(&self, ordinal: CUdevice) -> bool {
        let primary = self.primary.try_lock().is_some_and(|p| p.contains_key(&ordinal));
        primary || self.created.try_lock().is_some_and(|c| c.values().any(|(o, _)| *o == ordinal))
    }
}
