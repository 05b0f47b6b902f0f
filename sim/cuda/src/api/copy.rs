//! Exported CUDA driver entry points: copies and memsets.
//!
//! Copies take no time on the device timeline. The synchronous ones that NVIDIA documents as
//! returning only once the copy is done (device to pageable host memory; memsets of unified
//! memory) first wait for the work queued before them: on the legacy default stream, which
//! follows all earlier work of the context, or, for the `_ptds` forms, on the calling
//! thread's per-thread default stream.

use super::stream::stream_key;
use crate::boundary::*;
use crate::driver;
use crate::driver::driver;
use crate::errors::*;
use std::ffi::{c_uchar, c_uint, c_void};

/// Waits, before a synchronous copy, for the work it is ordered after (see above).
fn host_waits(ptds: bool) -> Result<(), CUresult> {
    let d = driver()?;
    let (tl, seq) = {
        let mut g = d.lock();
        let (ctx, _) = g.current(d)?;
        let Some(&tl) = g.timelines.get(&ctx) else { return Ok(()) };
        let seq = if ptds { g.stream_seq.get(&stream_key(ctx, 0, true)).copied().unwrap_or(0) } else { d.state.timeline_submitted(tl) };
        (tl, seq)
    };
    driver::wait(d, tl, seq);
    Ok(())
}

/// Validates a device range; `Some(true)` when it is host-backed (managed memory).
fn dev_range(dptr: u64, n: u64) -> Result<bool, CUresult> {
    let d = driver()?;
    let g = d.lock();
    match g.find_range(dptr, n) {
        Some((_, _, host)) => Ok(host),
        None => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn htod(dst: u64, src: *const c_void, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if src.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if tri!(dev_range(dst, n as u64)) {
        // SAFETY: dst..dst+n lies in a live managed mapping; src is the caller's n bytes.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

/// `sync`: Some(ptds) for the synchronous forms.
fn dtoh(dst: *mut c_void, src: u64, n: usize, sync: Option<bool>) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if dst.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let host = tri!(dev_range(src, n as u64));
    if let Some(ptds) = sync {
        tri!(host_waits(ptds));
    }
    if host {
        // SAFETY: src..src+n lies in a live managed mapping; dst is the caller's n bytes.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

fn dtod(dst: u64, src: u64, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    let a = tri!(dev_range(dst, n as u64));
    let b = tri!(dev_range(src, n as u64));
    if a && b {
        // SAFETY: both ranges lie in live managed mappings.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
    CUDA_SUCCESS
}

/// `sync`: Some(ptds) for the synchronous forms.
fn memset(dst: u64, value: u32, elem: usize, n: usize, sync: Option<bool>) -> CUresult {
    let bytes = match n.checked_mul(elem) {
        Some(b) => b,
        None => return CUDA_ERROR_INVALID_VALUE,
    };
    if bytes == 0 {
        return CUDA_SUCCESS;
    }
    if !dst.is_multiple_of(elem as u64) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if tri!(dev_range(dst, bytes as u64)) {
        if let Some(ptds) = sync {
            tri!(host_waits(ptds));
        }
        for i in 0..n {
            // SAFETY: the element lies inside a live managed mapping and is aligned.
            unsafe {
                match elem {
                    1 => *((dst as *mut u8).add(i)) = value as u8,
                    _ => *((dst as *mut u32).add(i)) = value,
                }
            }
        }
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    variant(8);
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD(dst: c_uint, src: *const c_void, n: c_uint) -> CUresult {
    guard(|| htod(dst as u64, src, n as usize))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| dtoh(dst, src, n, Some(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    variant(9);
    guard(|| dtoh(dst, src, n, Some(true)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH(dst: *mut c_void, src: c_uint, n: c_uint) -> CUresult {
    guard(|| dtoh(dst, src as u64, n as usize, Some(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| dtod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    variant(10);
    guard(|| dtod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, _s: CUstream) -> CUresult {
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, _s: CUstream) -> CUresult {
    variant(11);
    guard(|| htod(dst, src, n))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, _s: CUstream) -> CUresult {
    guard(|| dtoh(dst, src, n, None))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, _s: CUstream) -> CUresult {
    variant(12);
    guard(|| dtoh(dst, src, n, None))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, uc: c_uchar, n: usize) -> CUresult {
    guard(|| memset(dst, uc as u32, 1, n, Some(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, uc: c_uchar, n: usize) -> CUresult {
    variant(13);
    guard(|| memset(dst, uc as u32, 1, n, Some(true)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8(dst: c_uint, uc: c_uchar, n: c_uint) -> CUresult {
    guard(|| memset(dst as u64, uc as u32, 1, n as usize, Some(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, ui: c_uint, n: usize) -> CUresult {
    guard(|| memset(dst, ui, 4, n, Some(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, ui: c_uint, n: usize) -> CUresult {
    variant(14);
    guard(|| memset(dst, ui, 4, n, Some(true)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, uc: c_uchar, n: usize, _s: CUstream) -> CUresult {
    guard(|| memset(dst, uc as u32, 1, n, None))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, uc: c_uchar, n: usize, _s: CUstream) -> CUresult {
    variant(15);
    guard(|| memset(dst, uc as u32, 1, n, None))
}
