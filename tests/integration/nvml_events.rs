//! GPU health on the simulated driver: NVML's event API as pynvml (a real client) calls it,
//! with XIDs and ECC errors posted and GPUs lost and recovered through the simulator's
//! control (`fgpu_sim_state::events`, the `fgpu-sim-ctl` command), and `fgpu __nvml-events`,
//! the helper the DRA driver watches GPU health with.

use fgpu_tests::*;
use serde_json::Value;
use std::io::Write;
use std::time::{Duration, Instant};

/// The pynvml client of tests/python/nvml_events.py, one command at a time.
struct Client(Background);

impl Client {
    fn ask(&mut self, command: &str) -> Value {
        let stdin = self.0.child.as_mut().unwrap().stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let line = self.0.wait_for("{\"command\"");
        serde_json::from_str(&line).unwrap()
    }

    /// Sends `wait MS` without waiting for the answer.
    fn start_wait(&mut self, ms: u32) {
        let stdin = self.0.child.as_mut().unwrap().stdin.as_mut().unwrap();
        writeln!(stdin, "wait {ms}").unwrap();
        stdin.flush().unwrap();
    }

    fn answer(&mut self) -> Value {
        serde_json::from_str(&self.0.wait_for("{\"command\"")).unwrap()
    }
}

const XID: u64 = 0x8;
const DBE: u64 = 0x2;

#[test]
fn pynvml_waits_for_posted_events_and_sees_a_lost_gpu() {
    let Some(python) = python_with("pynvml") else { return };
    let env = Env::new("nvml-events").devices(2);
    env.client(&["init"]).success();
    let sim = env.sim();
    // Posted before the set is registered: nvml.h says such events are not recorded.
    sim.inject_xid(0, 13).unwrap();
    let mut c = Client(env.command(&python).arg(workspace().join("tests/python/nvml_events.py")).spawn());
    let ready: Value = serde_json::from_str(&c.0.wait_for("{\"ready\"")).unwrap();
    assert_eq!(ready["supported"], serde_json::json!([XID | DBE | 0x1, XID | DBE | 0x1]), "XIDs and ECC errors: {ready}");

    // Nothing pending: the wait times out after what it was given.
    let a = c.ask("wait 300");
    let seconds = a["seconds"].as_f64().unwrap();
    assert_eq!(a["error"], "NVMLError_Timeout", "the XID posted before registration is not delivered: {a}");
    assert!((0.29..2.0).contains(&seconds), "a 300 ms timeout took {seconds} s");

    // An event posted while the client waits wakes it at once.
    c.start_wait(20_000);
    std::thread::sleep(Duration::from_millis(300));
    let posted = Instant::now();
    sim.inject_xid(1, 79).unwrap();
    let a = c.answer();
    let woke = posted.elapsed();
    assert_eq!((a["gpu"].as_u64(), a["type"].as_u64(), a["data"].as_u64()), (Some(1), Some(XID), Some(79)), "{a}");
    assert_eq!((a["gpuInstanceId"].as_u64(), a["computeInstanceId"].as_u64()), (Some(0xFFFF_FFFF), Some(0xFFFF_FFFF)), "the whole GPU: {a}");
    assert!(woke < Duration::from_secs(2), "the waiting client took {woke:?} to see the XID");
    eprintln!("pynvml: an XID posted while it waited was delivered after {:.1} ms", woke.as_secs_f64() * 1e3);

    // Pending events come at once, in order; a type a GPU was not registered for is not
    // delivered (GPU 0 records XIDs only, GPU 1 XIDs and double-bit ECC errors).
    sim.post_event(0, DBE, 0, 0xFFFF_FFFF, 0xFFFF_FFFF).unwrap();
    sim.inject_xid(0, 48).unwrap();
    sim.post_event(1, DBE, 0, 3, 0).unwrap();
    let first = c.ask("wait 0");
    let second = c.ask("wait 0");
    let third = c.ask("wait 0");
    assert_eq!((first["gpu"].as_u64(), first["type"].as_u64(), first["data"].as_u64()), (Some(0), Some(XID), Some(48)), "{first}");
    assert_eq!(
        (second["gpu"].as_u64(), second["type"].as_u64(), second["data"].as_u64(), second["gpuInstanceId"].as_u64()),
        (Some(1), Some(DBE), Some(0), Some(3)),
        "{second}"
    );
    assert_eq!(third["error"], "NVMLError_Timeout", "nothing else: {third}");
    assert_eq!(c.ask("register 0 0x4")["result"], "NVMLError_NotSupported", "P-state events are not raised");

    // GPU 1 falls off the bus: the wait says so once, and its calls answer GPU_IS_LOST.
    c.start_wait(20_000);
    std::thread::sleep(Duration::from_millis(200));
    sim.lose_gpu(1).unwrap();
    assert_eq!(c.answer()["error"], "NVMLError_GpuIsLost");
    assert_eq!(c.ask("wait 100")["error"], "NVMLError_Timeout", "a loss is reported once");
    let q = c.ask("query 1");
    assert_eq!((q["handle"].as_str(), q["memory"].as_str()), (Some("NVMLError_GpuIsLost"), Some("NVMLError_GpuIsLost")), "{q}");
    let q = c.ask("query 0");
    assert_eq!((q["handle"].as_str(), q["memory"].as_str()), (Some("ok"), Some("ok")), "GPU 0 is not affected: {q}");
    assert!(sim.inject_xid(1, 79).is_err(), "a lost GPU raises nothing");

    // Recovered: it answers again, and its events come through the same set.
    let ctl = Cmd(std::process::Command::new(release_dir().join("fgpu-sim-ctl"))).args(["--state"]).arg(&env.sim_state).args(["recover", "1"]).success();
    assert!(ctl.stdout().contains("GPU 1 is back"), "{ctl}");
    let q = c.ask("query 1");
    assert_eq!((q["handle"].as_str(), q["memory"].as_str()), (Some("ok"), Some("ok")), "{q}");
    Cmd(std::process::Command::new(release_dir().join("fgpu-sim-ctl"))).args(["--state"]).arg(&env.sim_state).args(["xid", "1", "94"]).success();
    let a = c.ask("wait 5000");
    assert_eq!((a["gpu"].as_u64(), a["data"].as_u64()), (Some(1), Some(94)), "{a}");
    assert_eq!(c.ask("free")["result"], "ok");
    c.0.finish();
}

/// The helper the DRA driver runs: one JSON line per GPU at the start, per XID, per GPU lost
/// and back, each as the simulator posted it.
#[test]
fn nvml_events_helper_prints_xids_and_lost_gpus() {
    let env = Env::new("nvml-events-helper").devices(2);
    env.client(&["init"]).success();
    let sim = env.sim();
    sim.lose_gpu(1).unwrap();
    let mut helper = env.command(fgpu_bin()).arg("__nvml-events").spawn();
    let next = |helper: &mut Background, event: &str| -> Value {
        let line = helper.wait_for(&format!("{{\"event\":\"{event}\""));
        serde_json::from_str(&line).unwrap()
    };
    let gpu0 = next(&mut helper, "gpu");
    assert_eq!(
        (gpu0["index"].as_u64(), gpu0["uuid"].as_str(), gpu0["monitored"].as_bool()),
        (Some(0), Some(sim.device_uuid_string(0).as_str()), Some(true)),
        "{gpu0}"
    );
    let gpu1 = next(&mut helper, "gpu");
    assert_eq!((gpu1["index"].as_u64(), gpu1["monitored"].as_bool()), (Some(1), Some(false)), "GPU 1 is lost at the start: {gpu1}");
    let lost = next(&mut helper, "lost");
    assert_eq!((lost["index"].as_u64(), lost["code"].as_u64()), (Some(1), Some(15)), "{lost}");
    next(&mut helper, "ready");

    let t0 = Instant::now();
    sim.inject_xid(0, 79).unwrap();
    let xid = next(&mut helper, "xid");
    eprintln!("fgpu __nvml-events printed the XID {:.1} ms after it was posted", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!((xid["index"].as_u64(), xid["xid"].as_u64(), xid["uuid"].as_str()), (Some(0), Some(79), Some(sim.device_uuid_string(0).as_str())), "{xid}");

    sim.recover_gpu(1).unwrap();
    let back = next(&mut helper, "back");
    assert_eq!(
        (back["index"].as_u64(), back["uuid"].as_str(), back["monitored"].as_bool()),
        (Some(1), Some(sim.device_uuid_string(1).as_str()), Some(true)),
        "{back}"
    );
    sim.inject_xid(1, 48).unwrap();
    let xid = next(&mut helper, "xid");
    assert_eq!((xid["index"].as_u64(), xid["xid"].as_u64()), (Some(1), Some(48)), "a GPU that came back is watched: {xid}");
    sim.lose_gpu(0).unwrap();
    let lost = next(&mut helper, "lost");
    assert_eq!(lost["index"].as_u64(), Some(0), "{lost}");
    helper.assert_running("the helper runs until its reader goes");
}
