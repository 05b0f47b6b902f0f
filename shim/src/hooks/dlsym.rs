//! `dlsym`: a lookup through a `dlopen` handle never finds a preloaded definition, so
//! programs that `dlopen` the driver (nvidia-smi, pynvml, cudart) would bypass every hook.
//! We look the name up with the real `dlsym` and, when it found one of the driver functions
//! we wrap, hand back our wrapper instead.
//!
//! `dlsym(RTLD_NEXT, ...)` is resolved relative to the *calling* object. Such calls are
//! forwarded with a tail jump from a naked entry point, so glibc still sees the original
//! caller's return address (a normal call would make the shim the caller and return the
//! wrong symbol: see the field notes on LLVM OpenMP).

use super::table;
use crate::driver::symbols::{self, fgpu_init_real_dlsym, REAL_DLSYM};
use std::ffi::{c_char, c_void, CStr};

/// The exported `dlsym`.
///
/// # Safety
/// Same contract as glibc's `dlsym(3)`: `handle` is a handle from `dlopen`, `RTLD_DEFAULT`
/// or `RTLD_NEXT`, and `symbol` a NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // rdi = handle, rsi = symbol. RTLD_NEXT is (void *)-1.
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "2:",
        "cmp rdi, -1",
        "jne {hook}",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {init}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2b",
        "ret",
        real = sym REAL_DLSYM,
        hook = sym dlsym_hook,
        init = sym fgpu_init_real_dlsym,
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
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "2:",
        "cmn x0, #1",
        "b.ne {hook}",
        "br x16",
        "3:",
        "stp x29, x30, [sp, #-32]!",
        "stp x0, x1, [sp, #16]",
        "bl {init}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x16, 2b",
        "mov x0, #0",
        "ret",
        real = sym REAL_DLSYM,
        hook = sym dlsym_hook,
        init = sym fgpu_init_real_dlsym,
    )
}

/// Every lookup that is not `RTLD_NEXT` lands here.
extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: forwarded unchanged from our caller, who owes dlsym's contract.
    let found = unsafe { symbols::real_dlsym(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    super::guard(found, || {
        // SAFETY: glibc's dlsym just accepted `symbol` as a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
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
    })
}
