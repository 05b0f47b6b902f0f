//! CUDA arrays this process created through a counted call, by handle, with what each is
//! counted at (`cuArrayCreate`, `cuArray3DCreate`, `cuMipmappedArrayCreate`).

use super::allocs::Alloc;
use parking_lot::Mutex;
use std::collections::HashMap;

#[derive(Default)]
pub struct Arrays {
    by_handle: Mutex<HashMap<usize, Alloc>>,
}

impl Arrays {
    pub fn insert(&self, handle: usize, alloc: Alloc) {
        self.by_handle.lock().insert(handle, alloc);
    }

    /// Takes the record of `handle` out (before the driver destroys it, so that a new array
    /// at the same address is never mistaken for it).
    pub fn remove(&self, handle: usize) -> Option<Alloc> {
        self.by_handle.lock().remove(&handle)
    }
}
