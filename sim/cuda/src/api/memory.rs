//! Exported CUDA driver entry points: device, managed and host memory.

use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, Kind};
use crate::errors::*;
use fgpu_sim_state::pool::round_up;
use std::ffi::{c_uint, c_void};

// ---- device memory ----

#[inline]
fn mem_alloc(size: u64, low: bool) -> Result<u64, CUresult> {
    let d = driver()?;
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = d.lock();
    let (ctx, dev) = g.current(d)?;
    g.alloc_device(d, dev, ctx, size, size, Kind::Device, low)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(dptr, tri!(mem_alloc(bytesize as u64, false)));
        CUDA_SUCCESS
    })
}

/// Legacy 32-bit `cuMemAlloc(CUdeviceptr_v1*, unsigned int)`: pointers from a 32-bit range.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(dptr, tri!(mem_alloc(bytesize as u64, true)) as c_uint);
        CUDA_SUCCESS
    })
}

fn pitch_alloc(width: u64, height: u64, elem: u32, low: bool) -> Result<(u64, u64), CUresult> {
    if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = round_up(width, driver::PITCH_ALIGN);
    let bytes = pitch.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((mem_alloc(bytes, low)?, pitch))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, ppitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult {
    guard(|| {
        if dptr.is_null() || ppitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (p, pitch) = tri!(pitch_alloc(width as u64, height as u64, elem, false));
        put(dptr, p);
        put(ppitch, pitch as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(dptr: *mut c_uint, ppitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) -> CUresult {
    guard(|| {
        if dptr.is_null() || ppitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (p, pitch) = tri!(pitch_alloc(width as u64, height as u64, elem, true));
        put(dptr, p as c_uint);
        put(ppitch, pitch as c_uint);
        CUDA_SUCCESS
    })
}

#[inline]
fn mem_free(ptr: u64) -> CUresult {
    let d = tri!(driver());
    if ptr == 0 {
        // free(NULL) semantics, like the real driver.
        return CUDA_SUCCESS;
    }
    let mut g = d.lock();
    match g.allocs.get(&ptr) {
        Some(_) => {
            g.free_alloc(d, ptr);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| mem_free(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: c_uint) -> CUresult {
    guard(|| mem_free(dptr as u64))
}

/// (free, total) of the current context's device: a GPU's usable memory less every
/// process's use, or a MIG device's GPU instance memory less its processes' use.
fn mem_info() -> Result<(u64, u64), CUresult> {
    let d = driver()?;
    let (_, dev) = d.lock().current(d)?;
    if d.mig(dev).is_some() {
        return Ok((d.free_mem(dev), d.total_mem(dev)));
    }
    let p = d.phys(dev);
    let total = d.state.device_total(p);
    let mut used = d.state.device_used_counter(p);
    if used > 0 && d.state.reclaim_dead() > 0 {
        used = d.state.device_used_counter(p);
    }
    Ok((d.state.device_usable(p).saturating_sub(used), total))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let (f, t) = tri!(mem_info());
        put(free, f as usize);
        put(total, t as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    guard(|| {
        let (f, t) = tri!(mem_info());
        put(free, f.min(u32::MAX as u64) as c_uint);
        put(total, t.min(u32::MAX as u64) as c_uint);
        CUDA_SUCCESS
    })
}

fn addr_range(ptr: u64) -> Result<(u64, u64), CUresult> {
    let d = driver()?;
    let g = d.lock();
    g.find_range(ptr, 0).map(|(b, s, _)| (b, s)).ok_or(CUDA_ERROR_NOT_FOUND)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        let (b, s) = tri!(addr_range(dptr));
        put(pbase, b);
        put(psize, s as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange(pbase: *mut c_uint, psize: *mut c_uint, dptr: c_uint) -> CUresult {
    guard(|| {
        let (b, s) = tri!(addr_range(dptr as u64));
        put(pbase, b as c_uint);
        put(psize, s as c_uint);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if dptr.is_null() || bytesize == 0 || !matches!(flags, 1 | 2) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (ctx, dev) = tri!(g.current(d));
        let p = tri!(g.alloc_device(d, dev, ctx, bytesize as u64, bytesize as u64, Kind::Managed, false));
        put(dptr, p);
        CUDA_SUCCESS
    })
}

// ---- host memory (no device usage) ----

fn host_alloc(pp: *mut *mut c_void, size: usize) -> CUresult {
    let d = tri!(driver());
    if pp.is_null() || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    tri!(g.current(d));
    // SAFETY: a fresh anonymous mapping of `size` bytes.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    if p == libc::MAP_FAILED {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g.host.insert(p as usize, size);
    put(pp, p);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    guard(|| host_alloc(pp, bytesize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: c_uint) -> CUresult {
    guard(|| host_alloc(pp, bytesize as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    guard(|| {
        if flags & !0x0f != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        host_alloc(pp, bytesize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if p.is_null() {
            // free(NULL) semantics, like the real driver.
            return CUDA_SUCCESS;
        }
        let mut g = d.lock();
        match g.host.remove(&(p as usize)) {
            Some(len) => {
                driver::unmap_host(p as u64, len as u64);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}
