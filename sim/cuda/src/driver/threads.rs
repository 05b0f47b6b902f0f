//! What each thread has of its own: its number and its stack of current contexts.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    static THREAD_NUMBER: Cell<usize> = const { Cell::new(0) };
}

/// A number for the calling thread, unique in the process (names its per-thread stream).
pub fn thread_number() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    THREAD_NUMBER.with(|n| {
        if n.get() == 0 {
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

pub fn ctx_top() -> usize {
    CTX_STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}
pub fn ctx_set_top(h: usize) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if h == 0 {
            s.pop();
        } else if let Some(t) = s.last_mut() {
            *t = h;
        } else {
            s.push(h);
        }
    })
}
pub fn ctx_push(h: usize) {
    CTX_STACK.with(|s| s.borrow_mut().push(h))
}
pub fn ctx_pop() -> Option<usize> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}
pub fn ctx_pop_if_top(h: usize) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if s.last() == Some(&h) {
            s.pop();
        }
    })
}
