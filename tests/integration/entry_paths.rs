//! Every way a program reaches the driver sees the cap and is refused past it.

use fgpu_tests::*;

const MODES: [&str; 4] = ["procaddr", "procaddr1", "dlsym", "default"];

fn cap_seen(run: &Run) -> (u64, u64) {
    let total: u64 = run.field("info", "total").parse().unwrap();
    let device_total: u64 = run.field("total", "total").parse().unwrap();
    (total, device_total)
}

#[test]
fn every_resolution_path_sees_the_cap() {
    let env = Env::new("paths");
    for mode in MODES {
        let capped = env.client(&["--resolve", mode, "init", "primary", "info", "total"]).shim().limit("8G").success();
        assert_eq!(cap_seen(&capped), (8 * GIB, 8 * GIB), "{mode}\n{capped}");
        let bare = env.client(&["--resolve", mode, "init", "primary", "info", "total"]).success();
        assert_eq!(cap_seen(&bare).1, 80 * GIB, "without the shim the sim shows 80 GiB ({mode})\n{bare}");
    }
    let linked = env.command(client_with("cuclient", &["LINKED"])).args(["init", "primary", "info", "total"]).shim().limit("8G").success();
    assert_eq!(cap_seen(&linked), (8 * GIB, 8 * GIB), "{linked}");
}

#[test]
fn every_resolution_path_is_refused_past_the_cap() {
    let env = Env::new("paths-refused");
    // 300 MiB context + 1 GiB + 1 GiB > 2 GiB.
    for mode in MODES {
        let run = env.client(&["--resolve", mode, "init", "primary", "alloc", "1G", "alloc", "1G"]).shim().limit("2G").success();
        let rcs: Vec<i64> = run.lines("alloc").iter().map(|l| field(l, "rc").unwrap().parse().unwrap()).collect();
        assert_eq!(rcs, vec![0, 2], "{mode}\n{run}");
        assert!(run.stderr().contains("refused"), "{run}");
    }
    let linked = env.command(client_with("cuclient", &["LINKED"])).args(["init", "primary", "alloc", "1G", "alloc", "1G"]).shim().limit("2G").success();
    assert_eq!(linked.lines("alloc")[1], "alloc 1073741824 rc=2", "{linked}");
    let bare = env.client(&["init", "primary", "alloc", "1G", "alloc", "1G"]).limit("2G").success();
    assert_eq!(bare.lines("alloc")[1], "alloc 1073741824 rc=0", "without the shim nothing is refused\n{bare}");
}

#[test]
fn old_runtimes_and_per_thread_streams_get_matching_wrappers() {
    let env = Env::new("versions").driver_version("13000");
    for version in ["11040", "12000", "13000"] {
        for ptds in [false, true] {
            let mut args = vec!["--version", version];
            if ptds {
                args.push("--ptds");
            }
            args.extend(["init", "primary", "info", "alloc", "1G", "alloc", "1G", "async", "1G", "sync"]);
            let run = env.client(&args).shim().limit("2G").success();
            assert_eq!(run.field("info", "total"), (2 * GIB).to_string(), "{run}");
            assert_eq!(run.lines("alloc"), vec!["alloc 1073741824 rc=0", "alloc 1073741824 rc=2"], "{run}");
            assert_eq!(run.rc("async"), 2, "stream-ordered allocation past the cap ({version}, ptds={ptds})\n{run}");
        }
    }
}

#[test]
fn rtld_next_resolves_relative_to_the_real_caller() {
    let env = Env::new("rtld");
    let dir = release_dir().join("test-clients");
    std::fs::create_dir_all(&dir).unwrap();
    let source = workspace().join("tests/clients/rtld_next.c");
    for (role, name) in [("ROLE_FIRST", "libfgpu_rtld_first.so"), ("ROLE_SECOND", "libfgpu_rtld_second.so")] {
        let mut cc = std::process::Command::new("cc");
        cc.args(["-shared", "-fPIC", "-O1", &format!("-D{role}"), "-o"]).arg(dir.join(name)).arg(&source).arg("-ldl");
        Cmd(cc).success();
    }
    let program = dir.join("rtld_next");
    let mut cc = std::process::Command::new("cc");
    cc.arg("-o").arg(&program).arg(&source).arg(format!("-L{}", dir.display()));
    cc.args(["-Wl,--no-as-needed", "-l:libfgpu_rtld_first.so", "-l:libfgpu_rtld_second.so", "-ldl"]).arg(format!("-Wl,-rpath,{}", dir.display()));
    Cmd(cc).success();
    let bare = env.command(&program).success();
    assert_eq!(bare.stdout().trim(), "next=2", "the program itself is right\n{bare}");
    let run = env.command(&program).shim().limit("8G").success();
    assert_eq!(run.stdout().trim(), "next=2", "{run}");
}

/// Every hook catches panics (`hooks::guard`); that rests on the unwinder linked into the
/// library (`shim/build.rs`: GCC's static one, so no `libgcc_s.so.1` is loaded into every
/// process). A panic raised inside the preloaded shim must be caught there, silently.
#[test]
fn panic_in_the_shim_is_caught() {
    let env = Env::new("unwind");
    let probe = client("unwind_probe");
    let bare = env.command(&probe).run();
    assert_eq!(bare.output.status.code(), Some(3), "without the shim the probe finds nothing\n{bare}");
    let run = env.command(&probe).shim().limit("8G").success();
    assert_eq!(run.stdout().trim(), "caught 1", "{run}");
    assert_eq!(run.stderr(), "", "{run}");
    // The unwinder is in the shim (libfgpu_shim.so), not in the front, which is C.
    let eh = Cmd(std::process::Command::new("cc")).arg("-print-file-name=libgcc_eh.a").success();
    if std::path::Path::new(eh.stdout().trim()).is_absolute() {
        let needed = needed_libraries(&shim_library_path());
        assert!(!needed.iter().any(|n| n.starts_with("libgcc_s")), "libfgpu_shim.so should not need libgcc_s.so.1 when libgcc_eh.a exists: {needed:?}");
    }
}

/// The libraries an ELF file names as NEEDED (`readelf -d`).
fn needed_libraries(library: &std::path::Path) -> Vec<String> {
    let dynamic = Cmd(std::process::Command::new("readelf")).arg("-dW").arg(library).success();
    let needed: Vec<String> =
        dynamic.stdout().lines().filter(|l| l.contains("(NEEDED)")).filter_map(|l| l.rsplit('[').next()).map(|n| n.trim_end_matches(']').to_string()).collect();
    assert!(!needed.is_empty(), "{} needs at least libc.so.6\n{dynamic}", library.display());
    needed
}

/// What docs/architecture.md says the shim needs, and no more: glibc's libc.so.6, libm.so.6
/// (`pow`) and the dynamic loader itself (`__tls_get_addr` for thread-local storage;
/// `_dl_find_object` for the unwinder), so loading it pulls in nothing a system may lack.
#[test]
fn the_shim_needs_only_glibc() {
    let needed = needed_libraries(&shim_library_path());
    let loader = |n: &str| n.starts_with("ld-linux");
    let unexpected: Vec<&String> = needed.iter().filter(|n| !["libc.so.6", "libm.so.6"].contains(&n.as_str()) && !loader(n)).collect();
    assert!(unexpected.is_empty(), "libfgpu_shim.so needs more than glibc: {unexpected:?} (all: {needed:?}); update docs/architecture.md if this is meant");
    assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
}
