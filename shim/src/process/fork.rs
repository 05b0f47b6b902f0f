//! One `pthread_atfork` child handler for the whole shim. A forked child is a new process:
//! each part that keeps per-process state (`lifecycle.rs`: the process's mode and ledger,
//! its accounting, the compute limiter) registers a reset here, run in the child in the
//! order registered. A reset runs in a child of a multi-threaded parent: only
//! async-signal-safe calls.

use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

/// Room for every part that registers (three today).
const SLOTS: usize = 4;

static RESETS: [AtomicPtr<()>; SLOTS] = [const { AtomicPtr::new(null_mut()) }; SLOTS];

/// Runs `reset` in every child forked from now on (once, however often it is registered).
pub fn on_child(reset: fn()) {
    static HANDLER: Once = Once::new();
    HANDLER.call_once(|| {
        // SAFETY: models pthread_atfork(3) with only a child handler, a plain extern "C" fn.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    let address = reset as *mut ();
    for slot in &RESETS {
        match slot.compare_exchange(null_mut(), address, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(present) if present == address => return,
            Err(_) => {}
        }
    }
    debug_assert!(false, "fork.rs: more parts register than SLOTS");
}

extern "C" fn after_fork_in_child() {
    for slot in &RESETS {
        let address = slot.load(Ordering::Acquire);
        if address.is_null() {
            return;
        }
        // SAFETY: only `on_child` stores here, and only addresses of `fn()` items.
        let reset = unsafe { std::mem::transmute::<*mut (), fn()>(address) };
        reset();
    }
}
