//! Process-local state of the simulated CUDA driver: contexts, allocations, pools, VMM
//! handles, arrays, modules, streams and events. Device memory and the device timeline
//! (when work runs) are kept in the shared state file.

use crate::errors::*;
use crate::va::VaSpace;
use fgpu_sim_state::pool::round_up;
use fgpu_sim_state::timeline::Delivery;
use fgpu_sim_state::{MigDevice, SimState};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

mod bookkeeping;
mod records;
mod threads;
mod work;

pub use bookkeeping::*;
pub use records::*;
pub use threads::*;
pub use work::*;

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
/// Set in a child forked from a process that had initialised the driver.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn atfork_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Opens the shared state without registering the process (for cuDriverGetVersion).
pub fn state_only() -> Option<SimState> {
    static S: OnceLock<Option<SimState>> = OnceLock::new();
    if let Some(Ok(d)) = DRIVER.get() {
        return Some(d.state);
    }
    *S.get_or_init(|| SimState::open_default().ok())
}

/// One device CUDA enumerates: a whole GPU, or a MIG device (a compute instance).
#[derive(Debug, Clone)]
pub struct CudaDevice {
    /// The GPU's index in the state file.
    pub phys: usize,
    pub mig: Option<MigDevice>,
}

/// What one `CUDA_VISIBLE_DEVICES` entry names: a GPU (by index or `GPU-` UUID prefix),
/// a MIG device (`MIG-` UUID prefix, R470+, or `MIG-GPU-<uuid>/<gi>/<ci>`, R450), or
/// nothing valid.
fn parse_visible_entry(state: &SimState, t: &str) -> Option<Vec<CudaDevice>> {
    let n = state.device_count();
    let gpu = |i: usize| -> Vec<CudaDevice> {
        // A GPU in MIG mode stands for its MIG devices.
        if state.mig_on(i) {
            state.mig_devices(i).into_iter().map(|m| CudaDevice { phys: i, mig: Some(m) }).collect()
        } else {
            vec![CudaDevice { phys: i, mig: None }]
        }
    };
    let lower = t.to_ascii_lowercase();
    if let Ok(i) = t.parse::<i64>() {
        return (i >= 0 && (i as usize) < n).then(|| gpu(i as usize));
    }
    if let Some(rest) = lower.strip_prefix("mig-gpu-") {
        let mut parts = rest.split('/');
        let (uuid, gi, ci) = (parts.next()?, parts.next()?.parse::<u32>().ok()?, parts.next()?.parse::<u32>().ok()?);
        let i = (0..n).find(|&i| state.device_uuid_string(i).to_ascii_lowercase() == format!("gpu-{uuid}"))?;
        return state.mig_device(i, gi, ci).map(|m| vec![CudaDevice { phys: i, mig: Some(m) }]);
    }
    if lower.len() > 4 && lower.starts_with("mig-") {
        return state.mig_device_by_uuid(t).map(|m| vec![CudaDevice { phys: m.device, mig: Some(m) }]);
    }
    if lower.len() > 4 && lower.starts_with("gpu-") {
        let m: Vec<usize> = (0..n).filter(|&i| state.device_uuid_string(i).to_ascii_lowercase().starts_with(&lower)).collect();
        return (m.len() == 1).then(|| gpu(m[0]));
    }
    None
}

/// The devices CUDA enumerates under `CUDA_VISIBLE_DEVICES` (unset: every GPU). Indices or
/// UUID prefixes, comma separated; the list stops at the first invalid or repeated entry.
/// MIG (the MIG user guide, "CUDA Device Enumeration"): a GPU in MIG mode stands for its
/// MIG devices; CUDA enumerates a single MIG device, the first one, and no other GPU once
/// one is.
pub fn visible_devices(state: &SimState, var: Option<&str>) -> Vec<CudaDevice> {
    let mut out: Vec<CudaDevice> = Vec::new();
    let entries: Vec<Option<Vec<CudaDevice>>> = match var {
        None => (0..state.device_count()).map(|i| parse_visible_entry(state, &i.to_string())).collect(),
        Some(v) => v.split(',').map(|tok| parse_visible_entry(state, tok.trim())).collect(),
    };
    for entry in entries {
        let Some(devices) = entry else { break };
        let mut repeated = false;
        for d in devices {
            let same = |o: &CudaDevice| o.phys == d.phys && o.mig.as_ref().map(|m| m.index) == d.mig.as_ref().map(|m| m.index);
            if out.iter().any(same) {
                repeated = true;
                break;
            }
            out.push(d);
        }
        if repeated {
            break;
        }
    }
    match out.iter().position(|d| d.mig.is_some()) {
        Some(first) => vec![out.swap_remove(first)],
        None => out,
    }
}

/// cuInit.
pub fn init() -> CUresult {
    if FORKED.load(Ordering::Relaxed) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if let Some(r) = DRIVER.get() {
        return r.as_ref().map(|_| CUDA_SUCCESS).unwrap_or_else(|e| *e);
    }
    let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let r = DRIVER.get_or_init(|| {
        if let Err(e) = Delivery::of_this_process().and(failures().as_ref().map(|_| ()).map_err(Clone::clone)) {
            eprintln!("fgpu-sim: {e}");
            return Err(CUDA_ERROR_NO_DEVICE);
        }
        let state = SimState::open_default().map_err(|_| CUDA_ERROR_NO_DEVICE)?;
        let devices = visible_devices(&state, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
        if devices.is_empty() {
            return Err(CUDA_ERROR_NO_DEVICE);
        }
        let slot = state.register().map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)?;
        // A MIG device is the process's from here on: its memory counts against the GPU
        // instance, which cannot be destroyed while the process lives.
        for m in devices.iter().filter_map(|d| d.mig.as_ref()) {
            if state.bind_mig_device(slot, m).is_err() {
                return Err(CUDA_ERROR_NO_DEVICE);
            }
        }
        let visible: Vec<usize> = devices.iter().map(|d| d.phys).collect();
        let mig: Vec<Option<MigDevice>> = devices.into_iter().map(|d| d.mig).collect();
        // SAFETY: registering a plain extern "C" handler with no prepare/parent hooks.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
        let n = visible.len();
        let (va_base, va_end) = reserve_va(&state, &visible);
        Ok(Driver {
            state,
            slot,
            visible,
            mig,
            inner: Mutex::new(Inner {
                allocs: BTreeMap::new(),
                va: VaSpace::new(va_base, va_end),
                va32: VaSpace::new(0x1000_0000, 0xF000_0000),
                contexts: HashMap::new(),
                primary: vec![Primary::default(); n],
                pools: HashMap::new(),
                default_pool: vec![0; n],
                current_pool: vec![0; n],
                streams: HashMap::new(),
                events: HashMap::new(),
                vmm: HashMap::new(),
                reservations: BTreeMap::new(),
                mappings: BTreeMap::new(),
                arrays: HashMap::new(),
                host: HashMap::new(),
                graphs: HashMap::new(),
                graph_nodes: HashMap::new(),
                modules: HashMap::new(),
                functions: HashMap::new(),
                libraries: HashMap::new(),
                kernels: HashMap::new(),
                timelines: HashMap::new(),
                stream_seq: HashMap::new(),
                captures: HashMap::new(),
                execs: HashMap::new(),
                graph_pools: vec![GraphPool::default(); n],
                next_handle: 0x5F00_0000_0000,
            }),
        })
    });
    r.as_ref().map(|_| CUDA_SUCCESS).unwrap_or_else(|e| *e)
}

/// Reserves (PROT_NONE) the address range device pointers come from, so no host mapping
/// lands there and a CPU dereference faults like one of real device memory.
fn reserve_va(state: &SimState, visible: &[usize]) -> (u64, u64) {
    let total: u64 = visible.iter().map(|&i| state.device_total(i)).sum();
    let want = total.saturating_mul(4).clamp(1 << 40, 32 << 40);
    let len = want + GRANULARITY;
    // SAFETY: an anonymous PROT_NONE reservation at an address of the kernel's choosing.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
    if p == libc::MAP_FAILED {
        // No reservation possible (address-space limit): use a fixed high range.
        return (0x7E00_0000_0000, 0x7E00_0000_0000 + (16u64 << 40));
    }
    let base = round_up(p as u64, GRANULARITY);
    (base, base + want)
}

/// The initialised driver, or the error every call returns before cuInit succeeds.
#[inline]
pub fn driver() -> Result<&'static Driver, CUresult> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}
