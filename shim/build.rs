//! Links the unwinder into libfgpu.so instead of depending on `libgcc_s.so.1`.
//!
//! Rust's standard library on `*-linux-gnu` asks for `-lgcc_s`, the shared unwinder. For a
//! library preloaded into every process of a container that costs twice: one more file to
//! find, map and relocate in every `sh` and `ls`, and libgcc_s's constructor, which runs
//! `cpuid` (a trap to the hypervisor on a virtual machine). GCC's static unwinder
//! (`libgcc_eh.a`, what `gcc -static-libgcc` links) does the same job from inside the
//! library: linked whole, it defines every `_Unwind_*` symbol before `-lgcc_s` is reached,
//! so `--as-needed` drops the dependency. Panics are still caught at every hook (the
//! integration test `panic_in_the_shim_is_caught` proves the unwinder works).
//!
//! Used only when the linker is a GCC-style driver that knows where `libgcc_eh.a` is;
//! otherwise (zig, used by `scripts/build-release.sh`, which brings its own unwinder; a
//! cross build without a target `cc`) the default stands.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    println!("cargo:rerun-if-env-changed=FGPU_SHARED_UNWINDER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" || std::env::var_os("FGPU_SHARED_UNWINDER").is_some() {
        return;
    }
    let linker = match std::env::var("RUSTC_LINKER") {
        Ok(linker) => linker,
        // The default linker driver is the host's `cc`: right only for a native build.
        Err(_) if var("TARGET") == var("HOST") => "cc".to_string(),
        Err(_) => return,
    };
    let triple = var("TARGET").replace('-', "_");
    let zig = [linker.clone(), var(&format!("CARGO_TARGET_{}_LINKER", triple.to_uppercase())), var(&format!("CC_{triple}"))];
    if zig.iter().any(|tool| tool.contains("zig")) {
        return;
    }
    let Some(archive) = Command::new(&linker)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|path| path.is_absolute() && path.is_file())
    else {
        println!("cargo:warning=libgcc_eh.a not found through {linker}; libfgpu.so will depend on libgcc_s.so.1");
        return;
    };
    let dir = archive.parent().expect("an absolute file path has a parent");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static:+whole-archive=gcc_eh");
}
