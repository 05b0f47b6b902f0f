//! `dlsym` and `dlvsym`: a lookup through a `dlopen` handle never finds a preloaded
//! definition, so programs that `dlopen` the driver (nvidia-smi, pynvml, cudart) would
//! bypass every hook. We look the name up with glibc's own function and, when it found one
//! of the driver functions we wrap, hand back our wrapper instead.
//!
//! Three more answers close the ways around that:
//! - a lookup of glibc's lookup functions themselves (`dlsym`, `dlvsym`, and the names
//!   older glibc exported them under) through any handle or version gets ours: glibc's
//!   would find the driver's functions unwrapped;
//! - `dlvsym` is hooked as `dlsym` is: a version string changes nothing;
//! - an `RTLD_NEXT` lookup of a wrapped name gets the wrapper: the next definition after a
//!   library placed before the driver is the driver's own.
//!
//! Every other `dlsym(RTLD_NEXT, ...)` and `dlvsym(RTLD_NEXT, ...)` is resolved relative to
//! the *calling* object. Such calls are forwarded with a tail jump from a naked entry point,
//! so glibc still sees the original caller's return address (a normal call would make the
//! shim the caller and return the wrong symbol: see the field notes on LLVM OpenMP).
//!
//! This is what the front (`front/src/lookups.c`) does too; these serve a process that
//! preloads the shim directly, and the lookups of wrapped names the front hands over.

use super::table;
use crate::driver::symbols::{self, fgpu_init_real_dlsym};
use std::ffi::{c_char, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The exported `dlsym`: asks [`dlsym_route`] where to go with its two arguments and jumps
/// there, so that glibc's `dlsym`, when that is the answer, sees the original caller.
///
/// # Safety
/// Same contract as glibc's `dlsym(3)`: `handle` is a handle from `dlopen`, `RTLD_DEFAULT`
/// or `RTLD_NEXT`, and `symbol` a NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // rdi = handle, rsi = symbol; three words keep the stack 16-byte aligned at the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlsym_route,
    )
}

/// The exported `dlsym` (aarch64: x0 = handle, x1 = symbol).
///
/// # Safety
/// As for the x86_64 version.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16",
        route = sym dlsym_route,
    )
}

/// The exported `dlvsym`: as [`dlsym`], with the version as third argument.
///
/// # Safety
/// Same contract as glibc's `dlvsym(3)`: as `dlsym`'s, and `version` a NUL-terminated
/// string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    // rdi, rsi, rdx; three pushes keep the stack 16-byte aligned at the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlvsym_route,
    )
}

/// The exported `dlvsym` (aarch64: x0 = handle, x1 = symbol, x2 = version).
///
/// # Safety
/// As for the x86_64 version.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        route = sym dlvsym_route,
    )
}

/// `RTLD_NEXT` (dlfcn.h).
const RTLD_NEXT: *mut c_void = libc::RTLD_NEXT;

/// The answer to a lookup that finds nothing: takes the caller's arguments, returns null.
extern "C" fn find_nothing() -> *mut c_void {
    null_mut()
}

/// The names glibc has exported its lookup functions under (`__libc_dlsym`, `_dl_sym` and
/// their versioned twins before glibc 2.34): a lookup of one gets ours, `dlsym`-like (handle
/// and name) or `dlvsym`-like (and a version).
fn own_lookup_function(name: &[u8]) -> Option<*mut c_void> {
    match name {
        b"dlsym" | b"__libc_dlsym" | b"_dl_sym" => Some(dlsym as *mut c_void),
        b"dlvsym" | b"__libc_dlvsym" | b"_dl_vsym" => Some(dlvsym as *mut c_void),
        _ => None,
    }
}

/// What a lookup of `name` that found `found` answers: ours for glibc's lookup functions,
/// the wrapper for a wrapped driver function (remembering the driver's), else `found`.
fn answer(name: &[u8], found: *mut c_void) -> *mut c_void {
    if let Some(own) = own_lookup_function(name) {
        return own;
    }
    // Cheap filter first: Rust's std and most programs look up other names.
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return found;
    }
    match table::hooked_by_name(name) {
        Some(sym) => {
            symbols::remember(sym, found);
            table::wrapper(sym).unwrap_or(found)
        }
        None => found,
    }
}

/// Whether an `RTLD_NEXT` lookup of `name` is answered here rather than by glibc.
fn answered_here(name: *const c_char) -> bool {
    if name.is_null() {
        return false;
    }
    // SAFETY: the caller passed a NUL-terminated name, as dlsym's contract says.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    own_lookup_function(name).is_some() || ((name.starts_with(b"cu") || name.starts_with(b"nvml")) && table::hooked_by_name(name).is_some())
}

/// The answer to an `RTLD_NEXT` lookup of a name [`answered_here`]: ours, or the wrapper
/// (which finds the driver's function itself; nothing is remembered from the caller).
extern "C" fn next_answer(_handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    super::guard(null_mut(), || {
        // SAFETY: checked non-null and NUL-terminated by `answered_here` before routing here.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        own_lookup_function(name).or_else(|| table::hooked_by_name(name).and_then(table::wrapper)).unwrap_or(null_mut())
    })
}

/// Called by the exported `dlsym` with its arguments: where to continue with them.
extern "C" fn dlsym_route(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let real = fgpu_init_real_dlsym();
    if real.is_null() {
        return find_nothing as *mut c_void;
    }
    super::guard(real, || {
        if handle != RTLD_NEXT {
            dlsym_hook as *mut c_void
        } else if answered_here(symbol) {
            next_answer as *mut c_void
        } else {
            real
        }
    })
}

/// Every `dlsym` lookup that is not `RTLD_NEXT` lands here.
extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: forwarded unchanged from our caller, who owes dlsym's contract.
    let found = unsafe { symbols::real_dlsym(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: glibc's dlsym just accepted `symbol` as a NUL-terminated string.
    super::guard(found, || answer(unsafe { CStr::from_ptr(symbol) }.to_bytes(), found))
}

/// glibc's `dlvsym`, found on first use (from libc's symbol table: calling `dlvsym` would
/// land in a hook).
fn real_dlvsym() -> *mut c_void {
    static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let current = REAL_DLVSYM.load(Ordering::Acquire);
    if !current.is_null() {
        return current;
    }
    let found = fgpu_core::sys::glibc_symbol(c"dlvsym");
    if !found.is_null() {
        REAL_DLVSYM.store(found, Ordering::Release);
    }
    found
}

/// Called by the exported `dlvsym` with its arguments: where to continue with them.
extern "C" fn dlvsym_route(handle: *mut c_void, symbol: *const c_char, _version: *const c_char) -> *mut c_void {
    let real = real_dlvsym();
    if real.is_null() {
        return find_nothing as *mut c_void;
    }
    super::guard(real, || {
        if handle != RTLD_NEXT {
            dlvsym_hook as *mut c_void
        } else if answered_here(symbol) {
            next_answer as *mut c_void
        } else {
            real
        }
    })
}

/// Every `dlvsym` lookup that is not `RTLD_NEXT` lands here.
extern "C" fn dlvsym_hook(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    let real = real_dlvsym();
    // SAFETY: glibc's dlvsym (the route found it), whose C prototype DlvsymFn is, with the
    // caller's arguments, who owes dlvsym's contract.
    let found = unsafe { std::mem::transmute::<*mut c_void, fgpu_core::sys::DlvsymFn>(real)(handle, symbol, version) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: glibc's dlvsym just accepted `symbol` as a NUL-terminated string.
    super::guard(found, || answer(unsafe { CStr::from_ptr(symbol) }.to_bytes(), found))
}
