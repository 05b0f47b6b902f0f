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
pub mod module;
pub mod nvml;
pub mod pool;
pub mod table;
pub mod versions;
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

/// What the driver answered inside a hook, once it has: a panic after the driver acted
/// (after a real free, say) must return the driver's answer, not a made-up error.
#[derive(Default)]
pub struct Answer(std::cell::Cell<Option<u32>>);

/// A driver call's result whose code [`Answer`] records.
pub trait DriverResult {
    fn code(&self) -> u32;
}

impl DriverResult for u32 {
    fn code(&self) -> u32 {
        *self
    }
}

/// An allocation's (result, pointer, bytes taken).
impl DriverResult for (u32, u64, u64) {
    fn code(&self) -> u32 {
        self.0
    }
}

impl Answer {
    /// Records `rc` as the driver's answer and returns it.
    pub fn of(&self, rc: u32) -> u32 {
        self.0.set(Some(rc));
        rc
    }

    /// `real`, recording what it returns.
    pub fn wrap<'a, T: DriverResult>(&'a self, real: impl FnOnce() -> T + 'a) -> impl FnOnce() -> T + 'a {
        move || {
            let result = real();
            self.0.set(Some(result.code()));
            result
        }
    }
}

/// [`guard`] for a hook whose body calls the driver: a panic before the driver answered
/// becomes `fallback`, one after it the driver's own answer.
#[inline(always)]
pub fn guard_driver(fallback: u32, body: impl FnOnce(&Answer) -> u32) -> u32 {
    let answer = Answer::default();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&answer))) {
        Ok(result) => result,
        Err(_) => {
            log_at!(Level::Error, "internal error in a driver hook (a bug in fgpu; please report it)");
            answer.0.get().unwrap_or(fallback)
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
