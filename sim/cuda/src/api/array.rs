//! Exported CUDA driver entry points: arrays and mipmapped arrays.

use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, ArrayRec};
use crate::errors::*;
use std::ffi::c_uint;

// ---- arrays ----

#[repr(C)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}
#[repr(C)]
pub struct ArrayDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
}
#[repr(C)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}
#[repr(C)]
pub struct Array3DDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}
/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING: no memory until mapped.
pub(crate) const ARRAY_NO_BACKING: c_uint = 0x40 | 0x80;

fn array_create(ph: *mut usize, dims: (u64, u64, u64), format: c_uint, ch: c_uint, flags: c_uint, levels: u32, mip: bool) -> CUresult {
    let d = tri!(driver());
    if ph.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(bytes) = driver::array_bytes(dims.0, dims.1, dims.2, format, ch, levels) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let charged = if flags & ARRAY_NO_BACKING != 0 { 0 } else { bytes };
    let mut g = d.lock();
    let (ctx, dev) = tri!(g.current(d));
    if !d.take(dev, charged) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let h = g.new_handle();
    g.arrays.insert(h, ArrayRec { dev, ctx, bytes: charged, mipmapped: mip });
    put(ph, h);
    CUDA_SUCCESS
}

fn array_destroy(h: usize, mip: bool) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    match g.arrays.get(&h) {
        Some(a) if a.mipmapped == mip => {}
        _ => return CUDA_ERROR_INVALID_HANDLE,
    }
    if let Some(a) = g.arrays.remove(&h) {
        d.give(a.dev, a.bytes);
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(ph: *mut CUarray, desc: *const ArrayDesc) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, 0), a.format, a.num_channels, 0, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(ph: *mut CUarray, desc: *const ArrayDescV1) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, 0), a.format, a.num_channels, 0, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(ph: *mut CUarray, desc: *const Array3DDesc) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(ph: *mut CUarray, desc: *const Array3DDescV1) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(h: CUarray) -> CUresult {
    guard(|| array_destroy(h, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(ph: *mut CUmipmappedArray, desc: *const Array3DDesc, levels: c_uint) -> CUresult {
    guard(|| {
        if desc.is_null() || levels == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, levels, true)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: CUmipmappedArray) -> CUresult {
    guard(|| array_destroy(h, true))
}

fn array_requirements(req: *mut ArrayMemoryRequirements, h: usize, dev: CUdevice, mip: bool) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    if req.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let g = d.lock();
    match g.arrays.get(&h) {
        Some(a) if a.mipmapped == mip && a.dev == dev => {
            put(req, ArrayMemoryRequirements { size: a.bytes.max(driver::GRANULARITY) as usize, alignment: driver::GRANULARITY as usize, reserved: [0; 4] });
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(req: *mut ArrayMemoryRequirements, array: CUarray, dev: CUdevice) -> CUresult {
    guard(|| array_requirements(req, array, dev, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(req: *mut ArrayMemoryRequirements, array: CUmipmappedArray, dev: CUdevice) -> CUresult {
    guard(|| array_requirements(req, array, dev, true))
}
