//! The dynamic loader's lookup functions never hand a capped program the driver uncapped
//! (docs/security.md, "What the workload cannot do to its own cap"). The second security
//! review found `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` returning glibc's own `dlsym`,
//! through which six 512 MiB allocations passed a 1 GiB cap. Every route a program can take
//! to a driver function through `dlsym` or `dlvsym` is tried here, with the front and with
//! the shim preloaded directly, with lazy and with immediate binding (`LD_BIND_NOW=1`).

use fgpu_tests::*;
use std::path::PathBuf;

/// The routes of `tests/clients/lookup_escape.c` that find a function on this glibc, and
/// those that find none here (names older glibc exported, versioned lookups of unversioned
/// driver functions), which must stay so.
const FOUND: [&str; 13] = [
    "dlvsym-next-dlsym",
    "dlvsym-default-dlsym",
    "dlvsym-libc-dlsym",
    "dlsym-libc-dlsym",
    "dlsym-next-dlsym",
    "dlvsym-next-dlvsym",
    "dlvsym-libc-dlvsym",
    "dlsym-libc-dlvsym",
    "dlvsym-next",
    "dlsym-next",
    "library-next",
    "library-next-dlvsym",
    "nvml-dlvsym-next-dlsym",
];
const ABSENT_OR_CAPPED: [&str; 5] = ["dlsym-private-dlsym", "dlsym-private-dl-sym", "dlvsym-handle", "dlvsym-default", "nvml-dlvsym"];

/// The client and the library it loads (which needs libcuda.so.1 and asks for the next
/// cuMemAlloc_v2 after itself), built once.
fn escape_client() -> (PathBuf, PathBuf) {
    let program = client("lookup_escape");
    let dir = release_dir().join("test-clients").join("lookup-next");
    std::fs::create_dir_all(&dir).unwrap();
    let library = dir.join("libfgpu_lookup_next.so");
    let mut cc = std::process::Command::new("cc");
    cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-DROLE_LIBRARY", "-o"]).arg(&library).arg(workspace().join("tests/clients/lookup_escape.c"));
    cc.arg(format!("-L{}", sim_lib_dir().display())).args(["-l:libcuda.so.1", "-ldl"]);
    Cmd(cc).success();
    (program, dir)
}

/// What one route gave: the return codes of the six allocations, NVML's total, or nothing.
fn outcome(run: &Run) -> String {
    let stdout = run.stdout();
    let rcs: Vec<String> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap()).collect();
    if !rcs.is_empty() {
        return format!("alloc {}", rcs.join(","));
    }
    if stdout.contains("nvml total=") {
        return format!("nvml {}", run.field("nvml", "total"));
    }
    assert!(stdout.contains("absent"), "the route neither allocated nor said it found nothing\n{run}");
    "absent".into()
}

#[test]
fn no_lookup_route_reaches_the_driver_uncapped() {
    let env = Env::new("lookup-escape");
    let (program, library_dir) = escape_client();
    let capped_alloc = "alloc 0,2,2,2,2,2"; // 300 MiB context + 512 MiB fit 1 GiB, no more
    let capped_nvml = format!("nvml {GIB}");
    let lib_path = |cmd: Cmd| {
        let path = format!("{}:{}", library_dir.display(), sim_lib_dir().display());
        cmd.env("LD_LIBRARY_PATH", path)
    };
    // Without fgpu each route that finds a function reaches the whole GPU: the test's
    // routes are real ways through, not ones that fail anyway.
    for route in FOUND {
        let bare = lib_path(env.command(&program).arg(route)).limit("1G").success();
        let expected = if route.starts_with("nvml") { format!("nvml {}", 80 * GIB) } else { "alloc 0,0,0,0,0,0".into() };
        // glibc's dlvsym never finds an unversioned driver function: those two find
        // nothing without fgpu, and fgpu's entry point with it (never the driver's own).
        if !["dlvsym-next", "library-next-dlvsym"].contains(&route) {
            assert_eq!(outcome(&bare), expected, "without fgpu, route {route}\n{bare}");
        }
    }
    let shim = shim_library_path();
    for (preload, what) in [(front_path(), "the front"), (shim, "the shim preloaded directly")] {
        for bind_now in ["", "1"] {
            for route in FOUND.iter().chain(&ABSENT_OR_CAPPED) {
                let run = lib_path(env.command(&program).arg(route)).env("LD_PRELOAD", &preload).env("LD_BIND_NOW", bind_now).limit("1G").success();
                let got = outcome(&run);
                let capped = if route.starts_with("nvml") { capped_nvml.as_str() } else { capped_alloc };
                let ok = if FOUND.contains(route) { got == capped } else { got == "absent" || got == capped };
                assert!(ok, "route {route} under {what} (LD_BIND_NOW={bind_now:?}) got {got:?}, not {capped:?}\n{run}");
            }
        }
    }
}

/// `dlvsym(RTLD_NEXT, ...)` of a name fgpu does not hook is resolved relative to the real
/// caller, as `dlsym`'s is (`entry_paths::rtld_next_resolves_relative_to_the_real_caller`):
/// a library asks for the next versioned definition of a marker after itself.
#[test]
fn dlvsym_rtld_next_resolves_relative_to_the_real_caller() {
    let env = Env::new("lookup-rtld-next");
    let dir = env.dir.join("libs");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("marker.map");
    std::fs::write(&script, "FGPU_MARKER_1 { global: fgpu_marker; probe_next; local: *; };\n").unwrap();
    let source = dir.join("marker.c");
    std::fs::write(
        &source,
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\n\
         #if defined(FIRST)\nint fgpu_marker(void) { return 1; }\n\
         int probe_next(void) { int (*next)(void) = (int (*)(void))dlvsym(RTLD_NEXT, \"fgpu_marker\", \"FGPU_MARKER_1\"); return next ? next() : -1; }\n\
         #elif defined(SECOND)\nint fgpu_marker(void) { return 2; }\n\
         #else\nint probe_next(void);\nint main(void) { printf(\"next=%d\\n\", probe_next()); return 0; }\n#endif\n",
    )
    .unwrap();
    let build = |define: &str, out: &str, extra: &[&str]| {
        let mut cc = std::process::Command::new("cc");
        cc.args(["-O1", &format!("-D{define}"), "-o"]).arg(dir.join(out)).arg(&source).args(extra);
        Cmd(cc).success();
    };
    let version_script = format!("-Wl,--version-script={}", script.display());
    build("SECOND", "libfgpu_marker_second.so", &["-shared", "-fPIC", &version_script]);
    build("FIRST", "libfgpu_marker_first.so", &["-shared", "-fPIC", &version_script]);
    let program = dir.join("marker");
    let link = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    build("MAIN", "marker", &[&link, "-Wl,--no-as-needed", "-l:libfgpu_marker_first.so", "-l:libfgpu_marker_second.so", "-ldl", &rpath]);
    let bare = env.command(&program).success();
    assert_eq!(bare.stdout().trim(), "next=2", "the program itself is right\n{bare}");
    for preload in [front_path(), shim_library_path()] {
        for bind_now in ["", "1"] {
            let run = env.command(&program).env("LD_PRELOAD", &preload).env("LD_BIND_NOW", bind_now).limit("8G").success();
            assert_eq!(run.stdout().trim(), "next=2", "{} (LD_BIND_NOW={bind_now:?})\n{run}", preload.display());
        }
    }
}

/// `fgpu doctor`'s look at the driver (the hidden `fgpu __driver-probe`) must see the
/// driver as it is, around a preloaded front: it takes glibc's `dlsym` from libc's symbol
/// table, since asking `dlvsym` for it would now land in the front, which answers with its
/// own.
#[test]
fn the_driver_probe_sees_the_whole_gpu_around_a_preloaded_front() {
    let env = Env::new("lookup-probe");
    for bind_now in ["", "1"] {
        let run = env.command(fgpu_bin()).arg("__driver-probe").env("LD_PRELOAD", front_path()).env("LD_BIND_NOW", bind_now).limit("1G").success();
        let probe: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"));
        assert_eq!(probe["devices"][0]["total_bytes"], 80 * GIB, "LD_BIND_NOW={bind_now:?}\n{run}");
        assert_eq!(run.stderr(), "", "{run}");
    }
}
