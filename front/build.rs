//! Builds `libfgpu.so`, the front (`src/*.c`: `front.c` says what it is), with the target's C
//! compiler.
//!
//! The list of entry points comes from `exports.txt`: this script turns it into a C header
//! (sorted by byte value, so the front can binary-search it). The library is linked in
//! `OUT_DIR` and then copied beside the crate outputs of the build (`target/release/`,
//! `target/<triple>/release/`), next to `libfgpu_shim.so`, because that is where it is
//! used: the tests, the benchmark and `fgpu run` preload `libfgpu.so` from there, and the
//! front loads the shim from its own directory. Cargo has no other way to hand out a
//! library that is not a Rust crate.
//!
//! Link choices, all for the start-up of processes that never touch a GPU:
//! - `-nostartfiles`: no crtbegin/crtend, so no constructor, no `__cxa_finalize`,
//!   `_ITM_*` or `__gmon_start__` to bind;
//! - lazy binding (`-z lazy`): the few libc functions it calls (`getenv`, `write`,
//!   `dl_iterate_phdr`, ...) are bound on first call, which most processes never make;
//! - `-fvisibility=hidden`: only the entry points are exported.
//!
//! The compiler is what the `cc` crate picks for the target (`CC_<target>`, `CC`, else
//! `cc`); `scripts/build-release.sh` builds through cargo-zigbuild, whose zig compiler
//! links against glibc 2.17's libraries.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The front's C files: the table and the loading of the shim, the entry points, glibc's
/// own lookup functions, and the front's dlsym and dlvsym.
const SOURCES: [&str; 4] = ["front.c", "entries.c", "glibc.c", "lookups.c"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for file in SOURCES.iter().chain(["front.h"].iter()) {
        println!("cargo:rerun-if-changed=src/{file}");
    }
    println!("cargo:rerun-if-changed=exports.txt");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let list = std::fs::read_to_string(manifest.join("exports.txt")).unwrap_or_else(|e| panic!("front/exports.txt: {e}"));
    std::fs::write(out.join("fgpu_front_exports.h"), header(&list)).expect("write fgpu_front_exports.h");

    let target = std::env::var("TARGET").unwrap_or_default();
    if !(target.starts_with("x86_64-") || target.starts_with("aarch64-")) || !target.contains("-linux-") {
        println!("cargo:warning=libfgpu.so (the front) is built for x86_64 and aarch64 Linux only, not {target}");
        return;
    }
    let built = out.join("libfgpu.so");
    let compiler = cc::Build::new().pic(true).opt_level(2).warnings(true).cargo_metadata(false).get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-shared", "-fvisibility=hidden", "-Wall", "-Wextra"]);
    // zig links no start files into a shared library anyway, and warns about the flag.
    if !compiler.path().to_string_lossy().contains("zig") {
        cmd.arg("-nostartfiles");
    }
    cmd.args(["-Wl,-soname,libfgpu.so", "-Wl,-z,lazy", "-Wl,-z,noexecstack", "-Wl,--gc-sections"])
        .arg("-I")
        .arg(&out)
        .arg("-o")
        .arg(&built)
        .args(SOURCES.iter().map(|file| manifest.join("src").join(file)));
    let output = cmd.output().unwrap_or_else(|e| panic!("cannot run the C compiler for the front ({cmd:?}): {e}"));
    if !output.status.success() {
        panic!(
            "building libfgpu.so failed ({}):\n{cmd:?}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for line in String::from_utf8_lossy(&output.stderr).lines().filter(|l| l.contains("warning")) {
        println!("cargo:warning={line}");
    }
    place(&built, &out);
}

/// The C header of the entry points: FGPU_FRONT_COUNT, FGPU_FRONT_EXPORTS(X), and, where
/// FGPU_FRONT_TABLES is defined (front.c), the names in one string with each one's offset,
/// and each one's family.
fn header(list: &str) -> String {
    let mut names: Vec<&str> = list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    for name in &names {
        let ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !name.as_bytes()[0].is_ascii_digit();
        assert!(ok, "front/exports.txt: {name:?} is not a C identifier");
        assert!(*name != "dlsym" && *name != "dlvsym", "front/exports.txt: {name} is the front's own entry point, do not list it");
    }
    names.sort_unstable();
    names.dedup();
    assert!(!names.is_empty() && names.len() < u16::MAX as usize, "front/exports.txt: {} names", names.len());
    let family = |name: &str| {
        if name.starts_with("nvml") {
            "FAMILY_NVML"
        } else if name.starts_with("cu") {
            "FAMILY_CUDA"
        } else {
            "FAMILY_OTHER"
        }
    };
    let mut h = String::from("/* Generated by front/build.rs from front/exports.txt. */\n");
    writeln!(h, "#define FGPU_FRONT_SHIM_FILE \"libfgpu_shim.so\"").unwrap();
    writeln!(h, "#define FGPU_FRONT_COUNT {}", names.len()).unwrap();
    h += "#define FGPU_FRONT_EXPORTS(X) \\\n";
    for (i, name) in names.iter().enumerate() {
        writeln!(h, "    X({i}, {name}, {}) \\", family(name)).unwrap();
    }
    h += "\n";
    h += "#ifdef FGPU_FRONT_TABLES\n";
    h += "static const char fgpu_front_names[] =\n";
    for name in &names {
        writeln!(h, "    \"{name}\\0\"").unwrap();
    }
    h += "    ;\n";
    h += "static const unsigned short fgpu_front_name_at[FGPU_FRONT_COUNT] = {";
    let mut at = 0;
    for name in &names {
        write!(h, " {at},").unwrap();
        at += name.len() + 1;
    }
    h += " };\n";
    h += "static const unsigned char fgpu_front_family[FGPU_FRONT_COUNT] = {";
    for name in &names {
        write!(h, " {},", family(name)).unwrap();
    }
    h += " };\n";
    h += "#endif\n";
    h
}

/// Copies the built library to `<target dir>/<profile>/libfgpu.so` (OUT_DIR is
/// `<that directory>/build/fgpu-front-<hash>/out`), through a temporary file and a rename,
/// so a test preloading it never sees half a file.
fn place(built: &Path, out: &Path) {
    let Some(dir) = out.ancestors().nth(3) else {
        println!("cargo:warning=cannot tell the build directory from OUT_DIR={}; libfgpu.so stays there", out.display());
        return;
    };
    let partial = dir.join(format!(".libfgpu.so.{}", std::process::id()));
    std::fs::copy(built, &partial).unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), partial.display()));
    std::fs::rename(&partial, dir.join("libfgpu.so")).unwrap_or_else(|e| panic!("rename {} into place: {e}", partial.display()));
}
