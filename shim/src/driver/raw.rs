//! One forwarder per driver function of `fgpu_abi::prototypes!`:
//! `raw::cuMemAlloc_v2(dptr, bytesize)` calls the real `cuMemAlloc_v2` with those arguments,
//! through its prototype in [`proto`] (`fgpu_abi`'s), and is `None` when the driver lacks
//! the symbol. The hooks pass their callers' arguments on through these; `cuda.rs` and
//! `nvml.rs` build the shim's own calls on them. Nothing else in the shim calls a driver
//! function.

// The forwarders pass their own plain parameters into the FFI call's unsafe block.
#![allow(clippy::macro_metavars_in_unsafe)]

use super::symbols::{get, Sym};
#[allow(unused_imports)]
use crate::abi::cuda::*;
#[allow(unused_imports)]
use crate::abi::nvml::*;
use fgpu_abi::prototypes;
pub use fgpu_abi::prototypes::proto;
#[allow(unused_imports)]
use std::ffi::{c_char, c_float, c_int, c_uint, c_void};

/// Calls the real `$sym` through its prototype in [`proto`]: `None` when the driver lacks
/// it. Used by the forwarders below, and nowhere else.
macro_rules! call_real {
    ($sym:ident $(, $arg:expr)*) => {{
        let address = get(Sym::$sym);
        if address.is_null() {
            None
        } else {
            // SAFETY: `address` is the driver's own implementation of this symbol, whose C
            // prototype (cuda.h, nvml.h) is the one declared in `fgpu_abi` (checked against
            // NVIDIA's headers by tests/integration/abi_layout.rs).
            let f = unsafe { std::mem::transmute::<*mut c_void, proto::$sym>(address) };
            // SAFETY: the forwarder's caller owes the C contract of the call for these
            // arguments (its own safety section).
            Some(unsafe { f($($arg),*) })
        }
    }};
}

macro_rules! forwarders {
    ($( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => {
        $(
            #[doc = concat!("The real `", stringify!($name), "`; `None` when the driver lacks it.")]
            ///
            /// # Safety
            /// The C contract of the call (cuda.h, nvml.h) for these arguments.
            #[inline(always)]
            #[allow(clippy::too_many_arguments)] // the C prototype's
            pub unsafe fn $name($($arg: $ty),*) -> Option<$ret> {
                call_real!($name $(, $arg)*)
            }
        )*
    };
}

prototypes!(forwarders);

#[cfg(test)]
mod tests {
    /// The driver is called from here only: no `call_real!` outside `src/driver/`.
    #[test]
    fn call_real_is_used_under_driver_only() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut dirs = vec![src.clone()];
        let mut found = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if !path.starts_with(src.join("driver")) && std::fs::read_to_string(&path).unwrap().contains(concat!("call_real", "!")) {
                    found.push(path.display().to_string());
                }
            }
        }
        assert!(found.is_empty(), "call_real! outside src/driver/: {found:?}");
    }
}
