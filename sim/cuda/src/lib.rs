//! Simulated CUDA driver (`libcuda.so.1`) for testing fgpu without a GPU.
//!
//! Real exported names and signatures (`CUresult` is a `u32` at the ABI); device memory
//! and the device timeline (when kernels run) live in the shared state of
//! `fgpu-sim-state`, so every process and the tests see the same GPU. See
//! `docs/simulator.md`.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

#[cfg(test)]
mod abi_layout;
mod attributes;
mod driver;
mod errors;
mod procaddr;
mod va;

use driver::{
    driver, ArrayRec, CaptureRec, Ctx, Driver, EventRec, ExecRec, FuncRec, GraphRec, Inner, KernelRec, Kind, LibraryRec,
    ModuleRec, NodeRec, PoolRec, StreamKey, VmmHandle,
};
use errors::*;
use fgpu_sim_state::pool::{round_up, PoolModel};
use fgpu_sim_state::{TimelineContext, Work};
use std::collections::HashMap;
use std::ffi::{c_char, c_float, c_int, c_uchar, c_uint, c_ulonglong, c_void, CStr};

pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = usize;
pub type CUstream = usize;
pub type CUevent = usize;
pub type CUmemoryPool = usize;
pub type CUarray = usize;
pub type CUmipmappedArray = usize;
pub type CUmemGenericAllocationHandle = u64;

/// Runs an entry point's body; a panic becomes CUDA_ERROR_UNKNOWN instead of crossing
/// the C ABI.
#[inline(always)]
fn guard<F: FnOnce() -> CUresult>(f: F) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}


/// Writes `v` through a caller-supplied output pointer (ignored when NULL).
#[inline(always)]
fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: the CUDA API contract makes the caller pass a pointer valid for writing
        // one T; NULL was excluded above.
        unsafe { p.write_unaligned(v) }
    }
}

/// Reads a T from a caller-supplied pointer (checked non-NULL by the caller).
#[inline(always)]
fn get<T: Copy>(p: *const c_void) -> T {
    // SAFETY: the caller checked p is non-NULL; the CUDA API contract makes it point to a T.
    unsafe { (p as *const T).read_unaligned() }
}

/// Keeps the body of an entry point distinct from its sibling variant's (`_v2`, `_ptsz`),
/// so that identical code is not merged and every exported name has its own address.
#[inline(always)]
fn variant(tag: u32) {
    std::hint::black_box(tag);
}

/// Copies `s` into a caller buffer of `len` bytes, truncating, always NUL-terminated.
fn put_cstr(dst: *mut c_char, len: usize, s: &str) {
    if dst.is_null() || len == 0 {
        return;
    }
    let n = s.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
}

include!("api_device.rs");
include!("api_context.rs");
include!("api_memory.rs");
include!("api_copy.rs");
include!("api_stream.rs");
include!("api_pool.rs");
include!("api_vmm.rs");
include!("api_array.rs");
include!("api_entry.rs");
include!("api_graph.rs");
include!("api_module.rs");
include!("api_launch.rs");
include!("api_capture.rs");

#[cfg(test)]
mod image_tests;
