//! The `FGPU_SIM_*` settings: a state file's configuration ([`SimConfig`], read when the
//! file is created) and what each process reads for itself (`FGPU_SIM_PROCESS_KINDS`).

use crate::duration::parse_duration;
use crate::layout::MAX_DEVICES;
use crate::mig::Product;
use crate::size::parse_size;
use crate::timeline;
use std::io;

/// Configuration of a state file, fixed when the file is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of devices (0..=8). 0 simulates a machine without GPU.
    pub devices: u32,
    /// Memory of each device, bytes.
    pub memory: u64,
    /// Device memory each CUDA context takes, bytes.
    pub context_overhead: u64,
    /// `cuDriverGetVersion` value, e.g. 12080.
    pub driver_version: u32,
    /// Time slice of a device's round robin between contexts, ns.
    pub timeslice_ns: u64,
    /// NVML's utilisation sample period, ns.
    pub sample_period_ns: u64,
    /// How long a dead process's memory stays held after its death is first seen, ns: the
    /// real driver frees it when the process's device files are closed, which comes after
    /// the process's other files, takes time for large allocations, and can be deferred.
    pub exit_free_delay_ns: u64,
    /// Which PIDs NVML gives a caller outside the host's PID namespace.
    pub nvml_pids: NvmlPidsMode,
    /// Which GPU the simulator presents; a product other than [`Product::Generic`] fixes
    /// the memory (`memory` is then its size).
    pub product: Product,
    /// GPUs in MIG mode when the state is created (bit `i` for GPU `i`): on Ampere the mode
    /// its InfoROM kept, on Hopper one a boot script set (Hopper does not keep it).
    pub mig: u32,
    /// What the GPUs' UUIDs derive from ([`device_uuid_bytes`]); `None`: drawn at random
    /// when the state file is created, as every real GPU has a UUID of its own.
    pub uuid_seed: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 1,
            memory: 80 << 30,
            context_overhead: 300 << 20,
            driver_version: 12080,
            timeslice_ns: timeline::DEFAULT_TIMESLICE_NS,
            sample_period_ns: timeline::SAMPLE_PERIOD_NS,
            exit_free_delay_ns: 0,
            nvml_pids: NvmlPidsMode::Caller,
            product: Product::Generic,
            mig: 0,
            uuid_seed: None,
        }
    }
}

/// Parses `FGPU_SIM_MIG`: `all`, `none`, or comma-separated GPU indices (below
/// `devices`), into a bit mask of GPUs.
pub fn parse_mig_mask(v: &str, devices: u32) -> Option<u32> {
    let v = v.trim();
    match v {
        "all" => return Some(((1u64 << devices) - 1) as u32),
        "none" | "" => return Some(0),
        _ => {}
    }
    let mut mask = 0u32;
    for tok in v.split(',') {
        let i: u32 = tok.trim().parse().ok()?;
        if i >= devices {
            return None;
        }
        mask |= 1 << i;
    }
    Some(mask)
}

/// Which PIDs the simulated NVML gives (`FGPU_SIM_NVML_PIDS`), modelled on the drivers
/// described in docs/simulator.md. A caller in the host's PID namespace gets host PIDs
/// with their memory in every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlPidsMode {
    /// Older drivers: host PIDs in process lists, per-process memory, utilisation samples.
    Host,
    /// Current drivers (NVIDIA's open kernel modules, `gpuGetProcWithObject` →
    /// `_gpuConvertPid` → `osFindNsPid`): PIDs as the caller's namespace sees them, processes
    /// it cannot see left out, memory matched through the same conversion; samples carry
    /// the caller's PID for a process it can see and the raw host PID otherwise.
    Caller,
    /// As `Caller`, but the per-process memory query compares the caller's PID with raw
    /// host PIDs (open-gpu-kernel-modules pull request 614): a listed process's memory is
    /// that of the process whose host PID equals the listed number, usually none (0).
    CallerNoMemory,
    /// No process at all in the lists a caller outside the host's namespace gets; samples
    /// keep raw host PIDs.
    None,
}

impl NvmlPidsMode {
    /// The name `FGPU_SIM_NVML_PIDS` takes.
    pub fn name(self) -> &'static str {
        match self {
            NvmlPidsMode::Host => "host",
            NvmlPidsMode::Caller => "caller",
            NvmlPidsMode::CallerNoMemory => "caller-no-memory",
            NvmlPidsMode::None => "none",
        }
    }

    pub fn parse(v: &str) -> Option<NvmlPidsMode> {
        [NvmlPidsMode::Host, NvmlPidsMode::Caller, NvmlPidsMode::CallerNoMemory, NvmlPidsMode::None].into_iter().find(|m| m.name() == v.trim())
    }

    pub(crate) fn code(self) -> u32 {
        match self {
            NvmlPidsMode::Caller => 0,
            NvmlPidsMode::Host => 1,
            NvmlPidsMode::CallerNoMemory => 2,
            NvmlPidsMode::None => 3,
        }
    }

    pub(crate) fn from_code(code: u32) -> NvmlPidsMode {
        match code {
            1 => NvmlPidsMode::Host,
            2 => NvmlPidsMode::CallerNoMemory,
            3 => NvmlPidsMode::None,
            _ => NvmlPidsMode::Caller,
        }
    }
}

/// The process is a graphics client too (it shows in the graphics process lists).
pub const KIND_GRAPHICS: u32 = 1;
/// The process is an MPS client (it shows in the MPS process lists).
pub const KIND_MPS: u32 = 2;

/// `FGPU_SIM_PROCESS_KINDS` of the calling process: `graphics`, `mps`, comma-separated.
pub(crate) fn own_kinds() -> u32 {
    std::env::var("FGPU_SIM_PROCESS_KINDS")
        .unwrap_or_default()
        .split(',')
        .map(|k| match k.trim() {
            "graphics" => KIND_GRAPHICS,
            "mps" => KIND_MPS,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

fn bad_env(name: &str, value: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{name}={value:?} is not valid"))
}

impl SimConfig {
    /// Reads `FGPU_SIM_DEVICES`, `FGPU_SIM_MEMORY`, `FGPU_SIM_CONTEXT_OVERHEAD`,
    /// `FGPU_SIM_DRIVER_VERSION`, `FGPU_SIM_TIMESLICE`, `FGPU_SIM_SAMPLE_PERIOD`,
    /// `FGPU_SIM_NVML_PIDS`, `FGPU_SIM_PRODUCT`, `FGPU_SIM_MIG`, `FGPU_SIM_UUID_SEED`; unset
    /// or empty variables take the defaults.
    pub fn from_env() -> io::Result<SimConfig> {
        let mut c = SimConfig::default();
        let get = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = get("FGPU_SIM_DEVICES") {
            match v.trim().parse::<u32>() {
                Ok(n) if n as usize <= MAX_DEVICES => c.devices = n,
                _ => return Err(bad_env("FGPU_SIM_DEVICES", &v)),
            }
        }
        if let Some(v) = get("FGPU_SIM_MEMORY") {
            c.memory = parse_size(&v).filter(|&m| m > 0).ok_or_else(|| bad_env("FGPU_SIM_MEMORY", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_CONTEXT_OVERHEAD") {
            c.context_overhead = parse_size(&v).ok_or_else(|| bad_env("FGPU_SIM_CONTEXT_OVERHEAD", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_DRIVER_VERSION") {
            c.driver_version = v.trim().parse().map_err(|_| bad_env("FGPU_SIM_DRIVER_VERSION", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_TIMESLICE") {
            c.timeslice_ns = parse_duration(&v).filter(|&t| t > 0).ok_or_else(|| bad_env("FGPU_SIM_TIMESLICE", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_EXIT_FREE_DELAY") {
            c.exit_free_delay_ns = parse_duration(&v).filter(|t| *t <= 60_000_000_000).ok_or_else(|| bad_env("FGPU_SIM_EXIT_FREE_DELAY", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_SAMPLE_PERIOD") {
            // NVML documents 1/6 s to 1 s, depending on the product.
            let range = timeline::SAMPLE_PERIOD_NS..=1_000_000_000;
            c.sample_period_ns = parse_duration(&v).filter(|t| range.contains(t)).ok_or_else(|| bad_env("FGPU_SIM_SAMPLE_PERIOD", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_NVML_PIDS") {
            c.nvml_pids = NvmlPidsMode::parse(&v).ok_or_else(|| bad_env("FGPU_SIM_NVML_PIDS", &v))?;
        }
        if let Some(v) = get("FGPU_SIM_PRODUCT") {
            c.product = Product::parse(&v).ok_or_else(|| bad_env("FGPU_SIM_PRODUCT", &v))?;
            if let Some(fixed) = c.product.memory() {
                if get("FGPU_SIM_MEMORY").is_some() && c.memory != fixed {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("FGPU_SIM_MEMORY conflicts with FGPU_SIM_PRODUCT={} ({} MiB): leave it unset", c.product.key(), fixed >> 20),
                    ));
                }
                c.memory = fixed;
            }
        }
        if let Some(v) = get("FGPU_SIM_MIG") {
            c.mig = parse_mig_mask(&v, c.devices).ok_or_else(|| bad_env("FGPU_SIM_MIG", &v))?;
            if c.mig != 0 && !c.product.has_mig() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("FGPU_SIM_MIG={v:?} needs FGPU_SIM_PRODUCT (a100-80gb, h100-80gb or h200-141gb)"),
                ));
            }
        }
        if let Some(v) = get("FGPU_SIM_UUID_SEED") {
            c.uuid_seed = Some(parse_seed(&v).ok_or_else(|| bad_env("FGPU_SIM_UUID_SEED", &v))?);
        }
        Ok(c)
    }
}

/// Parses `FGPU_SIM_UUID_SEED`: a 64-bit number, decimal or `0x` hexadecimal.
pub(crate) fn parse_seed(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}
