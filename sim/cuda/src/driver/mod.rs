//! Process-local state of the simulated CUDA driver: contexts, allocations, pools, VMM
//! handles, arrays, modules, streams and events. Device memory and the device timeline
//! (when work runs) are kept in the shared state file.

use crate::errors::*;
use crate::va::VaSpace;
use fgpu_sim_state::pool::{round_up, PoolModel};
use fgpu_sim_state::timeline::Delivery;
use fgpu_sim_state::{now_ns, MigDevice, SimState, TimelineContext, TimelineError, Work};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// VMM / pool / array granularity.
pub const GRANULARITY: u64 = 2 << 20;
/// Pitch alignment of cuMemAllocPitch.
pub const PITCH_ALIGN: u64 = 512;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// cuMemAlloc / cuMemAllocPitch: device memory, not host-accessible.
    Device,
    /// cuMemAllocAsync / cuMemAllocFromPoolAsync from the pool with this handle.
    Pool(usize),
    /// cuMemAllocManaged: device memory accounted, backed by host pages at the same address.
    Managed,
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub size: u64,
    pub va_size: u64,
    pub dev: usize,
    pub ctx: usize,
    pub kind: Kind,
    pub low: bool,
}

pub struct Ctx {
    pub dev: usize,
    pub flags: u32,
    pub primary: bool,
}

#[derive(Default, Clone, Copy)]
pub struct Primary {
    pub handle: usize,
    pub refcount: u32,
    pub active: bool,
    pub flags: u32,
}

pub struct PoolRec {
    pub dev: usize,
    pub model: PoolModel,
    pub reuse: [i32; 3],
    pub max_size: u64,
    pub destroyed: bool,
    pub outstanding: u64,
}

pub struct VmmHandle {
    pub dev: usize,
    pub size: u64,
    pub released: bool,
    pub maps: u32,
}

pub struct ArrayRec {
    pub dev: usize,
    pub ctx: usize,
    pub bytes: u64,
    pub mipmapped: bool,
}

/// A CUDA graph: its memory nodes' allocations (address, bytes) and frees (address), and
/// the durations of its kernels in the order they run.
#[derive(Clone, Default)]
pub struct GraphRec {
    pub allocs: Vec<(u64, u64)>,
    pub frees: Vec<u64>,
    pub kernels: Vec<u64>,
    /// Every node, in the order added.
    pub nodes: Vec<usize>,
}

/// A node of a graph: what `cuGraphNodeGetType` and `cuGraphMemAllocNodeGetParams` report.
#[derive(Clone, Copy)]
pub enum NodeRec {
    MemAlloc { dev: usize, requested: u64, address: u64 },
    MemFree,
    ChildGraph,
    Kernel,
}

/// A loaded module (`cuModuleLoad*`, or a library loaded into a context): its context,
/// device, the device memory it takes and its kernels (name, nanoseconds per block).
pub struct ModuleRec {
    pub ctx: usize,
    pub dev: usize,
    pub bytes: u64,
    pub kernels: Vec<(String, u64)>,
    /// The library it was loaded for (0 for a plain module).
    pub library: usize,
}

/// A `CUfunction`: a kernel of a loaded module.
pub struct FuncRec {
    pub module: usize,
    pub name: String,
    pub ns_per_block: u64,
}

/// A context-independent library (`cuLibraryLoad*`): its image, and the module it has
/// become in each context that used it.
pub struct LibraryRec {
    pub bytes: u64,
    pub kernels: Vec<(String, u64)>,
    pub loaded: HashMap<usize, usize>,
}

/// A `CUkernel`: a kernel of a library.
pub struct KernelRec {
    pub library: usize,
    pub name: String,
    pub ns_per_block: u64,
}

/// An event: its context, flags, and where it was last recorded (timeline context,
/// sequence number of its marker).
pub struct EventRec {
    pub ctx: usize,
    pub flags: u32,
    pub recorded: Option<(TimelineContext, u64)>,
}

/// A stream as the timeline bookkeeping sees it: (context, stream handle), with the
/// legacy default stream as 1 and a thread's per-thread default stream as
/// `2 | thread number << 4`.
pub type StreamKey = (usize, usize);

/// A stream capture in progress: the graph being built and the thread that began it.
pub struct CaptureRec {
    pub graph: usize,
    pub mode: u32,
    pub thread: usize,
}

/// An instantiated graph. `live` holds the bytes of allocations a launch left allocated
/// (no free node in the graph); they stay used until the exec is destroyed.
pub struct ExecRec {
    pub dev: usize,
    pub graph: GraphRec,
    pub live: u64,
}

/// The per-device pool graph allocations come from (`CU_GRAPH_MEM_ATTR_*`).
#[derive(Clone, Copy, Default)]
pub struct GraphPool {
    pub used: u64,
    pub reserved: u64,
    pub used_high: u64,
    pub reserved_high: u64,
}

pub struct Inner {
    pub allocs: BTreeMap<u64, Alloc>,
    pub va: VaSpace,
    pub va32: VaSpace,
    pub contexts: HashMap<usize, Ctx>,
    pub primary: Vec<Primary>,
    pub pools: HashMap<usize, PoolRec>,
    pub default_pool: Vec<usize>,
    pub current_pool: Vec<usize>,
    pub streams: HashMap<usize, usize>,
    pub events: HashMap<usize, EventRec>,
    pub vmm: HashMap<u64, VmmHandle>,
    pub reservations: BTreeMap<u64, u64>,
    pub mappings: BTreeMap<u64, (u64, u64)>,
    pub arrays: HashMap<usize, ArrayRec>,
    pub host: HashMap<usize, usize>,
    pub graphs: HashMap<usize, GraphRec>,
    pub graph_nodes: HashMap<usize, NodeRec>,
    pub modules: HashMap<usize, ModuleRec>,
    pub functions: HashMap<usize, FuncRec>,
    pub libraries: HashMap<usize, LibraryRec>,
    pub kernels: HashMap<usize, KernelRec>,
    /// Each context's record on its device's timeline (opened at its first work).
    pub timelines: HashMap<usize, TimelineContext>,
    /// Sequence number of the last item each stream put on its context's timeline.
    pub stream_seq: HashMap<StreamKey, u64>,
    /// Streams being captured (stream handle -> capture).
    pub captures: HashMap<usize, CaptureRec>,
    pub execs: HashMap<usize, ExecRec>,
    pub graph_pools: Vec<GraphPool>,
    next_handle: u64,
}

pub struct Driver {
    pub state: SimState,
    pub slot: usize,
    /// CUdevice ordinal -> physical device index in the state file (CUDA_VISIBLE_DEVICES).
    pub visible: Vec<usize>,
    /// CUdevice ordinal -> the MIG device it is, if it is one.
    pub mig: Vec<Option<MigDevice>>,
    pub inner: Mutex<Inner>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
/// Set in a child forked from a process that had initialised the driver.
static FORKED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    static THREAD_NUMBER: Cell<usize> = const { Cell::new(0) };
}

/// A number for the calling thread, unique in the process (names its per-thread stream).
pub fn thread_number() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    THREAD_NUMBER.with(|n| {
        if n.get() == 0 {
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

/// End times of event markers whose queue entries were reused before anyone read them
/// (see `fgpu_sim_state::SimState::timeline_submit`). Keyed by (timeline incarnation,
/// sequence number); `live` holds the markers some event still refers to.
#[derive(Default)]
pub struct MarkerBook {
    pub live: HashSet<(u32, u64)>,
    pub ends: HashMap<(u32, u64), u64>,
}

/// Lock order: the timeline lock (inside fgpu-sim-state) may be held while taking this
/// one, never the other way round; the driver's `Inner` lock is never held with it.
pub static MARKERS: Mutex<Option<MarkerBook>> = Mutex::new(None);

pub fn markers() -> MutexGuard<'static, Option<MarkerBook>> {
    MARKERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps the end of a marker of `tl` whose queue entry is being reused, if an event still
/// refers to it.
fn keep_marker_end(tl: TimelineContext, seq: u64, end: u64) {
    let mut g = markers();
    let book = g.get_or_insert_with(MarkerBook::default);
    if book.live.contains(&(tl.incarnation, seq)) {
        book.ends.insert((tl.incarnation, seq), end);
    }
}

/// Puts `work` on a context's timeline, blocking while its queue is full (call it without
/// any lock of this process held).
pub fn submit(d: &Driver, tl: TimelineContext, work: Work) -> Result<u64, CUresult> {
    d.state.timeline_submit(tl, work, |seq, end| keep_marker_end(tl, seq, end)).map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)
}

/// Puts `work` on a context's timeline if its queue has room (never blocks; may be called
/// with the driver lock held).
pub fn try_submit(d: &Driver, tl: TimelineContext, work: Work) -> Result<Option<u64>, CUresult> {
    d.state.timeline_try_submit(tl, work, |seq, end| keep_marker_end(tl, seq, end)).map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)
}

/// Calls this process's driver fails on purpose (`FGPU_SIM_FAIL`): a comma-separated list
/// of call names, each with `=CODE` (a `CUresult` number) or without (999,
/// `CUDA_ERROR_UNKNOWN`). A name covers the call's `_ptsz` form too. Lets a test see what
/// fgpu does when the driver answers an error where it never does on this simulator.
/// Calls that honour it: `cuStreamIsCapturing`.
fn failures() -> &'static Result<Vec<(String, CUresult)>, String> {
    static FAILURES: OnceLock<Result<Vec<(String, CUresult)>, String>> = OnceLock::new();
    FAILURES.get_or_init(|| {
        let value = std::env::var("FGPU_SIM_FAIL").unwrap_or_default();
        let mut out = Vec::new();
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, code) = match item.split_once('=') {
                Some((name, code)) => {
                    (name.trim(), code.trim().parse::<CUresult>().map_err(|_| format!("FGPU_SIM_FAIL={value:?}: {code:?} is not a CUresult number"))?)
                }
                None => (item, CUDA_ERROR_UNKNOWN),
            };
            if !name.starts_with("cu") || code == CUDA_SUCCESS {
                return Err(format!("FGPU_SIM_FAIL={value:?}: {item:?} is not a call name with a non-zero CUresult"));
            }
            out.push((name.to_string(), code));
        }
        Ok(out)
    })
}

/// The error `FGPU_SIM_FAIL` makes the call `name` answer, if any.
pub fn injected_failure(name: &str) -> Option<CUresult> {
    failures().as_ref().ok()?.iter().find(|(n, _)| n == name).map(|(_, code)| *code)
}

/// How late this process learns of completions (`FGPU_SIM_LATE_DELIVERY`; checked at
/// `cuInit`, so an invalid value never gets here).
fn delivery() -> Option<Delivery> {
    Delivery::of_this_process().ok().flatten()
}

/// When this process learns that item `seq` of `tl` completed (it has): at once, or under
/// `FGPU_SIM_LATE_DELIVERY` late, with the other completions of the same stretch. An item
/// whose end is no longer kept completed long enough ago to count as known.
fn known_at(d: &Driver, tl: TimelineContext, seq: u64) -> Option<u64> {
    let delivery = delivery()?;
    let end = marker_end(d, tl, seq)?;
    Some(delivery.delivered_at(end))
}

/// Waits until item `seq` of `tl` has completed and this process knows it. A record that is
/// gone has nothing left to wait for.
pub fn wait(d: &Driver, tl: TimelineContext, seq: u64) {
    if d.state.timeline_wait(tl, seq).is_ok() {
        if let Some(at) = known_at(d, tl, seq) {
            fgpu_sim_state::timeline::sleep_until(at);
        }
    }
}

/// Whether item `seq` of `tl` has completed by now, as far as this process knows.
pub fn done(d: &Driver, tl: TimelineContext, seq: u64) -> bool {
    match d.state.timeline_completed(tl) {
        Ok(completed) if completed < seq => false,
        Ok(_) => known_at(d, tl, seq).is_none_or(|at| at <= now_ns()),
        Err(_) => true,
    }
}

/// End time of item `seq` of `tl` (a marker, or a kernel whose queue entry is still kept),
/// once completed.
pub fn marker_end(d: &Driver, tl: TimelineContext, seq: u64) -> Option<u64> {
    if let Ok(Some(t)) = d.state.timeline_end(tl, seq) {
        return Some(t);
    }
    markers().as_ref().and_then(|b| b.ends.get(&(tl.incarnation, seq)).copied())
}

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

pub fn ctx_top() -> usize {
    CTX_STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}
pub fn ctx_set_top(h: usize) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if h == 0 {
            s.pop();
        } else if let Some(t) = s.last_mut() {
            *t = h;
        } else {
            s.push(h);
        }
    })
}
pub fn ctx_push(h: usize) {
    CTX_STACK.with(|s| s.borrow_mut().push(h))
}
pub fn ctx_pop() -> Option<usize> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}
pub fn ctx_pop_if_top(h: usize) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if s.last() == Some(&h) {
            s.pop();
        }
    })
}

impl Driver {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[inline]
    pub fn phys(&self, dev: usize) -> usize {
        self.visible[dev]
    }
    pub fn ndev(&self) -> usize {
        self.visible.len()
    }
    /// The MIG device ordinal `dev` is, if it is one.
    #[inline]
    pub fn mig(&self, dev: usize) -> Option<&MigDevice> {
        self.mig.get(dev).and_then(Option::as_ref)
    }
    /// The timeline ordinal `dev`'s kernels run on: its GPU's, or its compute instance's.
    pub fn timeline_of(&self, dev: usize) -> usize {
        self.mig(dev).map_or(self.phys(dev), MigDevice::timeline)
    }
    /// Memory of ordinal `dev`: its GPU's, or its GPU instance's.
    pub fn total_mem(&self, dev: usize) -> u64 {
        self.mig(dev).map_or_else(|| self.state.device_total(self.phys(dev)), MigDevice::memory)
    }
    /// Free memory of ordinal `dev` as `cuMemGetInfo` reports it.
    pub fn free_mem(&self, dev: usize) -> u64 {
        match self.mig(dev) {
            Some(m) => self.state.gpu_instance_free(m.device, m.gpu_instance.id),
            None => self.state.device_free(self.phys(dev)),
        }
    }
    /// Multiprocessors of ordinal `dev`.
    pub fn multiprocessors(&self, dev: usize) -> u32 {
        self.mig(dev).map_or_else(|| self.state.product().sms(), MigDevice::sms)
    }
    pub fn check_dev(&self, dev: i32) -> Result<usize, CUresult> {
        if dev < 0 || dev as usize >= self.ndev() {
            Err(CUDA_ERROR_INVALID_DEVICE)
        } else {
            Ok(dev as usize)
        }
    }
    #[inline]
    pub fn take(&self, dev: usize, bytes: u64) -> bool {
        bytes == 0 || self.state.try_alloc(self.slot, self.phys(dev), bytes)
    }
    #[inline]
    pub fn give(&self, dev: usize, bytes: u64) {
        self.state.release(self.slot, self.phys(dev), bytes)
    }
}

impl Inner {
    pub fn new_handle(&mut self) -> usize {
        self.next_handle += 0x40;
        self.next_handle as usize
    }

    /// The calling thread's current context and its device. Re-activates a retained
    /// primary context after a reset.
    pub fn current(&mut self, d: &Driver) -> Result<(usize, usize), CUresult> {
        let h = ctx_top();
        if h == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        self.ctx_ready(d, h, CUDA_ERROR_CONTEXT_IS_DESTROYED).map(|dev| (h, dev))
    }

    /// Device of context `h`, making a retained primary context active if it is not.
    pub fn ctx_ready(&mut self, d: &Driver, h: usize, missing: CUresult) -> Result<usize, CUresult> {
        let (dev, primary) = match self.contexts.get(&h) {
            Some(c) => (c.dev, c.primary),
            None => return Err(missing),
        };
        if primary && !self.primary[dev].active {
            if self.primary[dev].refcount == 0 {
                return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
            }
            self.activate_primary(d, dev)?;
        }
        Ok(dev)
    }

    pub fn activate_primary(&mut self, d: &Driver, dev: usize) -> Result<(), CUresult> {
        if !d.take(dev, d.state.context_overhead()) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        d.state.count_context(d.slot, d.phys(dev), true);
        self.primary[dev].active = true;
        Ok(())
    }

    pub fn primary_handle(&mut self, dev: usize) -> usize {
        if self.primary[dev].handle == 0 {
            let h = self.new_handle();
            self.primary[dev].handle = h;
            self.contexts.insert(h, Ctx { dev, flags: 0, primary: true });
        }
        self.primary[dev].handle
    }

    /// Frees everything that belongs to context `h` (allocations, arrays, streams,
    /// events) and its own device memory.
    pub fn teardown_ctx(&mut self, d: &Driver, h: usize, dev: usize) {
        let victims: Vec<u64> = self.allocs.iter().filter(|(_, a)| a.ctx == h && !matches!(a.kind, Kind::Pool(_))).map(|(&p, _)| p).collect();
        for p in victims {
            self.free_alloc(d, p);
        }
        let arrays: Vec<usize> = self.arrays.iter().filter(|(_, a)| a.ctx == h).map(|(&k, _)| k).collect();
        for k in arrays {
            if let Some(a) = self.arrays.remove(&k) {
                d.give(a.dev, a.bytes);
            }
        }
        let modules: Vec<usize> = self.modules.iter().filter(|(_, m)| m.ctx == h).map(|(&k, _)| k).collect();
        for k in modules {
            self.unload_module(d, k);
        }
        self.streams.retain(|_, c| *c != h);
        self.events.retain(|_, e| e.ctx != h);
        self.stream_seq.retain(|k, _| k.0 != h);
        if let Some(tl) = self.timelines.remove(&h) {
            // The caller waited for the context's work (without holding this lock).
            d.state.timeline_close(tl);
        }
        d.give(dev, d.state.context_overhead());
        d.state.count_context(d.slot, d.phys(dev), false);
    }

    /// Unloads module `m`: its functions go, its memory is given back.
    pub fn unload_module(&mut self, d: &Driver, m: usize) -> bool {
        let Some(rec) = self.modules.remove(&m) else { return false };
        self.functions.retain(|_, f| f.module != m);
        if let Some(lib) = self.libraries.get_mut(&rec.library) {
            lib.loaded.retain(|_, &mut module| module != m);
        }
        d.give(rec.dev, rec.bytes);
        true
    }

    /// The context's record on its device's timeline, opened at its first work.
    pub fn timeline(&mut self, d: &Driver, ctx: usize, dev: usize) -> Result<TimelineContext, CUresult> {
        if let Some(tl) = self.timelines.get(&ctx) {
            return Ok(*tl);
        }
        let tl = d.state.timeline_open(d.timeline_of(dev), d.slot, ctx as u64).map_err(|e| match e {
            TimelineError::Full => CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            TimelineError::Gone => CUDA_ERROR_UNKNOWN,
        })?;
        self.timelines.insert(ctx, tl);
        Ok(tl)
    }

    /// Device allocation of `size` accounted bytes (and `va_size` of address space).
    pub fn alloc_device(&mut self, d: &Driver, dev: usize, ctx: usize, size: u64, va_size: u64, kind: Kind, low: bool) -> Result<u64, CUresult> {
        if !d.take(dev, size) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let va_size = round_up(va_size.max(1), 512);
        let align = if va_size >= GRANULARITY { GRANULARITY } else { 512 };
        let ptr = if kind == Kind::Managed {
            map_host(va_size)
        } else if low {
            self.va32.alloc(va_size, align)
        } else {
            self.va.alloc(va_size, align)
        };
        let Some(ptr) = ptr else {
            d.give(dev, size);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.allocs.insert(ptr, Alloc { size, va_size, dev, ctx, kind, low });
        Ok(ptr)
    }

    /// Frees allocation `ptr` (must be a key of `allocs`), wherever its memory goes.
    pub fn free_alloc(&mut self, d: &Driver, ptr: u64) -> Option<Alloc> {
        let a = self.allocs.remove(&ptr)?;
        match a.kind {
            Kind::Managed => unmap_host(ptr, a.va_size),
            _ if a.low => self.va32.free(ptr, a.va_size),
            _ => self.va.free(ptr, a.va_size),
        }
        match a.kind {
            Kind::Device | Kind::Managed => d.give(a.dev, a.size),
            Kind::Pool(ph) => {
                let mut drop_pool = false;
                if let Some(p) = self.pools.get_mut(&ph) {
                    p.model.free(a.size);
                    p.outstanding = p.outstanding.saturating_sub(1);
                    if p.destroyed && p.outstanding == 0 {
                        let r = p.model.destroy();
                        d.give(p.dev, r);
                        drop_pool = true;
                    }
                }
                if drop_pool {
                    self.pools.remove(&ph);
                }
            }
        }
        Some(a)
    }

    /// The allocation or VMM mapping containing `[ptr, ptr+len)`: (base, size, host-backed).
    pub fn find_range(&self, ptr: u64, len: u64) -> Option<(u64, u64, bool)> {
        if let Some((&b, a)) = self.allocs.range(..=ptr).next_back() {
            if ptr.checked_add(len)? <= b + a.size.max(1) && ptr >= b {
                return Some((b, a.size, a.kind == Kind::Managed));
            }
        }
        if let Some((&b, &(size, _))) = self.mappings.range(..=ptr).next_back() {
            if ptr.checked_add(len)? <= b + size {
                return Some((b, size, false));
            }
        }
        None
    }

    pub fn default_pool(&mut self, dev: usize) -> usize {
        if self.default_pool[dev] == 0 {
            let h = self.new_handle();
            self.pools.insert(h, PoolRec { dev, model: PoolModel::new(), reuse: [1, 1, 1], max_size: 0, destroyed: false, outstanding: 0 });
            self.default_pool[dev] = h;
            if self.current_pool[dev] == 0 {
                self.current_pool[dev] = h;
            }
        }
        self.default_pool[dev]
    }

    pub fn current_pool(&mut self, dev: usize) -> usize {
        let dp = self.default_pool(dev);
        if self.current_pool[dev] == 0 {
            self.current_pool[dev] = dp;
        }
        self.current_pool[dev]
    }

    pub fn pool_alloc(&mut self, d: &Driver, ph: usize, ctx: usize, size: u64) -> Result<u64, CUresult> {
        let (dev, grow) = {
            let p = self.pools.get(&ph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if p.destroyed {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let grow = p.model.grow_needed(size);
            if p.max_size != 0 && p.model.reserved + grow > p.max_size {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            (p.dev, grow)
        };
        if !d.take(dev, grow) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let va_size = round_up(size, 512);
        let align = if va_size >= GRANULARITY { GRANULARITY } else { 512 };
        let Some(ptr) = self.va.alloc(va_size, align) else {
            d.give(dev, grow);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        if let Some(p) = self.pools.get_mut(&ph) {
            p.model.commit_alloc(size, grow);
            p.outstanding += 1;
        }
        self.allocs.insert(ptr, Alloc { size, va_size, dev, ctx, kind: Kind::Pool(ph), low: false });
        Ok(ptr)
    }

    /// A synchronisation point: every pool gives back what is above its threshold.
    pub fn sync_pools(&mut self, d: &Driver) {
        for p in self.pools.values_mut() {
            let r = p.model.sync();
            if r > 0 {
                d.give(p.dev, r);
            }
        }
    }
}

/// Host pages for managed memory (accessible from the CPU, like real managed memory).
fn map_host(len: u64) -> Option<u64> {
    // SAFETY: fresh anonymous private mapping; the kernel picks the address.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        Some(p as u64)
    }
}

pub fn unmap_host(ptr: u64, len: u64) {
    // SAFETY: (ptr, len) is a mapping made by map_host and removed from every table.
    unsafe { libc::munmap(ptr as *mut libc::c_void, len as usize) };
}

/// Array bytes: width x height x depth x channels x element size, each dimension at least
/// 1, summed over mip levels, rounded up to the 2 MiB granularity.
pub fn array_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u32, levels: u32) -> Option<u64> {
    let elem: u64 = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0 => return None,
        _ => 4,
    };
    if !matches!(channels, 1 | 2 | 4) || width == 0 {
        return None;
    }
    let (mut w, mut h, mut dd) = (width, height.max(1), depth.max(1));
    let mut total: u64 = 0;
    for _ in 0..levels.max(1) {
        let b = w.checked_mul(h)?.checked_mul(dd)?.checked_mul(elem * channels as u64)?;
        total = total.checked_add(b)?;
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        dd = (dd / 2).max(1);
    }
    Some(round_up(total, GRANULARITY))
}
