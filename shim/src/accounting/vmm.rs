//! Virtual memory management (`cuMemCreate`, `cuMemRelease`, `cuMemMap`, `cuMemUnmap`),
//! used by PyTorch's expandable segments, JAX/XLA and vLLM. `cuMemCreate` with a device
//! location takes physical memory: reserved before the call. The memory goes away only
//! when the handle is released *and* no mapping of it remains, so that is when it is given
//! back (`records/vmm_handles.rs`). The driver is called without holding the handle
//! table: what it did is recorded once it has answered, so threads map and unmap in
//! parallel.

use super::active::Active;
use crate::abi::cuda::*;

impl Active {
    /// `cuMemCreate` of `size` bytes on `ordinal` through `create`; `created` reads the new
    /// handle once the driver wrote it.
    pub fn vmm_create(
        &self,
        ordinal: CUdevice,
        size: u64,
        create: impl FnOnce() -> CUresult,
        created: impl FnOnce() -> CUmemGenericAllocationHandle,
    ) -> CUresult {
        let dev = match self.account.device(ordinal) {
            Ok(dev) => dev,
            Err(rc) => return rc,
        };
        let provisional = match self.provisional(dev, size, "cuMemCreate") {
            Ok(provisional) => provisional,
            Err(rc) => return rc,
        };
        fgpu_core::crash_point!("vmm.reserved");
        let rc = create();
        fgpu_core::crash_point!("vmm.created");
        if rc == CUDA_SUCCESS {
            provisional.keep();
            self.vmm.created(created(), ordinal, size);
        }
        rc
    }

    /// `cuMemRelease` of `handle` through `release`.
    pub fn vmm_release(&self, handle: CUmemGenericAllocationHandle, release: impl FnOnce() -> CUresult) -> CUresult {
        let rc = release();
        fgpu_core::crash_point!("vmm.released");
        if rc == CUDA_SUCCESS {
            if let Some((ordinal, bytes)) = self.vmm.released(handle) {
                self.account.release_on(ordinal, bytes);
            }
        }
        rc
    }

    /// `cuMemMap` of `handle` at `ptr` through `map`.
    pub fn vmm_map(&self, ptr: CUdeviceptr, size: usize, handle: CUmemGenericAllocationHandle, map: impl FnOnce() -> CUresult) -> CUresult {
        let rc = map();
        fgpu_core::crash_point!("vmm.mapped");
        if rc == CUDA_SUCCESS {
            self.vmm.mapped(ptr, size, handle);
        }
        rc
    }

    /// `cuMemUnmap` of `[ptr, ptr + size)` through `unmap`.
    pub fn vmm_unmap(&self, ptr: CUdeviceptr, size: usize, unmap: impl FnOnce() -> CUresult) -> CUresult {
        let rc = unmap();
        fgpu_core::crash_point!("vmm.unmapped");
        if rc == CUDA_SUCCESS {
            for (ordinal, bytes) in self.vmm.unmapped(ptr, size) {
                self.account.release_on(ordinal, bytes);
            }
        }
        rc
    }
}
