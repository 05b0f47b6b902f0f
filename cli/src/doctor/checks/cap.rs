//! Which cap applies here and where it comes from, each GPU's cap, and the compute share.
//! A device key is checked as the shim checks it: against every GPU NVML lists (the
//! probe's list).

use crate::doctor::facts::Facts;
use crate::doctor::finding::{finding, Finding, Level};
use fgpu_core::config::{Config, ConfigError, LimitSource, CONFIG_PATH};
use fgpu_core::limit::{format_bytes, Amount, LimitSpec};
use fgpu_core::view::MemoryView;

fn describe_amount(a: Amount) -> String {
    match a {
        Amount::Bytes(b) => format_bytes(b),
        Amount::Percent(p) => format!("{p}% of the GPU's memory"),
    }
}

/// "30% of the GPU's time on every GPU".
fn describe_share(share: &fgpu_core::compute::ShareSpec) -> String {
    let spec = &share.spec;
    let time = |a: Amount| match a {
        Amount::Percent(p) => format!("{p}% of the GPU's time"),
        Amount::Bytes(b) => format_bytes(b),
    };
    let mut parts: Vec<String> = spec.per_device.iter().zip(&spec.keys).map(|((_, a), key)| format!("{} on {key}", time(*a))).collect();
    if let Some(d) = spec.default {
        parts.push(format!("{} on every {}GPU", time(d), if spec.per_device.is_empty() { "" } else { "other " }));
    }
    parts.join(", ")
}

/// "8 GiB on every GPU", "16 GiB on gpu-1a2b, 4 GiB on every other GPU".
pub fn describe_spec(spec: &LimitSpec) -> String {
    let mut parts: Vec<String> = spec.per_device.iter().zip(&spec.keys).map(|((_, a), key)| format!("{} on {key}", describe_amount(*a))).collect();
    if let Some(d) = spec.default {
        parts.push(format!("{} on every {}GPU", describe_amount(d), if spec.per_device.is_empty() { "" } else { "other " }));
    }
    parts.join(", ")
}

/// The sentence of the "no cap yet" finding that says the installation itself is sound.
const NO_CAP_YET: &str = "That is not a failure: the other checks say what works.";

/// Whether the findings say that no cap is configured (and nothing failed because of it).
pub fn no_cap_yet(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.check == "cap" && f.level == Level::Info && f.message.contains(NO_CAP_YET))
}

/// The configuration, with its device keys checked against the GPUs NVML lists.
pub fn checked_config(f: &Facts) -> Result<Config, ConfigError> {
    f.config.clone().and_then(|config| {
        config.check_device_keys(|| match &f.driver {
            Ok(d) if d.nvml.loaded && d.nvml.error.is_none() => Ok(d.devices.iter().map(|d| d.uuid.clone()).collect()),
            Ok(d) => Err(d.nvml.error.clone().unwrap_or_else(|| "NVML cannot be loaded".into())),
            Err(e) => Err(e.to_string()),
        })?;
        Ok(config)
    })
}

/// What the configuration warns of (a log level that is not one): never a failure.
pub fn check_warnings(config: &Result<Config, ConfigError>, out: &mut Vec<Finding>) {
    let Ok(config) = config else { return };
    for warning in &config.warnings {
        out.push(finding(
            "cap",
            Level::Warn,
            format!("{warning}. The cap is not affected."),
            Some("Set FGPU_LOG (or `log` in the file) to quiet, error, warn, info or debug.".into()),
        ));
    }
}

/// Which cap applies, and whether anything enforces it here (`preloaded`).
pub fn check(f: &Facts, config: &Result<Config, ConfigError>, preloaded: bool, out: &mut Vec<Finding>) {
    let config = match config {
        Err(e) => {
            out.push(finding("cap", Level::Fail, format!("The cap is not valid, so none applies: {e}"), Some(config_advice(e))));
            return;
        }
        Ok(config) => config,
    };
    if !config.is_active() {
        // Nothing configured yet (a fresh installation): nothing has failed, and nothing is
        // capped. Said as information with the next step, not as a failure.
        out.push(finding(
            "cap",
            Level::Info,
            format!("No cap is configured yet (FGPU_LIMIT and FGPU_COMPUTE are not set and {CONFIG_PATH} sets no limit or compute share), so GPU programs started here are not capped. {}", NO_CAP_YET),
            Some(format!("Cap one job with `fgpu run --limit 8G -- COMMAND` (or `--compute 30%`). To cap every program of a machine or image, write `limit = 8G` to {CONFIG_PATH} (owned by root, mode 644) and preload libfgpu.so (/etc/ld.so.preload); for containers, `fgpu cdi generate`.")),
        ));
        return;
    }
    if !config.is_capped() {
        out.push(finding(
            "cap",
            if preloaded { Level::Info } else { Level::Fail },
            format!(
                "No memory cap is configured, only a compute share{}.",
                if preloaded { "" } else { ", and libfgpu.so is not preloaded here, so nothing enforces it" }
            ),
            None,
        ));
        return;
    }
    let from = match config.limit_source() {
        Some(LimitSource::File) => format!("from {CONFIG_PATH}: {}", describe_spec(config.file_limit.as_ref().unwrap())),
        Some(LimitSource::Env) => format!("from FGPU_LIMIT in the environment: {}", describe_spec(config.env_limit.as_ref().unwrap())),
        _ => format!(
            "from both {CONFIG_PATH} ({}) and FGPU_LIMIT ({}); on each GPU the smaller applies",
            describe_spec(config.file_limit.as_ref().unwrap()),
            describe_spec(config.env_limit.as_ref().unwrap())
        ),
    };
    if preloaded {
        out.push(finding("cap", Level::Ok, format!("The cap comes {from}."), None));
    } else {
        out.push(finding(
            "cap",
            Level::Fail,
            format!("A cap is configured ({from}), but libfgpu.so is not preloaded here, so nothing enforces it."),
            Some("Preload libfgpu.so (LD_PRELOAD or /etc/ld.so.preload), or start the job with `fgpu run`.".into()),
        ));
    }
    per_gpu(f, config, out);
}

/// Each GPU the driver lists, and the cap it gets.
fn per_gpu(f: &Facts, config: &Config, out: &mut Vec<Finding>) {
    let Ok(driver) = &f.driver else { return };
    for d in &driver.devices {
        match config.cap_for(&d.uuid, d.total_bytes) {
            Some(cap) => {
                let note = if MemoryView::new(Some(cap), None, d.total_bytes).above_device() && d.total_bytes > 0 {
                    ", more than the GPU has: programs are told its own size and the driver's limit applies"
                } else {
                    ""
                };
                out.push(finding(
                    "cap",
                    Level::Info,
                    format!("GPU {} ({}, {}, {}): capped at {}{note}.", d.index, d.name, d.uuid, format_bytes(d.total_bytes), format_bytes(cap)),
                    None,
                ))
            }
            None => out.push(finding(
                "cap",
                Level::Warn,
                format!("GPU {} ({}) is not capped: no entry of the limit matches its UUID and there is no `*=SIZE` entry.", d.index, d.uuid),
                Some("Add `*=SIZE` to the limit, or an entry for this GPU's UUID.".into()),
            )),
        }
    }
}

/// The compute share, where one is configured.
pub fn check_compute(config: &Result<Config, ConfigError>, preloaded: bool, out: &mut Vec<Finding>) {
    let Ok(config) = config else { return };
    let specs = [(&config.file_compute, CONFIG_PATH.to_string()), (&config.env_compute, "FGPU_COMPUTE in the environment".to_string())];
    let given: Vec<String> = specs.iter().filter_map(|(spec, from)| spec.as_ref().map(|s| format!("{} (from {from})", describe_share(s)))).collect();
    if !given.is_empty() {
        let level = if preloaded { Level::Ok } else { Level::Fail };
        let both = if given.len() == 2 { "; on each GPU the smaller applies" } else { "" };
        out.push(finding("compute", level, format!("A compute share is configured: {}{both}. It is a ceiling on the part of each GPU's time the kernels of this ledger's processes occupy together (docs/compute.md).", given.join(" and ")), None));
    }
}

/// A shim that cannot load does nothing: a cap finding that said it applies says so.
pub fn withdraw(out: &mut [Finding]) {
    for finding in out.iter_mut().filter(|x| x.check == "cap" && x.level == Level::Ok) {
        finding.level = Level::Fail;
        finding.message.push_str(" But fgpu's libraries cannot be loaded (see above), so the cap does not apply.");
    }
}

fn config_advice(e: &ConfigError) -> String {
    match e {
        ConfigError::BadLimitEnv { .. } => "Set FGPU_LIMIT to a size such as 8G, a percentage such as 50%, or GPU-<uuid>=8G,*=4G.".into(),
        ConfigError::Untrusted { .. } => format!("chown root:root {CONFIG_PATH} && chmod 644 {CONFIG_PATH}"),
        ConfigError::AmbiguousKey { .. } | ConfigError::UncheckedKey { .. } => {
            "Give more of the GPU's UUID (`nvidia-smi -L` lists them), enough to name one GPU.".into()
        }
        _ => format!("Correct {CONFIG_PATH} (lines `limit = 8G`, `ledger = PATH`, `log = warn`)."),
    }
}
