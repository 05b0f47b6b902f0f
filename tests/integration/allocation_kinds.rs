//! Each way device memory is taken counts against the cap. Every scenario runs with a 1 GiB
//! cap and a 300 MiB context, so 724 MiB are left: it takes memory one way, then asks for a
//! plain 300 MiB that fits only if the first kind was not counted (or was given back).

use fgpu_tests::*;

fn scenario(env: &Env, ops: &[&str]) -> Run {
    let mut args = vec!["init", "primary"];
    args.extend_from_slice(ops);
    args.extend(["alloc", "300M", "info"]);
    env.client(&args).shim().limit("1G").success()
}

fn last_alloc_rc(run: &Run) -> i64 {
    field(run.lines("alloc ").last().unwrap(), "rc").unwrap().parse().unwrap()
}

/// Asserts that after `ops` the plain allocation is refused under the shim and succeeds
/// without it (so the test fails if the kind is not counted).
fn counted(name: &str, ops: &[&str]) {
    let env = Env::new(name);
    let run = scenario(&env, ops);
    assert_eq!(last_alloc_rc(&run), 2, "{name}: memory taken by {ops:?} was not counted\n{run}");
    let mut args = vec!["init", "primary"];
    args.extend_from_slice(ops);
    args.extend(["alloc", "300M"]);
    let bare = env.client(&args).success();
    assert_eq!(last_alloc_rc(&bare), 0, "{name}: without the shim it must succeed\n{bare}");
}

/// Asserts that after `ops` the memory is back: the plain allocation succeeds.
fn returned(name: &str, ops: &[&str]) {
    let env = Env::new(name);
    let run = scenario(&env, ops);
    assert_eq!(last_alloc_rc(&run), 0, "{name}: memory released by {ops:?} was not given back\n{run}");
}

#[test]
fn plain_allocations() {
    counted("alloc", &["alloc", "500M"]);
    returned("alloc-freed", &["alloc", "500M", "free"]);
}

#[test]
fn pitch_counts_what_the_driver_returns() {
    // 1000-byte rows are padded to a 1024-byte pitch: 1024 x 500000 = 488 MiB.
    counted("pitch", &["pitch", "1000", "500000"]);
    returned("pitch-freed", &["pitch", "1000", "500000", "free"]);
    let env = Env::new("pitch-exact");
    let run = env.client(&["init", "primary", "pitch", "1000", "1048576", "info"]).shim().limit("8G").success();
    assert_eq!(run.field("pitch", "pitch"), "1024", "{run}");
    let free: u64 = run.field("info", "free").parse().unwrap();
    assert_eq!(free, 8 * GIB - 300 * MIB - 1024 * 1048576, "pitch x height is counted\n{run}");
}

#[test]
fn managed_memory() {
    counted("managed", &["managed", "500M"]);
    returned("managed-freed", &["managed", "500M", "free"]);
}

#[test]
fn stream_ordered_pools_count_what_they_keep() {
    // Default pool, release threshold 0: freed memory leaves the pool at synchronisation.
    counted("async", &["async", "500M"]);
    counted("async-unsynced", &["async", "500M", "freeasync"]);
    returned("async-synced", &["async", "500M", "freeasync", "sync"]);
    // Threshold at the maximum (PyTorch's setting): the pool keeps it until trimmed.
    counted("async-kept", &["keep", "async", "500M", "freeasync", "sync"]);
    returned("async-trimmed", &["keep", "async", "500M", "freeasync", "sync", "trim", "0"]);
    // An explicit pool (cuMemPoolCreate + cuMemAllocFromPoolAsync), and its destruction.
    counted("from-pool", &["pool", "500M"]);
    counted("from-pool-unsynced", &["pool", "500M", "freeasync"]);
    returned("from-pool-synced", &["pool", "500M", "freeasync", "sync"]);
    returned("from-pool-destroyed", &["pool", "500M", "freeasync", "pooldestroy"]);
    // A pool that already holds free memory serves from it without new reservations.
    let env = Env::new("async-reuse");
    let run = env.client(&["init", "primary", "keep", "async", "600M", "freeasync", "sync", "async", "600M"]).shim().limit("1G").success();
    assert_eq!(run.lines("async").iter().map(|l| field(l, "rc").unwrap()).collect::<Vec<_>>(), vec!["0", "0"], "{run}");
}

#[test]
fn graph_memory_counts_what_the_graph_pool_keeps() {
    // The graph pool takes memory at launch or upload and keeps it until trimmed.
    counted("graph-launched", &["graph", "500M", "launch"]);
    counted("graph-uploaded", &["graph", "500M", "upload"]);
    counted("graph-synced", &["graph", "500M", "launch", "sync", "execdestroy"]);
    returned("graph-trimmed", &["graph", "500M", "launch", "graphtrim"]);
    returned("graph-not-launched", &["graph", "500M"]);
    // An allocation the graph does not free stays in use, and trimming cannot take it back
    // until the graph is gone.
    counted("graph-kept-trimmed", &["graphkeep", "500M", "launch", "graphtrim"]);
    returned("graph-kept-destroyed", &["graphkeep", "500M", "launch", "execdestroy", "graphtrim"]);
    // Instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, a graph takes its memory at once.
    counted("graph-instantiated-uploaded", &["graphup", "500M"]);
    returned("graph-instantiated-uploaded-trimmed", &["graphup", "500M", "graphtrim"]);
    // A launch (or upload) that would pass the cap is refused before the driver is asked,
    // and nothing of it stays counted; what still fits is not refused.
    let env = Env::new("graph-over");
    let ops = ["init", "primary", "alloc", "600M", "graph", "300M", "upload", "launch", "graphup", "300M", "info", "alloc", "120M"];
    let run = env.client(&ops).shim().limit("1G").success();
    assert_eq!((run.field("upload", "rc"), run.field("launch", "rc"), run.field("graphup", "rc")), ("2".into(), "2".into(), "2".into()), "{run}");
    assert_eq!(run.field("info", "free"), (GIB - 900 * MIB).to_string(), "{run}");
    assert_eq!(last_alloc_rc(&run), 0, "{run}");
    assert!(run.stderr().contains("cuGraphUpload of 300 MiB refused"), "one line says why\n{run}");
    let bare = env.client(&ops).success();
    assert_eq!(bare.field("launch", "rc"), "0", "without the shim the launch succeeds\n{bare}");
    // A graph whose nodes fgpu does not read (a child graph) is counted after its launch:
    // not refused, but every later allocation is, and one line says so.
    let env = Env::new("graph-child");
    let run = env.client(&["init", "primary", "alloc", "600M", "graphchild", "300M", "launch", "info", "alloc", "2M"]).shim().limit("1G").success();
    assert_eq!(run.field("launch", "rc"), "0", "{run}");
    assert_eq!(run.field("info", "free"), "0", "{run}");
    assert_eq!(last_alloc_rc(&run), 2, "{run}");
    assert!(run.stderr().contains("cuGraphLaunch took 300 MiB of graph memory on"), "{run}");
    returned("graph-child-trimmed", &["graphchild", "500M", "launch", "graphtrim"]);
    // Per-thread-default-stream launches go through the same hook.
    let env = Env::new("graph-ptds");
    let run = env.client(&["--ptds", "init", "primary", "graph", "500M", "launch", "alloc", "300M"]).shim().limit("1G").success();
    assert_eq!(last_alloc_rc(&run), 2, "{run}");
}

#[test]
fn memory_the_driver_takes_unannounced_is_counted_from_nvml() {
    // A module's code and data take device memory that no allocation call announces (the
    // simulated driver reads the size from the image). cuMemGetInfo and synchronisation
    // compare NVML's figure for the process with the ledger and count the difference.
    counted("module-synced", &["module", "500M", "sync"]);
    counted("module-info", &["module", "500M", "info"]);
    returned("module-context-released", &["module", "500M", "sync", "release", "primary"]);
    let env = Env::new("module-info");
    let run = env.client(&["init", "primary", "module", "400M", "info"]).shim().limit("1G").success();
    assert_eq!(run.field("info", "free"), (GIB - 300 * MIB - 400 * MIB).to_string(), "{run}");
    // Counted once, however often it is compared.
    let env = Env::new("module-compared-again");
    let run = env.client(&["init", "primary", "module", "400M", "info", "sleep", "600", "sync", "info", "sleep", "600", "info"]).shim().limit("1G").success();
    let frees: Vec<String> = run.lines("info").iter().map(|l| field(l, "free").unwrap()).collect();
    assert_eq!(frees, vec![(GIB - 700 * MIB).to_string(); 3], "{run}");
}

#[test]
fn vmm_memory_lives_until_released_and_unmapped() {
    counted("vmm", &["vmm", "512M"]);
    counted("vmm-released-but-mapped", &["vmm", "512M", "vmmrelease"]);
    returned("vmm-released-and-unmapped", &["vmm", "512M", "vmmrelease", "vmmunmap"]);
}

#[test]
fn arrays() {
    // 12288 x 12288 floats = 576 MiB.
    counted("array", &["array", "12288", "12288"]);
    returned("array-destroyed", &["array", "12288", "12288", "arraydestroy"]);
    counted("array3d", &["array3d", "1024", "1024", "144"]);
    counted("mipmap", &["mipmap", "11000", "11000", "3"]);
    returned("mipmap-destroyed", &["mipmap", "11000", "11000", "3", "mipmapdestroy"]);
}

#[test]
fn contexts_are_reserved_before_creation_and_returned() {
    let env = Env::new("contexts").context_overhead("400M");
    // 400 MiB primary + 400 MiB context fit in 1 GiB; a third does not.
    let run = env.client(&["init", "primary", "ctx", "ctx", "info"]).shim().limit("1G").success();
    assert_eq!(run.lines("ctx rc").iter().map(|l| field(l, "rc").unwrap()).collect::<Vec<_>>(), vec!["0", "2"], "{run}");
    assert_eq!(env.sim().device_used(0), 0, "all gone after exit");
    let run = env.client(&["init", "primary", "ctx", "ctxdestroy", "ctx", "info"]).shim().limit("1G").success();
    assert_eq!(run.lines("ctx rc").iter().map(|l| field(l, "rc").unwrap()).collect::<Vec<_>>(), vec!["0", "0"], "{run}");
    // The measured size, not the first 512 MiB estimate, is what stays counted.
    let free: u64 = run.field("info", "free").parse().unwrap();
    assert_eq!(free, GIB - 800 * MIB, "{run}");
    let bare = env.client(&["init", "primary", "ctx", "ctx"]).success();
    assert_eq!(bare.lines("ctx rc").len(), 2);
    assert!(bare.lines("ctx rc").iter().all(|l| l.ends_with("rc=0")), "{bare}");
}

#[test]
fn primary_context_memory_returns_on_release() {
    let env = Env::new("primary-release");
    let run = env.client(&["init", "primary", "release", "primary", "info"]).shim().limit("1G").success();
    let free: u64 = run.field("info", "free").parse().unwrap();
    assert_eq!(free, GIB - 300 * MIB, "one context counted, not two\n{run}");
}

#[test]
fn mem_get_info_reports_the_cap_and_the_container_usage() {
    let env = Env::new("info");
    let run = env.client(&["init", "primary", "alloc", "1G", "info"]).shim().limit("8G").success();
    assert_eq!(run.field("info", "total"), (8 * GIB).to_string());
    assert_eq!(run.field("info", "free"), (8 * GIB - GIB - 300 * MIB).to_string(), "{run}");
    // Free never exceeds what the device really has, and a cap above the device's memory
    // does not make it look larger.
    let small = Env::new("info-small").sim_memory("4G");
    let run = small.client(&["init", "primary", "info"]).shim().limit("8G").success();
    let free: u64 = run.field("info", "free").parse().unwrap();
    assert!(free <= 4 * GIB - 300 * MIB, "{run}");
    assert_eq!(run.field("info", "total"), (4 * GIB).to_string(), "{run}");
}
