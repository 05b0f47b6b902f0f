//! The exported functions that replace driver entry points, one module per family.
//!
//! Every hook catches panics at the boundary ([`guard`]) and answers with the real call or an
//! error code instead of unwinding into C.

pub mod alloc;
pub mod array;
pub mod context;
pub mod dlsym;
pub mod graph;
pub mod info;
pub mod launch;
pub mod nvml;
pub mod pool;
pub mod procaddr;
pub mod untracked;
pub mod vmm;

use fgpu_core::log::Level;
use fgpu_core::log_at;

/// Runs a hook body; a panic becomes `fallback` and one error line instead of an abort.
#[inline(always)]
pub fn guard<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(_) => {
            log_at!(Level::Error, "internal error in a driver hook (a bug in fgpu; please report it)");
            fallback
        }
    }
}

/// Raises a panic inside libfgpu.so and catches it the way [`guard`] does; returns 1 when it
/// was caught. Proves, in the process it runs in, that the unwinder linked into the library
/// works (`shim/build.rs` links GCC's static unwinder instead of `libgcc_s.so.1`).
/// `resume_unwind` skips the panic hook, so nothing is printed.
#[no_mangle]
pub extern "C" fn fgpu_selftest_unwind() -> std::ffi::c_int {
    struct SelfTest;
    match std::panic::catch_unwind(|| std::panic::resume_unwind(Box::new(SelfTest))) {
        Err(payload) if payload.is::<SelfTest>() => 1,
        _ => 0,
    }
}
