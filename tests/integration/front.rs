//! The front, `libfgpu.so`: what every process pays for it, and what it does when the shim
//! it loads (`libfgpu_shim.so`) cannot be loaded. That it forwards every entry point is
//! what the rest of the suite shows: every test preloads the front.

use fgpu_tests::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Names of the functions a library defines and exports (`objdump -T`).
fn exported_functions(lib: &Path) -> BTreeSet<String> {
    let run = Cmd(Command::new("objdump")).arg("-T").arg(lib).success();
    run.stdout()
        .lines()
        .filter(|l| l.contains(" g ") && l.contains(" DF ") && !l.contains("*UND*"))
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}

/// `front/exports.txt`, the list the front is built from.
fn listed() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace().join("front/exports.txt")).unwrap();
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect()
}

#[test]
fn exports_match_the_shim() {
    let mut shim = exported_functions(&shim_library_path());
    assert!(shim.remove("dlsym") && shim.remove("dlvsym"), "{shim:?}");
    let list = listed();
    let unlisted: Vec<_> = shim.difference(&list).collect();
    let stale: Vec<_> = list.difference(&shim).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "front/exports.txt must list every function libfgpu_shim.so exports but dlsym and dlvsym.\n\
         exported by the shim, not listed (add them): {unlisted:?}\nlisted, not exported by the shim (remove them): {stale:?}"
    );
    let mut front = exported_functions(&front_path());
    assert!(front.remove("dlsym") && front.remove("dlvsym"), "the front exports dlsym and dlvsym");
    assert_eq!(front, list, "libfgpu.so exports exactly front/exports.txt, dlsym and dlvsym");
}

/// What the loader has to do for the front in a process that never touches a GPU: find
/// libc.so.6 (already there), bind two weak symbols. No constructor, no thread-local
/// storage, no relocated pointer to write: each of those would cost every process.
#[test]
fn the_front_costs_a_process_almost_nothing_at_load() {
    let front = front_path();
    let dynamic = Cmd(Command::new("readelf")).arg("-dW").arg(&front).success();
    let text = dynamic.stdout();
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).map(|l| l.rsplit('[').next().unwrap().trim_end_matches(']')).collect();
    assert_eq!(needed, ["libc.so.6"], "{dynamic}");
    for tag in ["(INIT)", "(INIT_ARRAY)", "(PREINIT_ARRAY)", "(TEXTREL)"] {
        assert!(!dynamic.stdout().contains(tag), "the front must not have {tag}\n{dynamic}");
    }
    let headers = Cmd(Command::new("readelf")).arg("-lW").arg(&front).success();
    assert!(!headers.stdout().contains(" TLS "), "the front must not use thread-local storage\n{headers}");
    let relocs = Cmd(Command::new("readelf")).arg("-rW").arg(&front).success();
    let text = relocs.stdout();
    let eager: Vec<&str> = text.lines().filter(|l| l.contains("R_X86_64_") || l.contains("R_AARCH64_")).filter(|l| !l.contains("JUMP_SLOT")).collect();
    assert!(eager.len() <= 2, "at most the two weak dl* symbols are bound at load\n{relocs}");
    assert!(eager.iter().all(|l| l.contains("GLOB_DAT") && ["dlopen", "dlerror"].iter().any(|s| l.contains(s))), "{relocs}");
}

#[test]
fn a_process_that_never_calls_cuda_never_loads_the_shim() {
    let env = Env::new("front-lazy");
    let maps = env.command("cat").arg("/proc/self/maps").shim().limit("8G").success();
    assert!(maps.stdout().contains("/libfgpu.so"), "the front is mapped\n{maps}");
    assert!(!maps.stdout().contains("libfgpu_shim.so"), "the shim is not\n{maps}");
    assert_eq!(maps.stderr(), "", "{maps}");
}

/// Sixteen threads make the process's first hooked call at once: one loads the shim, the
/// others wait, all get the shim's wrapper, which answers with the cap.
#[test]
fn threads_racing_to_the_first_call_all_get_the_shim() {
    let env = Env::new("front-race");
    let probe = client("front_race");
    for _ in 0..20 {
        let run = env.command(&probe).shim().limit("8G").success();
        assert_eq!(run.stdout().trim(), format!("same 1 rc 0 total {}", 8u64 << 30), "{run}");
        assert_eq!(run.stderr(), "", "{run}");
    }
}

/// The front alone in a directory, without the shim beside it.
fn lonely_front(env: &Env) -> std::path::PathBuf {
    let dir = env.dir.join("lonely");
    std::fs::create_dir_all(&dir).unwrap();
    let front = dir.join("libfgpu.so");
    std::fs::copy(front_path(), &front).unwrap();
    front
}

#[test]
fn without_the_shim_every_path_to_the_driver_is_refused() {
    let env = Env::new("front-missing");
    let front = lonely_front(&env);
    let missing = front.with_file_name("libfgpu_shim.so").display().to_string();

    // cuGetProcAddress and dlsym through the driver's handle find nothing: the client
    // cannot resolve.
    for mode in ["procaddr", "dlsym"] {
        let run = env.client(&["--resolve", mode, "init", "alloc", "1M"]).env("LD_PRELOAD", &front).limit("8G").run();
        assert_eq!(run.output.status.code(), Some(2), "--resolve {mode}: resolution must fail\n{run}");
        assert!(run.stdout().contains("resolve failed"), "{run}");
        let stderr = run.stderr();
        let complaints: Vec<&str> = stderr.lines().filter(|l| l.starts_with("fgpu: cannot load ")).collect();
        assert_eq!(complaints.len(), 1, "one line on stderr\n{run}");
        assert!(complaints[0].contains(&missing) && complaints[0].ends_with("; CUDA and NVML calls are refused"), "it names the missing file\n{run}");
    }
    // Linked symbols, and dlsym(RTLD_DEFAULT), which finds the front's own entry points:
    // the call reaches the front, which refuses it with CUDA_ERROR_SHARED_OBJECT_INIT_FAILED.
    let linked = client_with("cuclient", &["LINKED"]);
    let run = env.command(&linked).args(["init", "alloc", "1M"]).env("LD_PRELOAD", &front).limit("8G").run();
    assert!(run.stdout().contains("alloc 1048576 rc=303"), "{run}");
    assert_eq!(run.stderr().lines().filter(|l| l.starts_with("fgpu: cannot load ")).count(), 1, "{run}");
    let run = env.client(&["--resolve", "default", "init", "alloc", "1M"]).env("LD_PRELOAD", &front).limit("8G").run();
    assert!(run.stdout().contains("alloc 1048576 rc=303"), "{run}");
    // FGPU_LOG=quiet silences the line, not the refusal.
    let run = env.command(&linked).args(["init", "alloc", "1M"]).env("LD_PRELOAD", &front).limit("8G").env("FGPU_LOG", "quiet").run();
    assert!(run.stdout().contains("rc=303"), "{run}");
    assert!(!run.stderr().contains("fgpu:"), "{run}");
}

#[test]
fn doctor_reports_a_missing_shim_beside_the_front() {
    let env = Env::new("front-doctor");
    let front = lonely_front(&env);
    let run = env.command(fgpu_bin()).args(["doctor", "--json"]).env("FGPU_SHIM", &front).env("LD_PRELOAD", &front).limit("2G").run();
    assert_eq!(run.output.status.code(), Some(1), "{run}");
    let value: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    let shim = value["findings"].as_array().unwrap().iter().find(|f| f["check"] == "shim").cloned().unwrap_or_default();
    assert_eq!(shim["level"], "fail", "{run}");
    assert!(shim["message"].as_str().unwrap_or("").contains("libfgpu_shim.so is missing beside it"), "{run}");
}
