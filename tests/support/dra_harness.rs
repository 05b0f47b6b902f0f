//! `fgpu-dra-harness`: the stub API server and the fake kubelet of tests/support/dra.rs as a
//! command, for tests/cdi/test.sh, which runs the CDI devices that fgpu-kubelet-plugin
//! prepares in real podman containers.
//!
//!   fgpu-dra-harness api KUBECONFIG NODE NODE_UID [CLAIM...]
//!       serves the API (writes KUBECONFIG, prints `ready URL`) until standard input closes;
//!       CLAIM is NAMESPACE/NAME/UID/DEVICE/MEMORY/COMPUTE, `-` for no consumed capacity.
//!   fgpu-dra-harness prepare REGISTRAR_DIR NAMESPACE/NAME/UID...
//!       registers as kubelet does (GetInfo, NotifyRegistrationStatus) and prepares the
//!       claims: prints `cdi UID ID` for each CDI device, `error UID MESSAGE` for a claim
//!       that failed; exits 3 if one did.
//!   fgpu-dra-harness unprepare REGISTRAR_DIR NAMESPACE/NAME/UID...

use fgpu_tests::dra::{claim_json, Alloc, ClaimRef, Kubelet, StubApi};
use std::path::{Path, PathBuf};

fn claim_ref(text: &str) -> ClaimRef {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() != 3 {
        fail(&format!("{text:?} is not NAMESPACE/NAME/UID"));
    }
    ClaimRef::new(parts[0], parts[1], parts[2])
}

/// `-` is none.
fn given(text: &str) -> Option<&str> {
    (text != "-").then_some(text)
}

fn fail(message: &str) -> ! {
    eprintln!("fgpu-dra-harness: {message}");
    std::process::exit(2);
}

/// GetInfo, checked, then the DRA socket it names.
fn register(kubelet: &Kubelet, registrar: &Path) -> PathBuf {
    let socket = registrar.join("gpu.fgpu.io-reg.sock");
    let info = kubelet.get_info(&socket).unwrap_or_else(|e| fail(&format!("GetInfo on {}: {e}", socket.display())));
    if info.r#type != "DRAPlugin" || info.name != "gpu.fgpu.io" || info.supported_versions != ["v1.DRAPlugin"] {
        fail(&format!("GetInfo answered {info:?}"));
    }
    kubelet.notify(&socket, true, "").unwrap_or_else(|e| fail(&format!("NotifyRegistrationStatus: {e}")));
    PathBuf::from(info.endpoint)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("api") if args.len() >= 4 => {
            let api = StubApi::start();
            api.add_node(&args[2], &args[3]);
            for text in &args[4..] {
                let p: Vec<&str> = text.split('/').collect();
                if p.len() != 6 {
                    fail(&format!("{text:?} is not NAMESPACE/NAME/UID/DEVICE/MEMORY/COMPUTE"));
                }
                let (memory, compute) = (given(p[4]), given(p[5]));
                let alloc = Alloc { request: "gpu", pool: &args[2], device: p[3], memory, compute };
                api.add_claim(claim_json(p[0], p[1], p[2], Some(&[alloc]), &["pod-0"]));
            }
            api.kubeconfig(Path::new(&args[1]));
            println!("ready {}", api.url);
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        }
        Some(verb @ ("prepare" | "unprepare")) if args.len() >= 3 => {
            let kubelet = Kubelet::new();
            let dra = register(&kubelet, Path::new(&args[1]));
            let claims: Vec<ClaimRef> = args[2..].iter().map(|a| claim_ref(a)).collect();
            let mut failed = false;
            if verb == "prepare" {
                let answer = kubelet.prepare(&dra, &claims).unwrap_or_else(|e| fail(&format!("NodePrepareResources: {e}")));
                for c in &claims {
                    match answer.claims.get(&c.uid) {
                        None => fail(&format!("no answer for claim {}", c.uid)),
                        Some(r) if !r.error.is_empty() => {
                            failed = true;
                            println!("error {} {}", c.uid, r.error);
                        }
                        Some(r) => {
                            for id in r.devices.iter().flat_map(|d| &d.cdi_device_ids) {
                                println!("cdi {} {id}", c.uid);
                            }
                        }
                    }
                }
            } else {
                let answer = kubelet.unprepare(&dra, &claims).unwrap_or_else(|e| fail(&format!("NodeUnprepareResources: {e}")));
                for c in &claims {
                    match answer.claims.get(&c.uid) {
                        None => fail(&format!("no answer for claim {}", c.uid)),
                        Some(r) if !r.error.is_empty() => {
                            failed = true;
                            println!("error {} {}", c.uid, r.error);
                        }
                        Some(_) => println!("unprepared {}", c.uid),
                    }
                }
            }
            std::process::exit(if failed { 3 } else { 0 });
        }
        _ => fail("usage: fgpu-dra-harness api KUBECONFIG NODE NODE_UID [CLAIM...] | prepare|unprepare REGISTRAR_DIR NS/NAME/UID..."),
    }
}
