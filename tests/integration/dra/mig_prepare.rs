//! MIG partitions prepared and unprepared by the plugin on the simulated driver (an A100
//! 80GB in MIG mode, `--mig-gpus all`), claims allocated by hand on partition devices:
//! prepare creates the instance at the allocated placement, shares it between the claims
//! of one partition and writes the claim's spec with the instance's `nvidia-caps` access
//! nodes; unprepare destroys it with the last claim, and is refused (kubelet retries) while
//! a process is on it; a failed prepare leaves nothing it created; a restarted plugin
//! destroys only the instances of its own record that no claim holds. Ground truths: the
//! simulator's instance table, and a mig-minors file laid out as NVIDIA's kernel module
//! lays it out (`nv-caps.c`).

use super::{alloc, uid, Node, NODE, NODE_UID};
use fgpu_sim_state::{mig::Product, SimConfig, SimState};
use fgpu_tests::dra::{claim_json, Authority, ClaimRef, Gates, Kubelet, StubApi};
use fgpu_tests::*;
use serde_json::Value;
use std::path::PathBuf;

/// `/proc/driver/nvidia-caps/mig-minors` as the kernel module prints it (`nv-caps.c`): the
/// NVLink fabric capability takes minor 0, MIG's config and monitor 1 and 2, then for each
/// of 32 GPU minors, for GPU instances 0 to 14, the instance's access then its compute
/// instances' 0 to 7, one minor each in that order.
fn mig_minors() -> String {
    let mut text = String::from("config 1\nmonitor 2\n");
    let mut minor = 3;
    for gpu in 0..32 {
        for gi in 0..15 {
            text.push_str(&format!("gpu{gpu}/gi{gi}/access {minor}\n"));
            minor += 1;
            for ci in 0..8 {
                text.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {minor}\n"));
                minor += 1;
            }
        }
    }
    text
}

/// The minor the list gives `key`.
fn minor_of(list: &str, key: &str) -> u32 {
    list.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok()).unwrap_or_else(|| panic!("no {key} in the list"))
}

/// A node whose one GPU is an A100 80GB in MIG mode, with a mig-minors file and a device
/// root of its own.
struct MigNode {
    node: Node,
    sim: SimState,
    minors: PathBuf,
    devices: PathBuf,
}

impl MigNode {
    fn new(name: &str) -> Option<MigNode> {
        let kubelet = Kubelet::new(Authority::GrpcGo)?;
        let env = Env::new(name).devices(1);
        let sim = SimState::open_with(&env.sim_state, &SimConfig { devices: 1, product: Product::A100_80GB, mig: 1, ..SimConfig::default() }).unwrap();
        let api = StubApi::with_gates(Gates::ALL);
        api.add_node(NODE, NODE_UID);
        api.kubeconfig(&env.dir.join("kubeconfig"));
        std::fs::create_dir_all(env.dir.join("cdi")).unwrap();
        let minors = env.dir.join("mig-minors");
        std::fs::write(&minors, mig_minors()).unwrap();
        let devices = env.dir.join("host");
        let node = Node { env, api, kubelet };
        node.nvidia_spec();
        Some(MigNode { node, sim, minors, devices })
    }

    fn start(&self, vars: &[(&str, String)]) -> super::Plugin {
        let args = ["--mig-gpus", "all", "--mig-minors", self.minors.to_str().unwrap(), "--device-root", self.devices.to_str().unwrap()];
        self.node.start_with(&args, vars)
    }

    /// (GPU instance ID, first slice, slice count) of the GPU's instances, as the simulator
    /// holds them.
    fn instances(&self) -> Vec<(u32, u32, u32)> {
        let mut v: Vec<_> = self.sim.gpu_instances(0).unwrap().iter().map(|g| (g.id, g.start, g.size)).collect();
        v.sort_unstable();
        v
    }

    /// The instance at `start`, as the simulator holds it: its GPU instance ID and its
    /// MIG device's UUID.
    fn at(&self, start: u32) -> Option<(u32, String)> {
        let gi = self.sim.gpu_instances(0).unwrap().into_iter().find(|g| g.start == start)?;
        let device = self.sim.mig_devices(0).into_iter().find(|d| d.gpu_instance.id == gi.id)?;
        Some((gi.id, device.uuid_string()))
    }

    fn claim(&self, name: &str, n: u32, device: &str, memory: Option<&str>, compute: Option<&str>) -> ClaimRef {
        self.node.api.add_claim(claim_json("ml", name, &uid(n), Some(&[alloc(device, memory, compute)]), &["pod-a"]));
        ClaimRef::new("ml", name, &uid(n))
    }

    fn prepare(&self, claim: &ClaimRef) -> Value {
        let answer = self.node.kubelet.prepare(&self.node.dra(), std::slice::from_ref(claim)).unwrap();
        answer[&claim.uid].clone()
    }

    fn unprepare(&self, claim: &ClaimRef) -> Value {
        let answer = self.node.kubelet.unprepare(&self.node.dra(), std::slice::from_ref(claim)).unwrap();
        answer[&claim.uid].clone()
    }

    fn spec(&self, claim: &ClaimRef) -> Option<Value> {
        let text = std::fs::read(self.node.cdi().join(format!("fgpu-claim-{}.json", claim.uid))).ok()?;
        Some(serde_json::from_slice(&text).unwrap())
    }

    fn config(&self, claim: &ClaimRef) -> String {
        std::fs::read_to_string(self.node.state().join(format!("claims/{}/config/fgpu.conf", claim.uid))).unwrap_or_default()
    }

    /// The checkpoint's claims being prepared.
    fn preparing(&self) -> Value {
        let text = std::fs::read(self.node.env.dir.join("plugins/gpu.fgpu.io/checkpoint.json")).unwrap();
        serde_json::from_slice::<Value>(&text).unwrap().get("preparing").cloned().unwrap_or(Value::Null)
    }
}

fn ok(answer: &Value, log: &str) {
    assert_eq!(answer["error"], "", "{answer}\n{log}");
}

#[test]
fn prepare_creates_the_partition_shares_it_and_the_last_unprepare_destroys_it() {
    let Some(m) = MigNode::new("dra-mig-prepare") else { return };
    let plugin = m.start(&[]);
    let list = mig_minors();

    // Two claims of a fraction of the 3g.40gb at slice 4, one of the whole 1g.10gb at 2.
    let a = m.claim("a", 1, "gpu-0-mig-3g-40gb-4", Some("8Gi"), Some("50"));
    let b = m.claim("b", 2, "gpu-0-mig-3g-40gb-4", Some("4Gi"), None);
    let c = m.claim("c", 3, "gpu-0-mig-1g-10gb-2", None, None);
    let answer = m.prepare(&a);
    ok(&answer, &plugin.log());
    assert_eq!(answer["devices"][0]["deviceName"], "gpu-0-mig-3g-40gb-4");
    let (gi, mig_uuid) = m.at(4).unwrap_or_else(|| panic!("no instance at slice 4: {:?}\n{}", m.instances(), plugin.log()));
    assert_eq!(m.instances(), [(gi, 4, 4)], "{}", plugin.log());
    ok(&m.prepare(&b), &plugin.log());
    assert_eq!(m.instances(), [(gi, 4, 4)], "the second claim shares the instance");
    ok(&m.prepare(&c), &plugin.log());
    let (gi_c, uuid_c) = m.at(2).unwrap();
    assert_eq!(m.instances().len(), 2);

    // The spec: the instance's gi and ci access nodes, as the mig-minors list numbers them
    // for GPU minor 0, under the device root; the MIG device selected.
    let spec = m.spec(&a).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let nodes: Vec<(String, String)> =
        edits["deviceNodes"].as_array().unwrap().iter().map(|n| (n["path"].as_str().unwrap().into(), n["hostPath"].as_str().unwrap().into())).collect();
    let expect = |key: &str| {
        let minor = minor_of(&list, key);
        (format!("/dev/nvidia-caps/nvidia-cap{minor}"), m.devices.join(format!("dev/nvidia-caps/nvidia-cap{minor}")).display().to_string())
    };
    assert_eq!(nodes, [expect(&format!("gpu0/gi{gi}/access")), expect(&format!("gpu0/gi{gi}/ci0/access"))], "{spec}");
    let env: Vec<&str> = edits["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(env, [format!("CUDA_VISIBLE_DEVICES={mig_uuid}"), format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")], "{spec}");
    // Each claim's cap is its consumed memory inside the instance, by MIG UUID.
    assert!(m.config(&a).contains(&format!("limit = {mig_uuid}=8G,*=1")), "{}", m.config(&a));
    assert!(m.config(&a).contains(&format!("compute = {mig_uuid}=50%")), "{}", m.config(&a));
    assert!(m.config(&b).contains(&format!("limit = {mig_uuid}=4G,*=1")), "{}", m.config(&b));
    assert!(m.config(&c).contains(&format!("limit = {uuid_c}=9728M,*=1")), "the whole 1g.10gb instance: {}", m.config(&c));

    // Unprepare: the instance stays while a claim holds it, and goes with the last.
    ok(&m.unprepare(&a), &plugin.log());
    assert_eq!(m.at(4).map(|x| x.0), Some(gi), "b still holds it");
    assert!(m.spec(&a).is_none());
    ok(&m.unprepare(&b), &plugin.log());
    assert_eq!(m.at(4), None, "{}", plugin.log());

    // A process on the 1g.10gb: unprepare is an error (kubelet retries), the claim and its
    // files stay; once the process is gone, it succeeds.
    let mut job = m.node.env.client(&["init", "primary", "alloc", "256M", "hold"]).env("CUDA_VISIBLE_DEVICES", &uuid_c).spawn();
    job.wait_for("holding");
    let refused = m.unprepare(&c);
    assert!(refused["error"].as_str().unwrap().contains("in use"), "{refused}\n{}", plugin.log());
    assert_eq!(m.at(2).map(|x| x.0), Some(gi_c));
    assert!(m.spec(&c).is_some(), "the claim stays prepared");
    job.kill(libc::SIGKILL);
    let _ = job.finish();
    ok(&m.unprepare(&c), &plugin.log());
    assert_eq!(m.instances(), [], "{}", plugin.log());
    assert!(m.spec(&c).is_none());
}

#[test]
fn a_restarted_plugin_destroys_only_its_own_instances_that_no_claim_holds() {
    let Some(m) = MigNode::new("dra-mig-gc") else { return };
    // A static MIG setup (made with NVML, no record) at slice 0, and an instance of `fgpu
    // mig create` in another record (as `fgpu run --mig --keep` leaves) at slice 1.
    let fixed = m.sim.create_gpu_instance(0, 19, Some(0)).unwrap();
    m.sim.create_compute_instance(0, fixed.id, 0, None).unwrap();
    let other = m.node.env.dir.join("other-record");
    m.node.env.command(fgpu_bin()).args(["mig", "create", "1g.10gb", "--gpu", "0", "--placement", "1"]).env("FGPU_MIG_RECORD", &other).success();
    let plugin = m.start(&[]);
    let held = m.claim("held", 1, "gpu-0-mig-1g-10gb-5", Some("2Gi"), None);
    ok(&m.prepare(&held), &plugin.log());
    let (held_gi, _) = m.at(5).unwrap();
    drop(plugin);
    // An instance of the plugin's record that no claim holds: created, then the plugin
    // stopped before its checkpoint said so.
    let record = m.node.state().join("mig");
    m.node.env.command(fgpu_bin()).args(["mig", "create", "1g.10gb", "--gpu", "0", "--placement", "6"]).env("FGPU_MIG_RECORD", &record).success();
    assert_eq!(m.instances().len(), 4);

    let plugin = m.start(&[]);
    let log = plugin.log();
    assert!(log.contains("held by no prepared claim"), "{log}");
    assert_eq!(m.at(6), None, "the orphan of its record is destroyed: {log}");
    assert_eq!(m.at(5).map(|x| x.0), Some(held_gi), "the claim's instance stays: {log}");
    assert_eq!(m.at(0).map(|x| x.0), Some(fixed.id), "the static instance is never touched: {log}");
    assert!(m.at(1).is_some(), "fgpu's other record is never touched: {log}");
    ok(&m.unprepare(&held), &plugin.log());
    assert_eq!(m.at(5), None);
}

#[test]
fn a_prepare_whose_spec_cannot_be_written_leaves_no_instance() {
    let Some(m) = MigNode::new("dra-mig-rollback-spec") else { return };

    // The spec cannot be written (a directory stands at its path): the instance created
    // for it is destroyed again.
    let plugin = m.start(&[]);
    let blocked = m.claim("blocked", 1, "gpu-0-mig-3g-40gb-0", Some("4Gi"), None);
    std::fs::create_dir_all(m.node.cdi().join(format!("fgpu-claim-{}.json", blocked.uid))).unwrap();
    let answer = m.prepare(&blocked);
    assert!(!answer["error"].as_str().unwrap().is_empty(), "{answer}");
    assert_eq!(m.instances(), [], "rolled back: {answer}\n{}", plugin.log());
    assert_eq!(m.preparing(), Value::Null, "no half-done prepare is left: {}", plugin.log());
    std::fs::remove_dir(m.node.cdi().join(format!("fgpu-claim-{}.json", blocked.uid))).unwrap();
    ok(&m.prepare(&blocked), &plugin.log());
    ok(&m.unprepare(&blocked), &plugin.log());
}

#[test]
fn a_prepare_whose_caps_minors_are_not_listed_leaves_no_instance() {
    let Some(m) = MigNode::new("dra-mig-rollback-minors") else { return };
    // The capability minors cannot be read: the instance goes again.
    std::fs::write(&m.minors, "config 1\nmonitor 2\n").unwrap();
    let plugin = m.start(&[]);
    let no_minors = m.claim("no-minors", 2, "gpu-0-mig-1g-10gb-3", None, None);
    let answer = m.prepare(&no_minors);
    assert!(answer["error"].as_str().unwrap().contains("gpu0/gi"), "{answer}");
    assert_eq!(m.instances(), [], "{answer}\n{}", plugin.log());
    assert_eq!(m.preparing(), Value::Null);
}

#[test]
fn a_prepare_whose_create_loses_its_placement_fails_and_leaves_the_rival() {
    let Some(m) = MigNode::new("dra-mig-rollback-race") else { return };
    // The create loses its placement to another creator (FGPU_SIM_MIG_RACE): an error, the
    // rival's instance untouched, nothing of the plugin's left.
    let plugin = m.start(&[("FGPU_SIM_MIG_RACE", "1".into())]);
    let raced = m.claim("raced", 3, "gpu-0-mig-1g-10gb-6", None, None);
    let answer = m.prepare(&raced);
    assert!(answer["error"].as_str().unwrap().contains("taken"), "{answer}\n{}", plugin.log());
    // The rival made a GPU instance there (without a compute instance).
    let rival = m.instances();
    assert!(matches!(rival[..], [(_, 6, 1)]), "{rival:?}\n{}", plugin.log());
    assert_eq!(m.preparing(), Value::Null);
    assert!(m.spec(&raced).is_none());
    drop(plugin);
    let plugin = m.start(&[]);
    assert_eq!(m.instances(), rival, "not the plugin's: kept at start: {}", plugin.log());
}

#[test]
fn after_a_reboot_start_up_makes_the_claims_instances_again_or_fails_their_specs_closed() {
    let Some(m) = MigNode::new("dra-mig-reboot") else { return };
    let list = mig_minors();
    let plugin = m.start(&[]);
    let kept = m.claim("kept", 1, "gpu-0-mig-3g-40gb-4", Some("8Gi"), None);
    let lost = m.claim("lost", 2, "gpu-0-mig-1g-10gb-0", Some("2Gi"), None);
    ok(&m.prepare(&kept), &plugin.log());
    ok(&m.prepare(&lost), &plugin.log());
    let (_, old) = m.at(4).unwrap();
    drop(plugin);
    // The reboot: MIG instances do not survive it (a GPU reset destroys them all); the
    // checkpoint still holds both claims. Someone else's instance now stands at slice 0.
    m.sim.reset_gpu(0).unwrap();
    assert_eq!(m.instances(), []);
    let rival = m.sim.create_gpu_instance(0, 19, Some(0)).unwrap();
    m.sim.create_compute_instance(0, rival.id, 0, None).unwrap();

    let plugin = m.start(&[]);
    let log = plugin.log();
    // The instance is made again at its placement, a new MIG device; the spec and the cap
    // name it, and its access nodes are those of its GPU instance now.
    let (gi, new) = m.at(4).unwrap_or_else(|| panic!("not made again: {:?}\n{log}", m.instances()));
    assert_ne!(new, old, "{log}");
    let spec = m.spec(&kept).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let env: Vec<&str> = edits["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(env, [format!("CUDA_VISIBLE_DEVICES={new}"), format!("NVIDIA_VISIBLE_DEVICES={new}")], "{spec}\n{log}");
    let minors: Vec<String> = edits["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap().to_string()).collect();
    let want: Vec<String> = [format!("gpu0/gi{gi}/access"), format!("gpu0/gi{gi}/ci0/access")]
        .iter()
        .map(|k| format!("/dev/nvidia-caps/nvidia-cap{}", minor_of(&list, k)))
        .collect();
    assert_eq!(minors, want, "{spec}");
    assert!(m.config(&kept).contains(&format!("limit = {new}=8G,*=1")), "{}", m.config(&kept));
    // The other's placement is taken: one line naming why, and no spec, so that no
    // container of the claim starts, on the rival's instance or uncapped.
    assert!(log.lines().any(|l| l.contains("ResourceClaim ml/lost") && l.contains("taken")), "{log}");
    assert!(m.spec(&lost).is_none(), "{log}");
    let again = m.prepare(&lost);
    assert!(again["error"].as_str().unwrap().contains("taken"), "{again}");
    ok(&m.unprepare(&lost), &plugin.log());
    ok(&m.unprepare(&kept), &plugin.log());
    assert_eq!(m.at(4), None, "{}", plugin.log());
    assert_eq!(m.at(0).map(|x| x.0), Some(rival.id), "the rival's instance is never touched");
}
