//! Physical allocations this process made with `cuMemCreate`, and which virtual ranges map
//! them: the memory goes away only when the handle is released *and* no mapping of it
//! remains, and that is when it is given back.

use crate::abi::cuda::{CUdevice, CUdeviceptr, CUmemGenericAllocationHandle};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

#[derive(Default)]
pub struct VmmHandles {
    inner: Mutex<Handles>,
}

#[derive(Default)]
struct Handles {
    handles: HashMap<CUmemGenericAllocationHandle, Handle>,
    /// Start of a mapped range -> (its size, the handle mapped there).
    mappings: BTreeMap<CUdeviceptr, (usize, CUmemGenericAllocationHandle)>,
}

struct Handle {
    ordinal: CUdevice,
    bytes: u64,
    mappings: u32,
    released: bool,
}

impl Handles {
    /// A handle's (device, bytes) once it is released and unmapped: removed, to give back.
    fn take_if_gone(&mut self, id: CUmemGenericAllocationHandle) -> Option<(CUdevice, u64)> {
        let gone = self.handles.get(&id).is_some_and(|h| h.released && h.mappings == 0);
        gone.then(|| self.handles.remove(&id).map(|h| (h.ordinal, h.bytes))).flatten()
    }
}

impl VmmHandles {
    pub fn created(&self, handle: CUmemGenericAllocationHandle, ordinal: CUdevice, bytes: u64) {
        self.inner.lock().handles.insert(handle, Handle { ordinal, bytes, mappings: 0, released: false });
    }

    /// `cuMemRelease` succeeded: what to give back, if the memory is gone now.
    pub fn released(&self, handle: CUmemGenericAllocationHandle) -> Option<(CUdevice, u64)> {
        let mut inner = self.inner.lock();
        if let Some(h) = inner.handles.get_mut(&handle) {
            h.released = true;
        }
        inner.take_if_gone(handle)
    }

    /// `cuMemMap` succeeded.
    pub fn mapped(&self, ptr: CUdeviceptr, size: usize, handle: CUmemGenericAllocationHandle) {
        let mut inner = self.inner.lock();
        if let Some(h) = inner.handles.get_mut(&handle) {
            h.mappings += 1;
            inner.mappings.insert(ptr, (size, handle));
        }
    }

    /// `cuMemUnmap` succeeded (one unmap may cover several mapped ranges): what to give
    /// back, for handles whose memory is gone now.
    pub fn unmapped(&self, ptr: CUdeviceptr, size: usize) -> Vec<(CUdevice, u64)> {
        let mut inner = self.inner.lock();
        let end = ptr.saturating_add(size as u64);
        let covered: Vec<CUdeviceptr> = inner.mappings.range(ptr..end).map(|(start, _)| *start).collect();
        let mut gone = Vec::new();
        for start in covered {
            if let Some((_, id)) = inner.mappings.remove(&start) {
                if let Some(h) = inner.handles.get_mut(&id) {
                    h.mappings = h.mappings.saturating_sub(1);
                }
                gone.extend(inner.take_if_gone(id));
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_goes_back_once_released_and_unmapped() {
        let vmm = VmmHandles::default();
        vmm.created(7, 0, 2 << 20);
        vmm.mapped(0x1000_0000, 1 << 20, 7);
        vmm.mapped(0x1010_0000, 1 << 20, 7);
        assert_eq!(vmm.released(7), None, "still mapped");
        assert_eq!(vmm.unmapped(0x1000_0000, 1 << 20), vec![]);
        // One unmap covering the last range gives it back, once.
        assert_eq!(vmm.unmapped(0x1000_0000, 4 << 20), vec![(0, 2 << 20)]);
        assert_eq!(vmm.released(7), None);
        // Unmapped first, released after.
        vmm.created(8, 1, 4 << 20);
        vmm.mapped(0x2000_0000, 4 << 20, 8);
        assert_eq!(vmm.unmapped(0x2000_0000, 4 << 20), vec![]);
        assert_eq!(vmm.released(8), Some((1, 4 << 20)));
    }
}
