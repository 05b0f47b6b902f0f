//! The lifecycle of everything the shim keeps per process, written once ([`PerProcess`]):
//! built on the first call that needs it (never in a constructor, so a process that does
//! not use the GPU never reads a file or creates one), leaked (a reference to it lasts as
//! long as the process, and the fast path is one load), and forgotten in a forked child,
//! which is a new process and builds its own (`fork.rs`). The process's mode
//! (`process/mod.rs`), its accounting (`accounting/mod.rs`) and its compute limiter
//! (`compute/limiter.rs`) each live in one.

use super::fork;
use parking_lot::Mutex;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value this process builds once, keeps for good, and drops from sight in a forked
/// child.
pub struct PerProcess<T> {
    current: AtomicPtr<T>,
    building: Mutex<()>,
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        PerProcess::new()
    }
}

impl<T> PerProcess<T> {
    pub const fn new() -> PerProcess<T> {
        PerProcess { current: AtomicPtr::new(null_mut()), building: Mutex::new(()) }
    }

    /// The value, if it was built (one acquire load).
    #[inline(always)]
    pub fn get(&self) -> Option<&'static T> {
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: `current` is null or a pointer from Box::leak (`get_or_try_build`), never
        // freed, so the value lives as long as the process.
        (!current.is_null()).then(|| unsafe { &*current })
    }

    /// The value, built by `build` under a lock if it is not yet. When `build` gives
    /// `None` nothing is kept, and the next call tries again. Once a value is kept,
    /// `forget` runs in every child forked from then on: it calls
    /// [`PerProcess::forget_in_child`] on this cell (and resets what goes with it).
    #[cold]
    pub fn get_or_try_build(&self, build: impl FnOnce() -> Option<T>, forget: fn()) -> Option<&'static T> {
        let _guard = self.building.lock();
        if let Some(built) = self.get() {
            return Some(built);
        }
        let value = build()?;
        fork::on_child(forget);
        let value: &'static T = Box::leak(Box::new(value));
        self.current.store(value as *const T as *mut T, Ordering::Release);
        Some(value)
    }

    /// [`PerProcess::get_or_try_build`] for a value that is always built.
    #[cold]
    pub fn get_or_build(&self, build: impl FnOnce() -> T, forget: fn()) -> &'static T {
        self.get_or_try_build(|| Some(build()), forget).expect("a value built every time is kept")
    }

    /// In a forked child: the parent's value is dropped from sight (not freed: it is the
    /// parent's, and a copy left in the child costs nothing), and the build lock, which a
    /// thread that does not exist in the child may have held, is freed. Only
    /// async-signal-safe work.
    pub fn forget_in_child(&self) {
        self.current.store(null_mut(), Ordering::Release);
        if self.building.is_locked() {
            // SAFETY: the thread that held the lock does not exist in the child; nobody will
            // unlock it.
            unsafe { self.building.force_unlock() };
        }
    }
}
