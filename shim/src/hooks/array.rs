//! CUDA arrays (`cuArrayCreate`, `cuArray3DCreate`, `cuMipmappedArrayCreate`) and their
//! destroy calls. Their size is computed from the descriptor and reserved before the call,
//! then settled to what `cu(Mipmapped)ArrayGetMemoryRequirements` says the driver took
//! (CUDA 11.6+; older drivers keep the computed size).

use crate::abi::cuda::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;
use std::ffi::{c_uint, c_void};

/// Bytes of one level of an array: width x max(height,1) x max(depth,1) x channels x element.
fn extent_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u64) -> u64 {
    width.saturating_mul(height.max(1)).saturating_mul(depth.max(1)).saturating_mul(channels.max(1)).saturating_mul(array_format_bytes(format))
}

fn mipmapped_bytes(d: &CudaArray3dDescriptor, levels: u32) -> u64 {
    let (mut w, mut h, mut z) = (d.width as u64, d.height as u64, d.depth as u64);
    let mut total: u64 = 0;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(extent_bytes(w, h, z, d.format, d.num_channels as u64));
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        z = if z == 0 || d.flags & 1 != 0 { z } else { (z / 2).max(1) }; // layered: depth is a layer count
    }
    total
}

/// Reserves `estimate`, creates through `create`, settles to the measured size and records
/// it (`Active::counted_array`); `out` is where the driver writes the new handle.
fn counted_array(call: &'static str, out: *mut *mut c_void, estimate: u64, mipmapped: bool, create: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::Off => create(),
        Mode::Closed(_) => CUDA_ERROR_OUT_OF_MEMORY,
        Mode::On(active) => active.counted_array(call, estimate, mipmapped, || {
            let rc = create();
            // SAFETY: on success the driver wrote the new array handle to *out, which the
            // caller checked non-null.
            let handle = if rc == CUDA_SUCCESS { unsafe { *out } } else { std::ptr::null_mut() };
            (rc, handle)
        }),
    }
}

fn counted_destroy(handle: *mut c_void, destroy: impl FnOnce() -> CUresult) -> CUresult {
    match accounting::mode() {
        Mode::On(active) => active.counted_array_destroy(handle, destroy),
        _ => destroy(),
    }
}

/// One exported array constructor: its descriptor type and how many bytes it describes.
macro_rules! array_create_hook {
    ($(#[$doc:meta])* $name:ident, $desc:ty, $call:literal, |$d:ident| $estimate:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The driver's contract for this entry point: `handle` writable, `desc` readable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(handle: *mut CUarray, desc: *const $desc) -> CUresult {
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let real = || unsafe { raw::$name(handle, desc) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
            if handle.is_null() || desc.is_null() {
                return real();
            }
            // SAFETY: non-null descriptor supplied by the caller.
            let $d = unsafe { *desc };
            let estimate = $estimate;
            super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted_array($call, handle, estimate, false, answer.wrap(real)))
        }
    };
}

array_create_hook!(
    /// `cuArrayCreate_v2`.
    cuArrayCreate_v2, CudaArrayDescriptor, "cuArrayCreate",
    |d| extent_bytes(d.width as u64, d.height as u64, 0, d.format, d.num_channels as u64)
);
array_create_hook!(
    /// Pre-3.2 `cuArrayCreate` (32-bit extents).
    cuArrayCreate, CudaArrayDescriptorV1, "cuArrayCreate",
    |d| extent_bytes(d.width as u64, d.height as u64, 0, d.format, d.num_channels as u64)
);
array_create_hook!(
    /// `cuArray3DCreate_v2`.
    cuArray3DCreate_v2, CudaArray3dDescriptor, "cuArray3DCreate",
    |d| extent_bytes(d.width as u64, d.height as u64, d.depth as u64, d.format, d.num_channels as u64)
);
array_create_hook!(
    /// Pre-3.2 `cuArray3DCreate` (32-bit extents).
    cuArray3DCreate, CudaArray3dDescriptorV1, "cuArray3DCreate",
    |d| extent_bytes(d.width as u64, d.height as u64, d.depth as u64, d.format, d.num_channels as u64)
);

/// # Safety
/// `cuMipmappedArrayCreate` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CudaArray3dDescriptor, levels: c_uint) -> CUresult {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::cuMipmappedArrayCreate(handle, desc, levels) }.unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
    if handle.is_null() || desc.is_null() {
        return real();
    }
    // SAFETY: non-null descriptor supplied by the caller.
    let estimate = mipmapped_bytes(unsafe { &*desc }, levels);
    super::guard_driver(CUDA_ERROR_OUT_OF_MEMORY, |answer| counted_array("cuMipmappedArrayCreate", handle, estimate, true, answer.wrap(real)))
}

/// # Safety
/// `cuArrayDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(handle: CUarray) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuArrayDestroy(handle) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_destroy(handle, answer.wrap(real)))
}

/// # Safety
/// `cuMipmappedArrayDestroy` contract.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let real = || unsafe { raw::cuMipmappedArrayDestroy(handle) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
    super::guard_driver(CUDA_ERROR_INVALID_VALUE, |answer| counted_destroy(handle, answer.wrap(real)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_from_descriptors() {
        assert_eq!(extent_bytes(1024, 0, 0, 0x20, 1), 4096);
        assert_eq!(extent_bytes(1024, 1024, 0, 0x01, 4), 4 << 20);
        let d = CudaArray3dDescriptor { width: 256, height: 256, depth: 0, format: 0x20, num_channels: 1, flags: 0 };
        // 256^2*4 + 128^2*4 + 64^2*4
        assert_eq!(mipmapped_bytes(&d, 3), 4 * (65536 + 16384 + 4096));
    }
}
