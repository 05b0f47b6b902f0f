//! Exported CUDA driver entry points: virtual memory management (cuMemCreate, cuMemMap, ...).

use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, Driver, Inner, VmmHandle};
use crate::errors::*;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub alloc_type: c_uint,
    pub requested_handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pub win32_handle_meta_data: *mut c_void,
    // allocFlags
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
pub struct CUmemAccessDesc {
    pub location_type: c_uint,
    pub location_id: c_int,
    pub flags: c_uint,
}

pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// Sentinel device index for host-located VMM memory.
const HOST_LOCATION: usize = usize::MAX;

/// Validates an allocation property: Some(device) or Some(HOST_LOCATION).
fn check_prop(d: &Driver, prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a valid CUmemAllocationProp (CUDA API contract).
    let p = unsafe { &*prop };
    if p.alloc_type != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match p.location_type {
        CU_MEM_LOCATION_TYPE_DEVICE => d.check_dev(p.location_id),
        2..=4 => Ok(HOST_LOCATION),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if granularity.is_null() || option > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(check_prop(d, prop));
        put(granularity, driver::GRANULARITY as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if handle.is_null() || flags != 0 || size == 0 || !(size as u64).is_multiple_of(driver::GRANULARITY) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = tri!(check_prop(d, prop));
        let mut g = d.lock();
        if dev != HOST_LOCATION && !d.take(dev, size as u64) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let h = g.new_handle() as u64;
        g.vmm.insert(h, VmmHandle { dev, size: size as u64, released: false, maps: 0 });
        put(handle, h);
        CUDA_SUCCESS
    })
}

fn vmm_maybe_free(g: &mut Inner, d: &Driver, h: u64) {
    let done = matches!(g.vmm.get(&h), Some(v) if v.released && v.maps == 0);
    if done {
        if let Some(v) = g.vmm.remove(&h) {
            if v.dev != HOST_LOCATION {
                d.give(v.dev, v.size);
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        match g.vmm.get_mut(&handle) {
            Some(v) if !v.released => v.released = true,
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        vmm_maybe_free(&mut g, d, handle);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, _addr: CUdeviceptr, flags: c_ulonglong) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let gran = driver::GRANULARITY;
        if ptr.is_null() || flags != 0 || size == 0 || !(size as u64).is_multiple_of(gran) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let align = if alignment == 0 { gran } else { alignment as u64 };
        if !align.is_power_of_two() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let Some(p) = g.va.alloc(size as u64, align.max(gran)) else { return CUDA_ERROR_OUT_OF_MEMORY };
        g.reservations.insert(p, size as u64);
        put(ptr, p);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        match g.reservations.get(&ptr) {
            Some(&s) if s == size as u64 => {}
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        if g.mappings.range(ptr..ptr + size as u64).next().is_some() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        g.reservations.remove(&ptr);
        g.va.free(ptr, size as u64);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let (size, offset) = (size as u64, offset as u64);
        let gran = driver::GRANULARITY;
        if flags != 0 || size == 0 || size % gran != 0 || offset % gran != 0 || !ptr.is_multiple_of(gran) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let hsize = match g.vmm.get(&handle) {
            Some(v) if !v.released => v.size,
            _ => return CUDA_ERROR_INVALID_HANDLE,
        };
        if offset.checked_add(size).is_none_or(|e| e > hsize) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // Inside one reservation, not overlapping another mapping.
        let inside = matches!(g.reservations.range(..=ptr).next_back(), Some((&b, &s)) if ptr + size <= b + s);
        if !inside {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let overlaps_prev = matches!(g.mappings.range(..=ptr).next_back(), Some((&b, &(s, _))) if b + s > ptr);
        if overlaps_prev || g.mappings.range(ptr..ptr + size).next().is_some() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        g.mappings.insert(ptr, (size, handle));
        if let Some(v) = g.vmm.get_mut(&handle) {
            v.maps += 1;
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let end = ptr.saturating_add(size as u64);
        let mut g = d.lock();
        let starts: Vec<(u64, u64, u64)> = g.mappings.range(ptr..end).map(|(&b, &(s, h))| (b, s, h)).collect();
        let partial_before = matches!(g.mappings.range(..ptr).next_back(), Some((&b, &(s, _))) if b + s > ptr);
        if starts.is_empty() || partial_before || starts.iter().any(|&(b, s, _)| b + s > end) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (b, _, h) in starts {
            g.mappings.remove(&b);
            if let Some(v) = g.vmm.get_mut(&h) {
                v.maps = v.maps.saturating_sub(1);
            }
            vmm_maybe_free(&mut g, d, h);
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if desc.is_null() || count == 0 || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors (CUDA API contract).
            let a = unsafe { &*desc.add(i) };
            if a.location_type == CU_MEM_LOCATION_TYPE_DEVICE && d.check_dev(a.location_id).is_err() {
                return CUDA_ERROR_INVALID_DEVICE;
            }
            if a.flags > 3 || a.flags == 2 {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        let g = d.lock();
        // The whole range must be mapped.
        let mut cur = ptr;
        let end = ptr.saturating_add(size as u64);
        while cur < end {
            match g.mappings.range(..=cur).next_back() {
                Some((&b, &(s, _))) if b + s > cur => cur = b + s,
                _ => return CUDA_ERROR_INVALID_VALUE,
            }
        }
        CUDA_SUCCESS
    })
}
