//! The records of the process's driver: allocations, contexts, pools, VMM handles,
//! arrays, graphs, modules, libraries, events and captures, the tables that hold them
//! ([`Inner`]) and the driver itself ([`Driver`]).

use crate::va::VaSpace;
use fgpu_sim_state::pool::PoolModel;
use fgpu_sim_state::{MigDevice, SimState, TimelineContext};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

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
    pub(super) next_handle: u64,
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
