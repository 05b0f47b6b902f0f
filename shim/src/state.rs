//! Per-process state: the configuration, this process's slot in the ledger, the devices it
//! has touched, and the live allocations it must give back when they are freed.
//!
//! Built on the first CUDA or NVML call that needs it, never in a constructor, so a process
//! that does not use the GPU never reads a file or creates one.

use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::{CudaDriver, NvmlDriver};
use fgpu_core::config::Config;
use fgpu_core::ledger::{DeviceId, Ledger, SlotId};
use fgpu_core::limit::format_bytes;
use fgpu_core::log::{self, Level, RateLimit};
use fgpu_core::log_at;
use fgpu_core::uuid::format_gpu_uuid;
use fgpu_core::view::{Kept, MemoryView};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Highest CUDA device ordinal fgpu tracks per process.
pub const MAX_ORDINALS: usize = 64;

/// What the shim does in this process (one per process, leaked: the size of `On` is moot).
#[allow(clippy::large_enum_variant)]
pub enum Mode {
    /// No cap is configured: every call passes straight through.
    Off,
    /// Capped and counted.
    On(Active),
    /// The configuration or the ledger is broken: device memory is refused (fail closed).
    Closed(String),
}

static MODE: AtomicPtr<Mode> = AtomicPtr::new(null_mut());
static INIT: Mutex<()> = Mutex::new(());
/// The ledger descriptor and segment, so a forked child can drop its inherited copies.
static LEDGER_FD: AtomicI32 = AtomicI32::new(-1);
static LEDGER_MAP: AtomicPtr<u8> = AtomicPtr::new(null_mut());

/// The state of this process, built on first use.
pub fn mode() -> &'static Mode {
    let current = MODE.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: MODE only ever holds pointers from Box::leak, never freed.
        return unsafe { &*current };
    }
    init_slow()
}

#[cold]
fn init_slow() -> &'static Mode {
    let _guard = INIT.lock();
    let current = MODE.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: as in `mode`.
        return unsafe { &*current };
    }
    let mode: &'static Mode = Box::leak(Box::new(build()));
    if let Mode::On(active) = mode {
        LEDGER_FD.store(active.ledger.raw_fd(), Ordering::Relaxed);
        LEDGER_MAP.store(active.ledger.mapping().0, Ordering::Relaxed);
    }
    register_fork_handler();
    MODE.store(mode as *const Mode as *mut Mode, Ordering::Release);
    mode
}

fn build() -> Mode {
    let config = match crate::config::load() {
        Ok(config) => config,
        Err(e) => {
            let message = format!("{e}; GPU memory allocations in this process are refused until this is fixed");
            log_at!(Level::Error, "{message}");
            return Mode::Closed(message);
        }
    };
    log::set_level(config.log);
    if !config.is_active() {
        log_at!(Level::Debug, "no cap configured (FGPU_LIMIT and FGPU_COMPUTE unset, no limit or compute in {}); not capping", fgpu_core::config::CONFIG_PATH);
        return Mode::Off;
    }
    if let Some(why) = &config.ledger_error {
        let message = format!("{why}; GPU memory allocations in this process are refused until this is fixed");
        log_at!(Level::Error, "{message}");
        return Mode::Closed(message);
    }
    if let Some(note) = &config.ledger_note {
        log_at!(Level::Warn, "{note}");
    }
    match Ledger::open(&config.ledger, config.ledger_sharing) {
        Ok(ledger) => {
            ledger.set_still_held(Box::new(nvml_still_lists));
            log_at!(Level::Debug, "ledger {} opened", config.ledger.display());
            Mode::On(Active::new(config, ledger))
        }
        Err(e) => {
            let message = format!("{e}; GPU memory allocations in this process are refused until this is fixed");
            log_at!(Level::Error, "{message}");
            Mode::Closed(message)
        }
    }
}

/// The driver's word on a process of the ledger that died: NVML still lists it on a GPU,
/// so the driver may still hold its memory (`fgpu_core::ledger::dying`). It is looked for
/// by the PID NVML gives it here: its host PID on a driver that gives host PIDs (or in the
/// host's namespace), its own PID on one that gives PIDs as this namespace sees them, if
/// it was in this namespace (`fgpu_core::nvmlpids`).
fn nvml_still_lists(dead: &fgpu_core::ledger::DeadProcess) -> bool {
    use fgpu_core::nvmlpids::NvmlPids;
    let Mode::On(active) = mode() else { return false };
    let same_ns = dead.pidns == fgpu_core::pidns::own_pidns();
    let behaviour = if fgpu_core::pidns::in_host_pidns() { NvmlPids::HostNamespace } else { active.host_pid.behaviour() };
    let pid = match behaviour {
        NvmlPids::HostNamespace if same_ns => dead.pid,
        NvmlPids::HostNamespace | NvmlPids::Host if dead.host_pid != 0 => dead.host_pid,
        b if b.lists_in_caller_namespace() && same_ns => dead.pid,
        _ => return false,
    };
    // Every GPU NVML lists: the dead process may have held memory on one this process has
    // not used yet (a context being created has none registered).
    let Ok(uuids) = driver().nvml_all_uuids() else { return false };
    uuids.iter().filter_map(|text| fgpu_core::uuid::parse_gpu_uuid(text)).any(|uuid| {
        crate::hooks::nvml::query::handle_for(&uuid)
            .and_then(crate::hooks::nvml::query::compute_processes)
            .is_some_and(|listed| listed.iter().any(|p| p.pid == pid))
    })
}

fn register_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: models pthread_atfork(3) with only a child handler, a plain extern "C" fn.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// A forked child is a new process: it must not share its parent's slot (it would keep the
/// parent looking alive) or its accounting. Drop the inherited ledger descriptor and mapping
/// (either one keeps the parent's liveness lock alive) and start over on the child's first
/// CUDA call. Only async-signal-safe calls here.
extern "C" fn after_fork_in_child() {
    MODE.store(null_mut(), Ordering::Release);
    let fd = LEDGER_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: closes the child's copy of the ledger descriptor; the leaked parent state
        // that also names it is never used again in the child.
        unsafe { libc::close(fd) };
    }
    let map = LEDGER_MAP.swap(null_mut(), Ordering::Relaxed);
    if !map.is_null() {
        // SAFETY: detaches the child's copy of the ledger segment (shmdt is a plain system
        // call, safe after fork); nothing in the child uses the parent's state (MODE was
        // reset above) and so nothing reads through it again.
        unsafe { libc::shmdt(map.cast()) };
    }
    if INIT.is_locked() {
        // SAFETY: the thread that held INIT does not exist in the child; nobody will unlock it.
        unsafe { INIT.force_unlock() };
    }
}

/// A device this process uses, as the ledger knows it.
#[derive(Debug)]
pub struct Dev {
    pub ordinal: CUdevice,
    pub id: DeviceId,
    pub uuid: [u8; 16],
    /// The cap this process is held to: the smaller of its own and the ledger's
    /// (`fgpu_core::view`).
    pub limit: u64,
    /// The memory this process is told the device has: the cap, never more than the device.
    pub shown: u64,
    /// Physical memory of the device.
    pub total: u64,
}

pub use crate::allocs::{Alloc, AllocMap};

pub struct Active {
    pub config: Config,
    pub ledger: Ledger,
    slot: OnceLock<Option<SlotId>>,
    devices: [OnceLock<Dev>; MAX_ORDINALS],
    registering: Mutex<()>,
    registered: AtomicUsize,
    only_ordinal: AtomicI32,
    pub allocs: AllocMap,
    /// Contexts made with cuCtxCreate*: context -> (device, bytes counted).
    pub contexts: Mutex<HashMap<usize, (CUdevice, u64)>>,
    /// Primary contexts this process holds: device -> bytes counted.
    pub primary: Mutex<HashMap<CUdevice, u64>>,
    /// Stream-ordered pools: pool -> what is counted for it (`counted_pool.rs`).
    pub pools: Mutex<HashMap<usize, crate::counted_pool::CountedPool>>,
    pub any_pool: AtomicBool,
    pub vmm: Mutex<crate::hooks::vmm::Handles>,
    pub arrays: Mutex<HashMap<usize, Alloc>>,
    /// Graph memory: what each device's graph pool is counted at, and what each
    /// instantiated graph needs (`hooks/graph.rs`).
    pub graphs: Mutex<crate::hooks::graph::GraphBook>,
    pub any_graph_memory: AtomicBool,
    /// Memory NVML showed this process holding beyond the ledger's count, per device
    /// (`hooks/untracked.rs`), and what keeps that comparison from racing a settlement.
    pub untracked: Mutex<HashMap<CUdevice, u64>>,
    pub settling: AtomicU64,
    pub settle_generation: AtomicU64,
    pub last_untracked_check: AtomicU64,
    /// This process's host PID (`host_pid.rs`).
    pub host_pid: crate::host_pid::HostPid,
}

impl Active {
    fn new(config: Config, ledger: Ledger) -> Active {
        Active {
            config,
            ledger,
            slot: OnceLock::new(),
            devices: [const { OnceLock::new() }; MAX_ORDINALS],
            registering: Mutex::new(()),
            registered: AtomicUsize::new(0),
            only_ordinal: AtomicI32::new(-1),
            allocs: AllocMap::default(),
            contexts: Mutex::new(HashMap::new()),
            primary: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            any_pool: AtomicBool::new(false),
            vmm: Mutex::new(Default::default()),
            arrays: Mutex::new(HashMap::new()),
            graphs: Mutex::new(Default::default()),
            any_graph_memory: AtomicBool::new(false),
            untracked: Mutex::new(HashMap::new()),
            settling: AtomicU64::new(0),
            settle_generation: AtomicU64::new(0),
            last_untracked_check: AtomicU64::new(0),
            host_pid: Default::default(),
        }
    }

    /// This process's slot, claimed on first need.
    pub fn slot(&self) -> Option<SlotId> {
        *self.slot.get_or_init(|| match self.ledger.join() {
            Ok(slot) => {
                // Sent now, answered by the time anything needs it; nothing waits for it.
                self.host_pid.ask();
                Some(slot)
            }
            Err(e) => {
                log_at!(Level::Error, "{e}; GPU memory allocations in this process are refused");
                None
            }
        })
    }

    /// This process's host PID if known by now (recorded in its slot when learnt).
    pub fn own_host_pid(&self) -> Option<u32> {
        self.host_pid.get(|pid| {
            if let Some(slot) = self.slot_if_joined() {
                self.ledger.set_host_pid(slot, pid);
            }
        })
    }

    /// The slot if this process already has one (NVML-only processes never take one).
    pub fn slot_if_joined(&self) -> Option<SlotId> {
        self.slot.get().copied().flatten()
    }

    /// The ledger entry for a CUDA device ordinal, registering it on first use.
    pub fn device(&self, ordinal: CUdevice) -> Result<&Dev, CUresult> {
        let index = usize::try_from(ordinal).ok().filter(|i| *i < MAX_ORDINALS).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if let Some(dev) = self.devices[index].get() {
            return Ok(dev);
        }
        let _guard = self.registering.lock();
        if let Some(dev) = self.devices[index].get() {
            return Ok(dev);
        }
        let dev = self.register(ordinal)?;
        let _ = self.devices[index].set(dev);
        if self.registered.fetch_add(1, Ordering::AcqRel) == 0 {
            self.only_ordinal.store(ordinal, Ordering::Release);
        } else {
            self.only_ordinal.store(-1, Ordering::Release);
        }
        Ok(self.devices[index].get().expect("just set"))
    }

    fn register(&self, ordinal: CUdevice) -> Result<Dev, CUresult> {
        let uuid = driver().device_uuid(ordinal)?;
        let total = driver().device_total_mem(ordinal)?;
        let uuid_text = format_gpu_uuid(&uuid);
        let own = self.config.cap_for(&uuid_text, total);
        // A device this configuration does not name stays uncapped but counted.
        let wanted = own.unwrap_or(total);
        let slot = self.slot().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let registration = self
            .ledger
            .register_device(uuid, total, wanted, Some(slot))
            .map_err(|e| {
                log_at!(Level::Error, "{e}; GPU memory allocations on {uuid_text} are refused");
                CUDA_ERROR_OUT_OF_MEMORY
            })?;
        let kept = Kept::Cap { asked: wanted, ledger: registration.ledger_cap };
        if let Some(line) = kept.message(&uuid_text, self.ledger.path()) {
            log_at!(Level::Warn, "{line}");
        }
        let view = MemoryView::new(own, Some(registration.ledger_cap), total);
        log_at!(Level::Debug, "device {ordinal} is {uuid_text}: {} of memory, cap {}", format_bytes(total), format_bytes(view.cap));
        Ok(Dev { ordinal, id: registration.device, uuid, limit: view.cap, shown: view.total, total })
    }

    /// The device of the calling thread's current context.
    pub fn current_device(&self) -> Result<&Dev, CUresult> {
        if self.registered.load(Ordering::Acquire) == 1 {
            let only = self.only_ordinal.load(Ordering::Acquire);
            if only >= 0 {
                if let Some(dev) = self.devices[only as usize].get() {
                    return Ok(dev);
                }
            }
        }
        let ordinal = driver().context_device()?;
        self.device(ordinal)
    }

    /// Every device this process has registered.
    pub fn registered_devices(&self) -> impl Iterator<Item = &Dev> {
        self.devices.iter().filter_map(|cell| cell.get())
    }

    /// A device already registered by ordinal (for frees).
    pub fn known_device(&self, ordinal: CUdevice) -> Option<&Dev> {
        self.devices.get(usize::try_from(ordinal).ok()?)?.get()
    }

    /// Reserves `bytes` on `dev` against the cap before the driver is asked. Before saying
    /// no, the ledger takes back other processes' unspent credit and drops dead processes;
    /// a refusal is counted and said in one line (rate-limited), and
    /// `CUDA_ERROR_OUT_OF_MEMORY` returned.
    pub fn reserve(&self, dev: &Dev, bytes: u64, call: &str) -> Result<(), CUresult> {
        let slot = self.slot().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        crate::hooks::untracked::before_reserving(self, bytes);
        let refusal = match self.ledger.reserve(slot, dev.id, bytes, dev.limit) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        self.ledger.count_refusal(dev.id);
        static LIMIT: RateLimit = RateLimit::new(1_000_000_000);
        if let Some(held_back) = LIMIT.check(log::monotonic_ns()) {
            let more = if held_back > 0 { format!(" ({held_back} more refusals not shown)") } else { String::new() };
            if refusal.lock_timeout {
                log_at!(
                    Level::Error,
                    "{call} of {} refused on {}: ledger {} stayed locked by another process for too long{more}",
                    format_bytes(refusal.requested),
                    format_gpu_uuid(&dev.uuid),
                    self.ledger.path().display()
                );
            } else {
                log_at!(
                    Level::Warn,
                    "{call} of {} refused on {}: the container already holds {} of its {} cap{more}",
                    format_bytes(refusal.requested),
                    format_gpu_uuid(&dev.uuid),
                    format_bytes(refusal.used),
                    format_bytes(refusal.cap)
                );
            }
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Returns bytes to the ledger (through this process's credit).
    pub fn release(&self, dev: &Dev, bytes: u64) {
        if let Some(slot) = self.slot_if_joined() {
            self.ledger.release(slot, dev.id, bytes);
        }
    }

    /// Counts memory the driver has already handed out (corrections upwards).
    pub fn force_add(&self, dev: &Dev, bytes: u64) {
        if let Some(slot) = self.slot_if_joined() {
            self.ledger.force_add(slot, dev.id, bytes);
        }
    }

    /// Moves a reservation of `reserved` bytes to the `actual` amount the driver took.
    pub fn settle(&self, dev: &Dev, reserved: u64, actual: u64) {
        if actual > reserved {
            log_at!(Level::Debug, "device {}: the driver took {} bytes more than reserved ({reserved} reserved, {actual} taken); counted", dev.ordinal, actual - reserved);
            self.force_add(dev, actual - reserved);
        } else if reserved > actual {
            self.release(dev, reserved - actual);
        }
    }

    /// What every process of the ledger holds on `dev`.
    pub fn container_used(&self, dev: &Dev) -> u64 {
        self.ledger.used(dev.id)
    }
}
