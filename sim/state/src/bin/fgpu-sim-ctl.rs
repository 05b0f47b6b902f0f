//! `fgpu-sim-ctl`: injects faults into fgpu's simulated driver, for tests and by hand
//! (docs/simulator.md, GPU health).
//!
//! ```text
//! fgpu-sim-ctl [--state FILE] xid GPU XID [--instance GI CI]   an XID error on GPU
//! fgpu-sim-ctl [--state FILE] ecc GPU single|double              an ECC error event
//! fgpu-sim-ctl [--state FILE] lose GPU                           GPU falls off the bus
//! fgpu-sim-ctl [--state FILE] recover GPU                        GPU is back
//! fgpu-sim-ctl [--state FILE] show                               each GPU's state
//! ```
//!
//! The state file is `--state`, else `$FGPU_SIM_STATE`, else the simulator's default: the
//! one `fgpu sim-env DIR` set up is `DIR/sim-state`. It must exist (this command never
//! makes one).

use fgpu_sim_state::events::{EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, NO_INSTANCE};
use fgpu_sim_state::SimState;
use std::path::PathBuf;

const USAGE: &str = "usage: fgpu-sim-ctl [--state FILE] (xid GPU XID [--instance GI CI] | ecc GPU single|double | lose GPU | recover GPU | show)";

fn number<T: std::str::FromStr>(what: &str, text: Option<&String>) -> Result<T, String> {
    let text = text.ok_or_else(|| format!("{what} is missing\n{USAGE}"))?;
    text.parse().map_err(|_| format!("{what}: {text:?} is not a number"))
}

fn run(args: &[String]) -> Result<String, String> {
    let mut args = args.to_vec();
    let mut path = SimState::default_path();
    if args.first().map(String::as_str) == Some("--state") {
        path = PathBuf::from(args.get(1).ok_or_else(|| format!("--state needs a file\n{USAGE}"))?);
        args.drain(..2);
    }
    if !path.exists() {
        return Err(format!("{}: no simulator state file there (run a program on the simulated driver first, or name one with --state)", path.display()));
    }
    let s = SimState::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let command = args.first().cloned().unwrap_or_default();
    let gpu = || number::<usize>("GPU", args.get(1));
    let said = match command.as_str() {
        "xid" => {
            let (gpu, xid) = (gpu()?, number::<u64>("XID", args.get(2))?);
            let (gi, ci) = match args.get(3).map(String::as_str) {
                Some("--instance") => (number::<u32>("GI", args.get(4))?, number::<u32>("CI", args.get(5))?),
                Some(other) => return Err(format!("unexpected {other:?}\n{USAGE}")),
                None => (NO_INSTANCE, NO_INSTANCE),
            };
            let seq = s.post_event(gpu, fgpu_sim_state::events::EVENT_XID_CRITICAL, xid, gi, ci).map_err(|e| e.to_string())?;
            format!("GPU {gpu}: XID {xid} posted (event {seq})")
        }
        "ecc" => {
            let gpu = gpu()?;
            let kind = match args.get(2).map(String::as_str) {
                Some("single") => EVENT_SINGLE_BIT_ECC,
                Some("double") => EVENT_DOUBLE_BIT_ECC,
                _ => return Err(format!("ecc needs single or double\n{USAGE}")),
            };
            let seq = s.post_event(gpu, kind, 0, NO_INSTANCE, NO_INSTANCE).map_err(|e| e.to_string())?;
            format!("GPU {gpu}: ECC error event posted (event {seq})")
        }
        "lose" => {
            let gpu = gpu()?;
            s.lose_gpu(gpu).map_err(|e| e.to_string())?;
            format!("GPU {gpu} is lost (NVML answers NVML_ERROR_GPU_IS_LOST)")
        }
        "recover" => {
            let gpu = gpu()?;
            s.recover_gpu(gpu).map_err(|e| e.to_string())?;
            format!("GPU {gpu} is back")
        }
        "show" => (0..s.device_count())
            .map(|d| {
                format!(
                    "GPU {d} {}: {}, {} events posted, lost {} times",
                    s.device_uuid_string(d),
                    if s.gpu_lost(d) { "lost" } else { "present" },
                    s.event_head(d),
                    s.gpu_losses(d)
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return Err(USAGE.into()),
    };
    Ok(said)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(said) => println!("{said}"),
        Err(e) => {
            eprintln!("fgpu-sim-ctl: {e}");
            std::process::exit(if e.starts_with("usage") || e.contains(USAGE) { 2 } else { 1 });
        }
    }
}
