//! The front of fgpu's preloaded library.
//!
//! `libfgpu.so`, the file that is preloaded into every process (`LD_PRELOAD`,
//! `/etc/ld.so.preload`, `fgpu run`), is not the shim itself but a small C library
//! (`src/*.c`, built by `build.rs` with the target's C compiler and written beside the
//! other build outputs, e.g. `target/release/libfgpu.so`). It exports every entry point
//! the shim hooks and loads the shim, `libfgpu_shim.so` from the same directory, on the
//! first call to one of them; a process that never makes one pays little more than for an
//! empty preloaded library (docs/benchmarks.md).
//!
//! This crate's Rust side only names things for the rest of the workspace.

#![no_std]

/// The file name of the front: what is preloaded.
pub const FRONT_FILE: &str = "libfgpu.so";

/// The file name of the shim, which the front loads from its own directory.
pub const SHIM_FILE: &str = "libfgpu_shim.so";

/// The entry points the front forwards to the shim (besides `dlsym` and `dlvsym`), as listed in
/// `front/exports.txt`: one name per line, `#` comments.
pub const EXPORTS_TXT: &str = include_str!("../exports.txt");

/// The names of [`EXPORTS_TXT`].
pub fn exports() -> impl Iterator<Item = &'static str> {
    EXPORTS_TXT.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn exports_are_c_identifiers_sorted_and_unique() {
        let mut previous = "";
        let mut count = 0;
        for name in super::exports() {
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{name}");
            assert!(!name.as_bytes()[0].is_ascii_digit(), "{name}");
            assert!(name > previous, "{name} after {previous}: keep exports.txt sorted and unique");
            assert!(name != "dlsym" && name != "dlvsym", "{name} is the front's own entry point");
            previous = name;
            count += 1;
        }
        assert!(count > 50, "{count} names");
    }
}
