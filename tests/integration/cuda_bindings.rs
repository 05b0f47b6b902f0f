//! NVIDIA's own Python driver bindings (`cuda-bindings` from PyPI), a client written by
//! NVIDIA rather than by us, under the shim against the simulated driver.

use fgpu_tests::*;

#[test]
fn cuda_bindings_sees_the_cap_and_is_refused_past_it() {
    let Some(python) = python_with("cuda.bindings") else { return };
    let env = Env::new("cuda-bindings");
    let script = workspace().join("tests/python/cuda_bindings_cap.py");
    let run = env.command(&python).arg(&script).arg("256").shim().limit("4G").success();
    let out: serde_json::Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    assert_eq!(out["init"], 0, "{run}");
    assert_eq!(out["device_total"], 4 * GIB, "{run}");
    assert_eq!(out["info_total"], 4 * GIB, "{run}");
    assert_eq!(out["fill_error_name"], "CUDA_ERROR_OUT_OF_MEMORY", "{run}");
    // 4 GiB minus the 300 MiB context leaves room for 14 chunks of 256 MiB.
    assert_eq!(out["filled_bytes"], 14 * 256 * MIB, "{run}");
    assert_eq!(out["free_after"], 4 * GIB - 300 * MIB, "everything freed is back\n{run}");
    let bare = env.command(&python).arg(&script).arg("8192").success();
    let bare: serde_json::Value = serde_json::from_str(bare.stdout().trim()).unwrap();
    assert_eq!(bare["device_total"], 80 * GIB, "without the shim the whole simulated GPU");
}

#[test]
fn cuda_bindings_graph_memory_is_counted_until_trimmed() {
    let Some(python) = python_with("cuda.bindings") else { return };
    let env = Env::new("cuda-bindings-graph");
    let script = workspace().join("tests/python/cuda_bindings_graph.py");
    let run = env.command(&python).arg(&script).arg("1024").shim().limit("4G").success();
    let out: serde_json::Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    assert_eq!(out["launch"], 0, "{run}");
    assert_eq!(out["graph_reserved"], GIB, "{run}");
    assert_eq!(out["free_after_launch"], 4 * GIB - 300 * MIB - GIB, "the graph pool's memory is the container's\n{run}");
    assert_eq!(out["trim"], 0, "{run}");
    assert_eq!(out["free_after_trim"], 4 * GIB - 300 * MIB, "trimmed memory is back\n{run}");
    // A graph whose memory would pass the cap is refused before the driver takes any.
    let run = env.command(&python).arg(&script).arg("3900").shim().limit("4G").success();
    let out: serde_json::Value = serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{run}"));
    assert_eq!(out["launch"], 2, "CUDA_ERROR_OUT_OF_MEMORY\n{run}");
    assert_eq!(out["graph_reserved"], 0, "{run}");
    assert_eq!(out["free_after_launch"], 4 * GIB - 300 * MIB, "{run}");
}
