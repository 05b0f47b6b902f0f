//! `fgpu-dra-harness`: the stub API server of tests/support/dra/ as a command, for
//! tests/cdi/dra.sh (which runs the CDI devices fgpu-kubelet-plugin prepares in real podman
//! containers; its fake kubelet is tests/python/fake_kubelet.py) and for long measurements.
//!
//!   fgpu-dra-harness api KUBECONFIG NODE NODE_UID [--gates consumable-capacity=off] [CLAIM...]
//!       serves the API (writes KUBECONFIG, prints `ready URL`) until standard input closes,
//!       then prints its counts. CLAIM is NAMESPACE/NAME/UID/DEVICE/MEMORY/COMPUTE[/REQUEST],
//!       `-` for no consumed capacity; REQUEST may be `request/subrequest`.
//!       Commands on standard input, one a line (each answered with one line):
//!         wipe      kubelet's deletion of the node's slices   -> `wiped N`
//!         counts    what the plugin asked                     -> `counts {json}`
//!         slices    the node's slices                         -> `slices {json}`

use fgpu_tests::dra::{claim_json, Alloc, Gates, StubApi};
use serde_json::json;
use std::io::BufRead;
use std::path::Path;

/// `-` is none.
fn given(text: &str) -> Option<&str> {
    (text != "-").then_some(text)
}

fn fail(message: &str) -> ! {
    eprintln!("fgpu-dra-harness: {message}");
    std::process::exit(2);
}

fn counts(api: &StubApi) -> serde_json::Value {
    let log = api.log();
    let mut by: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for l in &log {
        let path = l.url.split('?').next().unwrap_or("");
        let resource = path.trim_matches('/').split('/').take(6).collect::<Vec<_>>().join("/");
        let watch = if l.url.contains("watch=true") {
            " watch"
        } else if l.url.contains("dryRun") {
            " dry-run"
        } else {
            ""
        };
        *by.entry(format!("{} {resource}{watch}", l.method)).or_default() += 1;
    }
    json!({"sliceWrites": api.slice_writes(), "requests": log.len(), "byMethod": by})
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("api") || args.len() < 4 {
        fail("usage: fgpu-dra-harness api KUBECONFIG NODE NODE_UID [--gates consumable-capacity=off] [CLAIM...]");
    }
    let node = &args[2];
    let mut gates = Gates::ALL;
    let mut claims = Vec::new();
    let mut rest = args[4..].iter();
    while let Some(a) = rest.next() {
        if a == "--gates" {
            for g in rest.next().unwrap_or_else(|| fail("--gates needs a value")).split(',') {
                match g {
                    "consumable-capacity=off" => gates.consumable_capacity = false,
                    "consumable-capacity=on" => gates.consumable_capacity = true,
                    other => fail(&format!("unknown gate setting {other:?}")),
                }
            }
        } else {
            claims.push(a.clone());
        }
    }
    let api = StubApi::with_gates(gates);
    api.add_node(node, &args[3]);
    for text in &claims {
        let p: Vec<&str> = text.split('/').collect();
        if !(6..=8).contains(&p.len()) {
            fail(&format!("{text:?} is not NAMESPACE/NAME/UID/DEVICE/MEMORY/COMPUTE[/REQUEST]"));
        }
        let request = if p.len() > 6 { p[6..].join("/") } else { "gpu".to_string() };
        let alloc = Alloc { request: &request, pool: node, device: p[3], memory: given(p[4]), compute: given(p[5]), admin: false };
        api.add_claim(claim_json(p[0], p[1], p[2], Some(&[alloc]), &["pod-0"]));
    }
    api.kubeconfig(Path::new(&args[1]));
    println!("ready {}", api.url);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "wipe" => println!("wiped {}", api.wipe(node)),
            "counts" => println!("counts {}", counts(&api)),
            "slices" => println!("slices {}", serde_json::to_string(&api.slices()).unwrap()),
            "" => {}
            other => println!("unknown {other}"),
        }
    }
    println!("counts {}", counts(&api));
}
