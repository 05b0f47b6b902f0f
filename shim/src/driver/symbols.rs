//! Finding the real driver functions without going through our own `dlsym`.
//!
//! Every symbol of `fgpu_abi::prototypes!` has one entry in [`Sym`]. Its real address
//! comes from, in order: what the program itself got back from `dlsym`/`cuGetProcAddress`
//! (remembered by those hooks, so a driver loaded from an unusual path is still the one
//! called), or our own `dlopen` of `libcuda.so.1` / `libnvidia-ml.so.1` looked up with
//! glibc's `dlsym`, which `fgpu_core::sys::glibc_symbol` finds past our own `dlsym`
//! hook. An address inside this library (one of its own exported hooks) is never taken
//! for the driver's.

use fgpu_abi::prototypes;
use std::ffi::{c_char, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

pub use fgpu_core::sys::DlsymFn;

/// glibc's `dlsym`, set on first use by [`fgpu_init_real_dlsym`] (the naked `dlsym` hook
/// reads it directly).
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// The library a symbol lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

macro_rules! symbol_table {
    ($( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => {
        /// Every driver function the shim calls (`fgpu_abi::prototypes!`).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Sym { $( $name, )* }

        /// Every [`Sym`], in declaration order.
        pub const ALL: &[Sym] = &[ $( Sym::$name, )* ];

        impl Sym {
            /// NUL-terminated symbol name.
            pub fn c_name(self) -> &'static str {
                match self {
                    $( Sym::$name => concat!(stringify!($name), "\0"), )*
                }
            }

            pub fn lib(self) -> Lib {
                match self {
                    $( Sym::$name => Lib::$lib, )*
                }
            }
        }
    };
}

prototypes!(symbol_table);

impl Sym {
    pub fn name(self) -> &'static str {
        let c = self.c_name();
        &c[..c.len() - 1]
    }

    /// The symbol with this exact name.
    pub fn by_name(name: &[u8]) -> Option<Sym> {
        ALL.iter().copied().find(|s| s.name().as_bytes() == name)
    }
}

static REAL: [AtomicPtr<c_void>; ALL.len()] = [const { AtomicPtr::new(null_mut()) }; ALL.len()];

/// `Sym` discriminants follow declaration order, which is also the order of `ALL`.
fn index(sym: Sym) -> usize {
    sym as usize
}

const _: () = {
    let mut i = 0;
    while i < ALL.len() {
        assert!(ALL[i] as usize == i);
        i += 1;
    }
};

/// Resolves glibc's `dlsym`. Called once by the `dlsym` entry point (and by anyone else
/// needing it first). Returns null only if glibc has no `dlsym` at any known version. Not
/// exported: a program that could call it would get glibc's `dlsym`, and through it the
/// driver's functions uncapped.
pub extern "C" fn fgpu_init_real_dlsym() -> *mut c_void {
    let current = REAL_DLSYM.load(Ordering::Acquire);
    if !current.is_null() {
        return current;
    }
    let found = fgpu_core::sys::glibc_symbol(c"dlsym");
    if !found.is_null() {
        REAL_DLSYM.store(found, Ordering::Release);
    }
    found
}

/// Calls glibc's `dlsym`.
///
/// # Safety
/// `dlsym(3)`'s contract: `handle` from `dlopen` (or a pseudo-handle), `name` NUL-terminated.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = fgpu_init_real_dlsym();
    if f.is_null() {
        return null_mut();
    }
    // SAFETY: `f` is glibc's dlsym (resolved above), whose C signature DlsymFn matches; the
    // caller upholds dlsym's contract for the arguments.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f)(handle, name) }
}

struct Handle(*mut c_void);
// SAFETY: a dlopen handle is an opaque token usable from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above; it is never dereferenced by us.
unsafe impl Sync for Handle {}

fn library(lib: Lib) -> *mut c_void {
    static CUDA: OnceLock<Handle> = OnceLock::new();
    static NVML: OnceLock<Handle> = OnceLock::new();
    let (cell, name) = match lib {
        Lib::Cuda => (&CUDA, c"libcuda.so.1"),
        Lib::Nvml => (&NVML, c"libnvidia-ml.so.1"),
    };
    cell.get_or_init(|| {
        // SAFETY: models dlopen(3) with a NUL-terminated soname; null on failure.
        Handle(unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) })
    })
    .0
}

/// Whether the driver library can be loaded at all in this process.
pub fn library_present(lib: Lib) -> bool {
    !library(lib).is_null()
}

/// The object (its load address) that `address` lies in, null if none.
fn object_of(address: *const c_void) -> *mut c_void {
    // SAFETY: all-zero bytes are a valid Dl_info (null pointers).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: models dladdr(3): it only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(address, &mut info) } == 0 {
        return null_mut();
    }
    info.dli_fbase
}

/// Whether `address` lies in this library: one of its own exported hooks, which is never
/// the driver's function (a lookup through `RTLD_DEFAULT` finds the preloaded shim first).
fn is_ours(address: *mut c_void) -> bool {
    let own = object_of(is_ours as *const c_void);
    !own.is_null() && object_of(address) == own
}

/// The real address of `sym`, or null if the driver does not have it.
#[inline(always)]
pub fn get(sym: Sym) -> *mut c_void {
    let known = REAL[index(sym)].load(Ordering::Acquire);
    if !known.is_null() {
        return known;
    }
    resolve(sym)
}

#[cold]
fn resolve(sym: Sym) -> *mut c_void {
    let handle = library(sym.lib());
    if handle.is_null() {
        return null_mut();
    }
    // SAFETY: a live dlopen handle and a NUL-terminated name from the symbol table.
    let found = unsafe { real_dlsym(handle, sym.c_name().as_ptr().cast()) };
    if !found.is_null() && !is_ours(found) {
        REAL[index(sym)].store(found, Ordering::Release);
        return found;
    }
    null_mut()
}

/// Records the address a program got for `sym` from the driver, if we had none yet.
pub fn remember(sym: Sym, address: *mut c_void) {
    if address.is_null() || is_ours(address) {
        return;
    }
    let _ = REAL[index(sym)].compare_exchange(null_mut(), address, Ordering::AcqRel, Ordering::Acquire);
}
