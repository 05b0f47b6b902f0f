//! Kernel launches: `cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel` and
//! their `_ptsz` forms, gated by the compute share (`crate::compute`) before the driver
//! queues the kernel. Graph launches are gated in `graph.rs`, which also counts their
//! memory. A process without a compute share goes straight to the driver.
//!
//! Should the limiter itself fail (a panic, caught here), the launch is refused with
//! `CUDA_ERROR_UNKNOWN` rather than run unlimited.

use crate::abi::cuda::*;
use crate::compute::{self, Unit};
use crate::driver::raw;
use std::ffi::{c_uint, c_void};

/// `CUDA_ERROR_UNKNOWN` (cuda.h): what a launch gets if the limiter broke.
const LIMITER_FAILED: CUresult = 999;

/// Gates a launch on `stream` (`ptsz`: a per-thread-stream entry point), then runs it, or
/// answers the error it is refused with.
#[inline(always)]
pub fn gated(stream: CUstream, ptsz: bool, unit: Unit, real: impl FnOnce() -> CUresult) -> CUresult {
    match super::guard(LIMITER_FAILED, || compute::admit(stream, ptsz, unit)) {
        CUDA_SUCCESS => real(),
        refused => refused,
    }
}

macro_rules! kernel_launch {
    ($name:ident, $ptsz:expr) => {
        #[doc = concat!("`CUresult ", stringify!($name), "(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)`.\n\n# Safety\nThe driver's contract for the call.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            gated(stream, $ptsz, Unit::Kernel, || {
                // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
                unsafe { raw::$name(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
                .unwrap_or(CUDA_ERROR_NOT_FOUND)
            })
        }
    };
}

kernel_launch!(cuLaunchKernel, false);
kernel_launch!(cuLaunchKernel_ptsz, true);

macro_rules! cooperative_launch {
    ($name:ident, $ptsz:expr) => {
        #[doc = concat!("`CUresult ", stringify!($name), "(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, CUstream hStream, void **kernelParams)`.\n\n# Safety\nThe driver's contract for the call.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        ) -> CUresult {
            gated(stream, $ptsz, Unit::Kernel, || {
                // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
                unsafe { raw::$name(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
                .unwrap_or(CUDA_ERROR_NOT_FOUND)
            })
        }
    };
}

cooperative_launch!(cuLaunchCooperativeKernel, false);
cooperative_launch!(cuLaunchCooperativeKernel_ptsz, true);

macro_rules! launch_ex {
    ($name:ident, $ptsz:expr) => {
        #[doc = concat!("`CUresult ", stringify!($name), "(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)`: the stream is `config->hStream`; a NULL config goes to the driver to be refused.\n\n# Safety\nThe driver's contract for the call.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult {
            let real = || {
                // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
                unsafe { raw::$name(config, f, params, extra) }
                    .unwrap_or(CUDA_ERROR_NOT_FOUND)
            };
            if config.is_null() {
                return real();
            }
            // SAFETY: non-NULL, and the call's contract makes it a CUlaunchConfig.
            let stream = unsafe { (*config).h_stream };
            gated(stream, $ptsz, Unit::Kernel, real)
        }
    };
}

launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);
