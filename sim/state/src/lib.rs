//! Shared state of the simulated NVIDIA driver (`libcuda.so.1` and `libnvidia-ml.so.1` of
//! the `sim/` crates), and the ground truth that tests read.
//!
//! One fixed-size file (default `/tmp/fgpu-sim-state`, or `$FGPU_SIM_STATE`), mapped
//! `MAP_SHARED` by every process that uses the simulated driver. It holds:
//! - a header with the configuration read from `FGPU_SIM_*` when the file was created;
//! - one record per simulated device: name, UUID, PCI ids, total memory and the atomic
//!   counter of used bytes that allocations compare-and-swap against;
//! - one record per device of its health: whether it fell off the bus, and a ring of its
//!   recent NVML events, XIDs among them ([`events`]);
//! - a table of [`MAX_PROCESSES`] process slots: pid, host pid, per-device bytes in use.
//!
//! Liveness: a process holding a slot keeps a classic POSIX `fcntl` write lock on the
//! slot's first byte for its whole life. The kernel drops that lock when the process
//! exits or is killed, so anyone can tell a dead slot (the byte can be locked) from a live
//! one, across PID namespaces and regardless of PID reuse. A dead process's memory is
//! given back by whoever notices first (see [`SimState::reclaim_dead`]).
//!
//! Because classic `fcntl` locks belong to the process and are all dropped when the
//! process closes *any* descriptor of the file, this crate never closes a descriptor of a
//! state file: each file is opened and mapped once per process (per copy of this crate)
//! and kept until exit.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod duration;
pub mod events;
pub mod mig;
pub mod pool;
pub mod size;
pub mod timeline;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

pub use duration::parse_duration;
pub use mig::{ComputeInstance, GpuInstance, MigDevice, MigError, Product};
pub use size::parse_size;
pub use timeline::{now_ns, BusyWindow, ContextBusy, ProcessSample, ProcessUtilisation, TimelineContext, TimelineError, UtilisationPeriod, Work};

/// Most simulated devices.
pub const MAX_DEVICES: usize = 8;
/// Size of the process table.
pub const MAX_PROCESSES: usize = 1024;
/// State file used when `FGPU_SIM_STATE` is unset.
pub const DEFAULT_PATH: &str = "/tmp/fgpu-sim-state";
/// Device memory the simulated driver keeps for itself on every device, never usable by
/// processes: NVML's `nvmlMemory_v2_t.reserved`, and part of `used` in `nvmlMemory_t`.
pub const DRIVER_RESERVED: u64 = 32 << 20;
/// Inode number of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel).
pub const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

const MAGIC: u64 = u64::from_le_bytes(*b"FGPUSIM1");
const LAYOUT_VERSION: u32 = 4;
const HEADER_SIZE: usize = 256;
const DEVICE_SIZE: usize = 256;
const SLOT_SIZE: usize = 256;
const DEVICES_OFF: usize = HEADER_SIZE;
const SLOTS_OFF: usize = 4096;
/// Where each GPU's MIG record starts (see [`mig`]).
const MIG_OFF: usize = SLOTS_OFF + MAX_PROCESSES * SLOT_SIZE;
/// Where the timelines start (see [`timeline`]): one per GPU and one per compute instance
/// lane ([`mig::LANES`] per GPU, [`timeline_index`]).
const TIMELINE_OFF: usize = (MIG_OFF + MAX_DEVICES * mig::MIG_REC_SIZE).div_ceil(4096) * 4096;
/// Timelines in the state file.
pub const MAX_TIMELINES: usize = MAX_DEVICES * mig::LANES;
/// Total size of the state file (sparse: a timeline's pages are touched only when its
/// device runs work).
pub const FILE_SIZE: usize = TIMELINE_OFF + MAX_TIMELINES * timeline::DEVICE_TIMELINE_SIZE;
/// How long a process of a nested PID namespace waits at registration for its host PID
/// while a watcher runs ([`SimState::register`]).
pub const HOST_PID_WAIT_NS: u64 = 2_000_000_000;
/// A watcher that looked this recently runs ([`SimState::watch_host_pids`]).
const WATCH_FRESH_NS: u64 = 200_000_000;
/// Byte locked (blocking) while a process creates or checks the file.
const INIT_LOCK_BYTE: i64 = 8;

const ST_FREE: u64 = 0;
const ST_CLAIMING: u64 = 1;
const ST_LIVE: u64 = 2;
const ST_RECLAIMING: u64 = 3;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    layout_version: u32,
    device_count: u32,
    driver_version: u32,
    _pad0: u32,
    context_overhead: u64,
    driver_reserved: u64,
    file_size: u64,
    /// Time slice of the device timelines, ns.
    timeslice_ns: u64,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC when the file was created, ns: turns timeline
    /// times into the CPU timestamps NVML reports, the same in every process.
    realtime_offset_ns: i64,
    /// NVML's sample period, ns (0: [`timeline::SAMPLE_PERIOD_NS`]).
    sample_period_ns: u64,
    /// Which PIDs NVML gives ([`NvmlPidsMode`] as its code; 0 for the default).
    nvml_pids: u32,
    _pad1: u32,
    /// When a process of the host's namespace last filled host PIDs in for the others
    /// ([`SimState::watch_host_pids`]), `CLOCK_MONOTONIC` ns; 0 if never.
    host_watch_ns: AtomicU64,
    /// How long the driver keeps a dead process's memory after its death is first seen, ns.
    exit_free_delay_ns: u64,
    /// The simulated product ([`Product`] as its code).
    product: u32,
    _pad2: u32,
    /// Random at creation: makes MIG UUIDs differ between state files.
    mig_nonce: u64,
    /// Changes at every event posted and every GPU lost or recovered: what event waiters
    /// sleep on ([`events`]).
    event_generation: AtomicU32,
    _pad3: u32,
    /// Random at creation unless `FGPU_SIM_UUID_SEED` pinned it: the GPUs' UUIDs derive
    /// from it ([`device_uuid_bytes`]), so two state files (two simulated hosts) share none.
    uuid_seed: u64,
    _reserved: [u64; 16],
}

#[repr(C)]
struct DeviceRec {
    used: AtomicU64,
    total: u64,
    uuid: [u8; 16],
    name: [u8; 64],
    serial: [u8; 32],
    pci_domain: u32,
    pci_bus: u32,
    pci_device: u32,
    pci_device_id: u32,
    pci_subsystem_id: u32,
    minor_number: u32,
    _pad: [u8; 104],
}

#[repr(C)]
struct SlotRec {
    /// `tag << 32 | generation << 8 | state`.
    state: AtomicU64,
    owner_key: AtomicU64,
    pid: AtomicU32,
    host_pid: AtomicU32,
    pidns_ino: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    contexts: [AtomicU32; MAX_DEVICES],
    /// What else the process is to NVML besides a compute process ([`KIND_GRAPHICS`],
    /// [`KIND_MPS`]), from `FGPU_SIM_PROCESS_KINDS` when it registered.
    kinds: AtomicU32,
    _pad0: u32,
    /// CLOCK_MONOTONIC (ns) when the process was first seen dead (0: not yet), for
    /// `FGPU_SIM_EXIT_FREE_DELAY`.
    died_ns: AtomicU64,
    /// Per GPU, the MIG device the process is bound to (`mig::unbinding`), 0 if none.
    mig: [AtomicU32; MAX_DEVICES],
    _pad: [u8; 80],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<DeviceRec>() == DEVICE_SIZE);
const _: () = assert!(std::mem::size_of::<SlotRec>() == SLOT_SIZE);
const _: () = assert!(DEVICES_OFF + MAX_DEVICES * DEVICE_SIZE <= SLOTS_OFF);
const _: () = assert!(timeline_index(MAX_DEVICES - 1, mig::LANES - 1) < MAX_TIMELINES);
// The timelines' lock bytes lie below the MIG locks.
const _: () = assert!(timeline::TIMELINE_LOCK_BYTE + MAX_TIMELINES as i64 <= mig::MIG_LOCK_BYTE);

/// The timeline of lane `lane` of GPU `device` (lane 0 is the GPU's own, so a GPU's
/// index is its lane-0 timeline; lanes 1..[`mig::LANES`] are its MIG devices').
pub const fn timeline_index(device: usize, lane: usize) -> usize {
    lane * MAX_DEVICES + device
}

fn pack(tag: u32, gen: u32, st: u64) -> u64 {
    ((tag as u64) << 32) | (((gen & 0x00FF_FFFF) as u64) << 8) | st
}
fn st_kind(v: u64) -> u64 {
    v & 0xFF
}
fn st_gen(v: u64) -> u32 {
    ((v >> 8) & 0x00FF_FFFF) as u32
}
fn st_tag(v: u64) -> u32 {
    (v >> 32) as u32
}

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

    fn code(self) -> u32 {
        match self {
            NvmlPidsMode::Caller => 0,
            NvmlPidsMode::Host => 1,
            NvmlPidsMode::CallerNoMemory => 2,
            NvmlPidsMode::None => 3,
        }
    }

    fn from_code(code: u32) -> NvmlPidsMode {
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
fn own_kinds() -> u32 {
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
fn parse_seed(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// PCI location and ids of a simulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciLocation {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// `(device id << 16) | vendor id`, as NVML reports it.
    pub pci_device_id: u32,
    /// `(subsystem id << 16) | subsystem vendor id`, as NVML reports it.
    pub pci_subsystem_id: u32,
}

/// One live process using the simulated driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimProcess {
    /// Index in the process table.
    pub slot: usize,
    /// The process's pid in its own PID namespace.
    pub pid: u32,
    /// The pid in the initial PID namespace, 0 where unknown.
    pub host_pid: u32,
    /// The pid as the querying process sees it (from `F_GETLK`), 0 where not visible.
    pub visible_pid: u32,
    /// Bytes in use per device (index = device).
    pub per_device_used: Vec<u64>,
    /// CUDA contexts per device.
    pub per_device_contexts: Vec<u32>,
    /// [`KIND_GRAPHICS`], [`KIND_MPS`].
    pub kinds: u32,
    /// Per device, the MIG device (GPU instance ID, compute instance ID) the process is
    /// bound to.
    pub mig: Vec<Option<(u32, u32)>>,
}

struct Mapping {
    dev: u64,
    ino: u64,
    fd: i32,
    base: usize,
}

/// Every state file this process opened, with its descriptor and mapping (never closed).
static OPEN_FILES: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());
/// Serialises slot claims and reclaims inside this process (fcntl locks are per process,
/// so two threads must not both believe they hold a slot's byte).
static SLOT_LOCK: Mutex<()> = Mutex::new(());

/// Handle on a mapped state file. Cheap to copy; the mapping lives until process exit.
#[derive(Clone, Copy)]
pub struct SimState {
    base: *mut u8,
    fd: i32,
}

// SAFETY: the mapping is never unmapped, and every field that more than one thread or
// process writes after initialisation is an atomic; the rest is written once under the
// init lock before the magic is published with Release ordering.
unsafe impl Send for SimState {}
// SAFETY: as above.
unsafe impl Sync for SimState {}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn flock(fd: i32, cmd: i32, ty: i32, off: i64) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = off as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: fd is a descriptor we own and fl is a valid, initialised struct flock.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(fl);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Inode of a namespace link such as `/proc/self/ns/pid` (follows the link).
fn ns_inode(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// 64 random bits (`getrandom`), or the clocks and pid mixed where that fails.
fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writing at most 8 bytes into a local u64.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if n == 8 {
        return v;
    }
    splitmix(timeline::realtime_offset_ns() as u64 ^ now_ns().rotate_left(17) ^ ((getpid() as u64) << 32))
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Whether the calling process is in the initial PID namespace.
pub fn in_init_pid_namespace() -> bool {
    ns_inode("/proc/self/ns/pid") == Some(PROC_PID_INIT_INO)
}

/// The calling process's pid in the initial PID namespace, where it can know it: its own
/// namespace is the initial one, or `/proc` belongs to the initial namespace and
/// `/proc/self/status` lists `NSpid`. Otherwise 0.
pub fn own_host_pid() -> u32 {
    let pid = getpid();
    if in_init_pid_namespace() {
        return pid;
    }
    if ns_inode("/proc/1/ns/pid") == Some(PROC_PID_INIT_INO) {
        if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
            for line in s.lines() {
                if let Some(rest) = line.strip_prefix("NSpid:") {
                    if let Some(first) = rest.split_whitespace().next() {
                        return first.parse().unwrap_or(0);
                    }
                }
            }
        }
    }
    0
}

/// A key that names this process uniquely on the machine (pid namespace, pid, start
/// time), the same in every copy of this crate loaded into the process.
fn compute_owner_key() -> u64 {
    let pid = getpid() as u64;
    let ns = ns_inode("/proc/self/ns/pid").unwrap_or(0);
    let start = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rfind(')').map(|i| &s[i + 1..])?.to_string();
            // Fields after the command: state is field 3, starttime field 22.
            after.split_whitespace().nth(19).and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let k = splitmix(splitmix(splitmix(pid) ^ ns) ^ start);
    if k == 0 {
        1
    } else {
        k
    }
}

static KEY_CACHE: Mutex<(u32, u64)> = Mutex::new((0, 0));

fn owner_key() -> u64 {
    let pid = getpid();
    let mut g = KEY_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if g.0 != pid || g.1 == 0 {
        *g = (pid, compute_owner_key());
    }
    g.1
}

fn tag_of(key: u64) -> u32 {
    (key as u32) | 1
}

fn copy_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
    dst[n..].fill(0);
}

fn read_str(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// The UUID of device `index` of a state file whose UUID seed is `seed`: random-looking,
/// different for every seed (every simulated host) and index. Seed 0 gives the UUIDs every
/// state file had before the seed (GPU 0: `GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505`).
pub fn device_uuid_bytes(seed: u64, index: u32) -> [u8; 16] {
    // The index takes the low bits, the seed rotated out of them: two seeds give the same
    // UUID only if they differ in nothing but the 3 bits an index can flip.
    let a = splitmix(0x6667_7075_5349_4D00 ^ seed.rotate_left(8) ^ index as u64);
    let b = splitmix(a ^ 0x5555_AAAA_0000_FFFF);
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&a.to_be_bytes());
    u[8..].copy_from_slice(&b.to_be_bytes());
    u
}

/// The simulator's stand-in for `/proc/driver/nvidia/capabilities/mig/config` of the state
/// file at `state`: `STATE.mig-config`. Whoever can read it may create and destroy MIG
/// instances (root always may), as read access to the real capability file grants that.
pub fn mig_config_capability_path(state: &Path) -> PathBuf {
    let mut p = state.as_os_str().to_owned();
    p.push(".mig-config");
    PathBuf::from(p)
}

/// Creates the capability file of a new state file: empty, readable by its creator only
/// (the real one is `-r-------- root`).
fn create_mig_config_capability(state: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = mig_config_capability_path(state);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(&path);
}

/// Formats 16 UUID bytes the way NVML does: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_gpu_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", h[0..4].concat(), h[4..6].concat(), h[6..8].concat(), h[8..10].concat(), h[10..16].concat())
}

impl SimState {
    /// The state file path: `$FGPU_SIM_STATE`, or [`DEFAULT_PATH`].
    pub fn default_path() -> PathBuf {
        match std::env::var_os("FGPU_SIM_STATE") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from(DEFAULT_PATH),
        }
    }

    /// Opens (creating if needed, with [`SimConfig::from_env`]) the default state file.
    pub fn open_default() -> io::Result<SimState> {
        Self::open(Self::default_path())
    }

    /// Opens `path`, creating it with the configuration from the environment if it does
    /// not exist yet.
    pub fn open<P: AsRef<Path>>(path: P) -> io::Result<SimState> {
        Self::open_inner(path.as_ref(), None)
    }

    /// Opens `path`, creating it with `cfg` (not the environment) if it does not exist.
    pub fn open_with<P: AsRef<Path>>(path: P, cfg: &SimConfig) -> io::Result<SimState> {
        Self::open_inner(path.as_ref(), Some(cfg))
    }

    fn open_inner(path: &Path, cfg: Option<&SimConfig>) -> io::Result<SimState> {
        let c = cstr(path)?;
        {
            // Reuse a file this process already mapped: opening it again and closing the
            // new descriptor would drop this process's slot lock.
            // SAFETY: a zeroed stat is valid; c is a NUL-terminated path.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: c is valid and st is writable.
            if unsafe { libc::stat(c.as_ptr(), &mut st) } == 0 {
                let files = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(m) = files.iter().find(|m| m.dev == st.st_dev as u64 && m.ino == st.st_ino as u64) {
                    return Ok(SimState { base: m.base as *mut u8, fd: m.fd });
                }
            }
        }
        let mut files = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: c is a valid NUL-terminated path; flags and mode are plain integers.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o666 as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // From here on `fd` is never closed (see the crate documentation).
        // SAFETY: zeroed stat is valid; fd is open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and st writable.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(m) = files.iter().find(|m| m.dev == st.st_dev as u64 && m.ino == st.st_ino as u64) {
            // Raced with a rename; keep the new descriptor open (closing it would drop locks).
            return Ok(SimState { base: m.base as *mut u8, fd: m.fd });
        }
        flock(fd, libc::F_SETLKW, libc::F_WRLCK, INIT_LOCK_BYTE)?;
        let result = Self::map_and_init(fd, &st, cfg);
        if let Ok((_, true)) = result {
            create_mig_config_capability(path);
        }
        let _ = flock(fd, libc::F_SETLK, libc::F_UNLCK, INIT_LOCK_BYTE);
        let (base, _) = result?;
        files.push(Mapping { dev: st.st_dev as u64, ino: st.st_ino as u64, fd, base: base as usize });
        Ok(SimState { base, fd })
    }

    /// Maps the file and initialises it if nobody has; `true` when this call initialised it.
    fn map_and_init(fd: i32, st: &libc::stat, cfg: Option<&SimConfig>) -> io::Result<(*mut u8, bool)> {
        let fresh = (st.st_size as usize) < FILE_SIZE;
        if fresh {
            // Let processes of other users join (a simulated /dev/nvidia*).
            // SAFETY: fd is open.
            unsafe { libc::fchmod(fd, 0o666) };
            // SAFETY: fd is open; FILE_SIZE fits off_t.
            if unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: mapping FILE_SIZE bytes of a file at least that long, shared, read-write.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), FILE_SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as *mut u8;
        let s = SimState { base, fd };
        let magic = s.header().magic.load(Ordering::Acquire);
        if magic == 0 {
            let cfg = match cfg {
                Some(c) => Ok(c.clone()),
                None => SimConfig::from_env(),
            };
            match cfg {
                Ok(cfg) => {
                    s.initialise(&cfg);
                    return Ok((base, true));
                }
                Err(e) => {
                    // SAFETY: unmapping the mapping made above, not shared with anyone yet.
                    unsafe { libc::munmap(p, FILE_SIZE) };
                    return Err(e);
                }
            }
        } else if magic != MAGIC || s.header().layout_version != LAYOUT_VERSION {
            // SAFETY: as above.
            unsafe { libc::munmap(p, FILE_SIZE) };
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not an fgpu simulator state file of this version"));
        }
        Ok((base, false))
    }

    /// Writes the header and device records. Called once, under the init lock, before the
    /// magic is published.
    fn initialise(&self, cfg: &SimConfig) {
        // SAFETY: the caller holds the init lock and nobody reads the non-atomic fields
        // before the magic is set; the header lies inside the mapping.
        let h = unsafe { &mut *(self.base as *mut Header) };
        h.layout_version = LAYOUT_VERSION;
        h.device_count = cfg.devices.min(MAX_DEVICES as u32);
        h.driver_version = cfg.driver_version;
        h.context_overhead = cfg.context_overhead;
        let memory = cfg.product.memory().unwrap_or(cfg.memory);
        h.driver_reserved = DRIVER_RESERVED.min(memory / 2);
        h.file_size = FILE_SIZE as u64;
        h.timeslice_ns = cfg.timeslice_ns.max(1);
        h.sample_period_ns = cfg.sample_period_ns;
        h.exit_free_delay_ns = cfg.exit_free_delay_ns;
        h.nvml_pids = cfg.nvml_pids.code();
        h.realtime_offset_ns = timeline::realtime_offset_ns();
        h.product = cfg.product.code();
        h.mig_nonce = random_u64();
        let uuid_seed = cfg.uuid_seed.unwrap_or_else(random_u64);
        h.uuid_seed = uuid_seed;
        let (pci_device_id, pci_subsystem_id) = cfg.product.pci_ids();
        for i in 0..MAX_DEVICES {
            // SAFETY: device records lie inside the mapping; exclusive as above.
            let d = unsafe { &mut *(self.base.add(DEVICES_OFF + i * DEVICE_SIZE) as *mut DeviceRec) };
            d.used.store(0, Ordering::Relaxed);
            d.total = memory;
            d.uuid = device_uuid_bytes(uuid_seed, i as u32);
            copy_str(&mut d.name, cfg.product.name());
            copy_str(&mut d.serial, &format!("{}", 1_650_924_000_000u64 + i as u64));
            d.pci_domain = 0;
            d.pci_bus = 0x18 + i as u32 * 0x10;
            d.pci_device = 0;
            d.pci_device_id = pci_device_id;
            d.pci_subsystem_id = pci_subsystem_id;
            d.minor_number = i as u32;
            self.init_mig(i, cfg.product.has_mig() && cfg.mig & (1 << i) != 0);
        }
        self.header().magic.store(MAGIC, Ordering::Release);
    }

    fn header(&self) -> &Header {
        // SAFETY: the header lies at the start of the mapping, which lives forever.
        unsafe { &*(self.base as *const Header) }
    }

    fn dev(&self, i: usize) -> &DeviceRec {
        let i = i.min(MAX_DEVICES - 1);
        // SAFETY: index clamped; records lie inside the mapping.
        unsafe { &*(self.base.add(DEVICES_OFF + i * DEVICE_SIZE) as *const DeviceRec) }
    }

    fn slot(&self, i: usize) -> &SlotRec {
        let i = i.min(MAX_PROCESSES - 1);
        // SAFETY: index clamped; slots lie inside the mapping.
        unsafe { &*(self.base.add(SLOTS_OFF + i * SLOT_SIZE) as *const SlotRec) }
    }

    fn lock_byte(i: usize) -> i64 {
        (SLOTS_OFF + i * SLOT_SIZE) as i64
    }

    /// Number of simulated devices.
    pub fn device_count(&self) -> usize {
        self.header().device_count as usize
    }
    /// `cuDriverGetVersion` value.
    pub fn driver_version(&self) -> u32 {
        self.header().driver_version
    }
    /// Time slice of the device timelines' round robin, ns.
    pub fn timeslice_ns(&self) -> u64 {
        self.header().timeslice_ns.max(1)
    }
    /// NVML's utilisation sample period, ns (`FGPU_SIM_SAMPLE_PERIOD`).
    pub fn sample_period_ns(&self) -> u64 {
        match self.header().sample_period_ns {
            0 => timeline::SAMPLE_PERIOD_NS,
            p => p,
        }
    }
    /// Which PIDs NVML gives (`FGPU_SIM_NVML_PIDS`).
    pub fn nvml_pids(&self) -> NvmlPidsMode {
        NvmlPidsMode::from_code(self.header().nvml_pids)
    }
    /// Device memory each CUDA context takes.
    pub fn context_overhead(&self) -> u64 {
        self.header().context_overhead
    }
    /// Device memory kept by the simulated driver on each device ([`DRIVER_RESERVED`]).
    pub fn driver_reserved(&self) -> u64 {
        self.header().driver_reserved
    }
    /// Physical memory of device `i`.
    pub fn device_total(&self, i: usize) -> u64 {
        self.dev(i).total
    }
    /// Memory of device `i` processes can use: total less the driver's reservation.
    pub fn device_usable(&self, i: usize) -> u64 {
        self.device_total(i).saturating_sub(self.driver_reserved())
    }
    /// Name of device `i`.
    pub fn device_name(&self, i: usize) -> String {
        read_str(&self.dev(i).name)
    }
    /// What the GPUs' UUIDs derive from (`FGPU_SIM_UUID_SEED`, or drawn at creation).
    pub fn uuid_seed(&self) -> u64 {
        self.header().uuid_seed
    }
    /// The 16 UUID bytes of device `i` (what `cuDeviceGetUuid` returns).
    pub fn device_uuid(&self, i: usize) -> [u8; 16] {
        self.dev(i).uuid
    }
    /// `GPU-…` UUID string of device `i` (what `nvmlDeviceGetUUID` returns).
    pub fn device_uuid_string(&self, i: usize) -> String {
        format_gpu_uuid(&self.dev(i).uuid)
    }
    /// Board serial number of device `i`.
    pub fn device_serial(&self, i: usize) -> String {
        read_str(&self.dev(i).serial)
    }
    /// PCI location of device `i`.
    pub fn device_pci(&self, i: usize) -> PciLocation {
        let d = self.dev(i);
        PciLocation { domain: d.pci_domain, bus: d.pci_bus, device: d.pci_device, pci_device_id: d.pci_device_id, pci_subsystem_id: d.pci_subsystem_id }
    }
    /// Device minor number (`/dev/nvidiaN`).
    pub fn device_minor(&self, i: usize) -> u32 {
        self.dev(i).minor_number
    }

    /// The device's used-bytes counter: every process's usage, including processes that
    /// died and were not reclaimed yet. Allocation compares against this.
    pub fn device_used_counter(&self, i: usize) -> u64 {
        self.dev(i).used.load(Ordering::Acquire)
    }

    /// How long a dead process's memory stays held (`FGPU_SIM_EXIT_FREE_DELAY`), ns.
    pub fn exit_free_delay_ns(&self) -> u64 {
        self.header().exit_free_delay_ns
    }

    /// Whether slot `s` belongs to a process that died less than the exit free delay ago
    /// (its death is timed from when it is first seen): the driver still holds its memory.
    fn slot_dying(&self, s: usize) -> bool {
        let delay = self.header().exit_free_delay_ns;
        let slot = self.slot(s);
        if delay == 0 || st_kind(slot.state.load(Ordering::Acquire)) != ST_LIVE {
            return false;
        }
        match flock(self.fd, libc::F_GETLK, libc::F_WRLCK, Self::lock_byte(s)) {
            Ok(fl) if fl.l_type as i32 == libc::F_UNLCK => {}
            _ => return false, // alive (or unknown)
        }
        let now = now_ns().max(1);
        let died = match slot.died_ns.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => now,
            Err(earlier) => earlier,
        };
        now.saturating_sub(died) < delay
    }

    /// Bytes of device `i` the driver holds for processes: live ones, and dead ones whose
    /// memory is not freed yet (`FGPU_SIM_EXIT_FREE_DELAY`); other dead ones are skipped,
    /// not reclaimed.
    pub fn device_used(&self, i: usize) -> u64 {
        let mut sum = 0u64;
        let key = owner_key();
        for s in 0..MAX_PROCESSES {
            if self.slot_alive(s, key).is_some() || self.slot_dying(s) {
                sum = sum.saturating_add(self.slot(s).used[i.min(MAX_DEVICES - 1)].load(Ordering::Acquire));
            }
        }
        sum
    }

    /// Free memory of device `i` as the driver reports it: usable less live usage.
    pub fn device_free(&self, i: usize) -> u64 {
        self.device_usable(i).saturating_sub(self.device_used(i))
    }

    /// `Some(visible_pid)` when slot `s` is held by a live process (`visible_pid` is the
    /// holder's pid in the caller's namespace, 0 if not visible or if it is the caller).
    fn slot_alive(&self, s: usize, key: u64) -> Option<u32> {
        let slot = self.slot(s);
        let st = slot.state.load(Ordering::Acquire);
        if st_kind(st) != ST_LIVE {
            return None;
        }
        if st_tag(st) == tag_of(key) && slot.owner_key.load(Ordering::Acquire) == key {
            return Some(getpid());
        }
        match flock(self.fd, libc::F_GETLK, libc::F_WRLCK, Self::lock_byte(s)) {
            Ok(fl) if fl.l_type as i32 == libc::F_UNLCK => None,
            Ok(fl) => Some(fl.l_pid.max(0) as u32),
            Err(_) => Some(0),
        }
    }

    /// Live processes, with their usage. A querier in the initial PID namespace records
    /// the host pid of processes that could not know it themselves.
    pub fn processes(&self) -> Vec<SimProcess> {
        let n = self.device_count();
        let init_ns = in_init_pid_namespace();
        let mut out = Vec::new();
        let key = owner_key();
        for s in 0..MAX_PROCESSES {
            // A dead process whose memory is not freed yet is still listed, as the driver
            // lists a process until its client is freed.
            let visible = match self.slot_alive(s, key) {
                Some(visible) => visible,
                None if self.slot_dying(s) => 0,
                None => continue,
            };
            let slot = self.slot(s);
            let mut host = slot.host_pid.load(Ordering::Acquire);
            if host == 0 && init_ns && visible != 0 {
                let _ = slot.host_pid.compare_exchange(0, visible, Ordering::AcqRel, Ordering::Acquire);
                host = slot.host_pid.load(Ordering::Acquire);
            }
            out.push(SimProcess {
                slot: s,
                pid: slot.pid.load(Ordering::Acquire),
                host_pid: host,
                visible_pid: visible,
                per_device_used: (0..n).map(|d| slot.used[d].load(Ordering::Acquire)).collect(),
                per_device_contexts: (0..n).map(|d| slot.contexts[d].load(Ordering::Acquire)).collect(),
                kinds: slot.kinds.load(Ordering::Acquire),
                mig: (0..n).map(|d| mig::unbinding(slot.mig[d].load(Ordering::Acquire))).collect(),
            });
        }
        out
    }

    /// Fills in the host PID of every live process that could not know its own, as the kernel
    /// driver knows every client's: call it from a process of the host's PID namespace, every
    /// few milliseconds, for as long as processes of nested namespaces should be given their
    /// host PIDs at once (tests do, `Env::driver_watch`). Returns false outside the host's
    /// namespace, where it can do nothing.
    pub fn watch_host_pids(&self) -> bool {
        if !in_init_pid_namespace() {
            return false;
        }
        let _ = self.processes();
        self.header().host_watch_ns.store(now_ns().max(1), Ordering::Release);
        true
    }

    /// The PID NVML's process lists give `p` to the calling process, or `None` when they
    /// leave it out (see [`NvmlPidsMode`]). A caller in the host's PID namespace gets host
    /// PIDs in every mode.
    pub fn nvml_list_pid(&self, p: &SimProcess) -> Option<u32> {
        let host = (p.host_pid != 0).then_some(p.host_pid);
        if in_init_pid_namespace() {
            return host.or((p.visible_pid != 0).then_some(p.visible_pid));
        }
        match self.nvml_pids() {
            // The real driver always knows a host PID; the simulator learns a namespaced
            // process's only when a process of the host's namespace looks (docs/simulator.md),
            // and leaves it out until then rather than give a PID it does not have.
            NvmlPidsMode::Host => host,
            NvmlPidsMode::Caller | NvmlPidsMode::CallerNoMemory => (p.visible_pid != 0).then_some(p.visible_pid),
            NvmlPidsMode::None => None,
        }
    }

    /// The memory NVML's lists give for the entry `listed` (a PID from
    /// [`SimState::nvml_list_pid`]) of process `p` on device `dev`. Under
    /// [`NvmlPidsMode::CallerNoMemory`], outside the host's namespace, the driver looks the
    /// listed number up among raw host PIDs: the memory of the process whose host PID it
    /// is, usually none.
    pub fn nvml_list_memory(&self, p: &SimProcess, listed: u32, dev: usize, all: &[SimProcess]) -> u64 {
        if self.nvml_pids() == NvmlPidsMode::CallerNoMemory && !in_init_pid_namespace() {
            return all.iter().filter(|q| q.host_pid == listed && q.host_pid != 0).map(|q| q.per_device_used.get(dev).copied().unwrap_or(0)).sum();
        }
        p.per_device_used.get(dev).copied().unwrap_or(0)
    }

    /// The PID a utilisation sample of the process in `slot` (generation `gen`) carries for
    /// the calling process: in the caller modes its PID here
    /// when the caller can see it, else its raw host PID; in the others its host PID. 0 when
    /// the simulator does not know the host PID it would need. `host` caches the host PID.
    pub(crate) fn sample_pid(&self, slot: usize, gen: u32, host: &AtomicU32) -> u32 {
        let rec = self.slot(slot);
        let same = st_gen(rec.state.load(Ordering::Acquire)) == gen;
        if host.load(Ordering::Acquire) == 0 && same {
            let known = rec.host_pid.load(Ordering::Acquire);
            if known != 0 {
                host.store(known, Ordering::Release);
            }
        }
        let visible = if same { self.slot_alive(slot, owner_key()).unwrap_or(0) } else { 0 };
        if in_init_pid_namespace() {
            if host.load(Ordering::Acquire) == 0 && visible != 0 {
                let _ = rec.host_pid.compare_exchange(0, visible, Ordering::AcqRel, Ordering::Acquire);
                host.store(visible, Ordering::Release);
            }
            return host.load(Ordering::Acquire);
        }
        match self.nvml_pids() {
            NvmlPidsMode::Caller | NvmlPidsMode::CallerNoMemory if visible != 0 => visible,
            _ => host.load(Ordering::Acquire),
        }
    }

    /// Frees the memory of every process that died (its slot byte can be locked). Returns
    /// how many slots were reclaimed.
    pub fn reclaim_dead(&self) -> usize {
        let _g = SLOT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim_dead_locked()
    }

    fn reclaim_dead_locked(&self) -> usize {
        let mytag = tag_of(owner_key());
        let mut n = 0;
        for s in 0..MAX_PROCESSES {
            let slot = self.slot(s);
            let st = slot.state.load(Ordering::Acquire);
            let kind = st_kind(st);
            if kind != ST_LIVE && kind != ST_CLAIMING {
                continue;
            }
            if st_tag(st) == mytag {
                continue; // ours (from any copy of this crate in this process)
            }
            if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                continue; // alive
            }
            let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
            if self.slot_dying(s) {
                continue; // dead, but its memory is not freed yet
            }
            if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                continue;
            }
            let rec = pack(st_tag(st), st_gen(st), ST_RECLAIMING);
            if slot.state.compare_exchange(st, rec, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                for d in 0..MAX_DEVICES {
                    let u = slot.used[d].swap(0, Ordering::AcqRel);
                    let bound = mig::unbinding(slot.mig[d].swap(0, Ordering::AcqRel));
                    if u > 0 {
                        sat_sub(&self.dev(d).used, u);
                        if let Some((gi, _)) = bound {
                            sat_sub(self.gi_used_counter(d, gi), u);
                        }
                    }
                    slot.contexts[d].store(0, Ordering::Release);
                }
                slot.owner_key.store(0, Ordering::Release);
                slot.pid.store(0, Ordering::Release);
                slot.host_pid.store(0, Ordering::Release);
                slot.pidns_ino.store(0, Ordering::Release);
                slot.died_ns.store(0, Ordering::Release);
                slot.kinds.store(0, Ordering::Release);
                slot.state.store(pack(0, st_gen(st).wrapping_add(1), ST_FREE), Ordering::Release);
                n += 1;
            }
            let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
        }
        n
    }

    /// Claims a process slot for the calling process and locks its byte for the rest of
    /// the process's life. Call once per process.
    ///
    /// A process of a nested PID namespace whose host PID the simulator does not know then
    /// waits (up to [`HOST_PID_WAIT_NS`]), while a watcher runs ([`SimState::watch_host_pids`]),
    /// until the watcher has filled it in: the real driver knows every client's host PID from
    /// the start, and gives it in host-PID lists, samples and accounting (docs/simulator.md).
    pub fn register(&self) -> io::Result<usize> {
        let slot = self.claim_slot()?;
        let watched = now_ns().saturating_sub(self.header().host_watch_ns.load(Ordering::Acquire)) < WATCH_FRESH_NS;
        if watched && self.slot(slot).host_pid.load(Ordering::Acquire) == 0 {
            let deadline = now_ns() + HOST_PID_WAIT_NS;
            while self.slot(slot).host_pid.load(Ordering::Acquire) == 0 && now_ns() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(slot)
    }

    fn claim_slot(&self) -> io::Result<usize> {
        let _g = SLOT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let key = owner_key();
        let tag = tag_of(key);
        for pass in 0..2 {
            for s in 0..MAX_PROCESSES {
                let slot = self.slot(s);
                let st = slot.state.load(Ordering::Acquire);
                if st_kind(st) != ST_FREE {
                    continue;
                }
                let gen = st_gen(st).wrapping_add(1);
                let claiming = pack(tag, gen, ST_CLAIMING);
                if slot.state.compare_exchange(st, claiming, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    continue;
                }
                slot.owner_key.store(key, Ordering::Release);
                slot.pid.store(getpid(), Ordering::Release);
                slot.host_pid.store(own_host_pid(), Ordering::Release);
                slot.pidns_ino.store(ns_inode("/proc/self/ns/pid").unwrap_or(0), Ordering::Release);
                slot.died_ns.store(0, Ordering::Release);
                slot.kinds.store(own_kinds(), Ordering::Release);
                for d in 0..MAX_DEVICES {
                    slot.used[d].store(0, Ordering::Release);
                    slot.contexts[d].store(0, Ordering::Release);
                    slot.mig[d].store(0, Ordering::Release);
                }
                if flock(self.fd, libc::F_SETLK, libc::F_WRLCK, Self::lock_byte(s)).is_err() {
                    let _ = slot.state.compare_exchange(claiming, pack(0, gen, ST_FREE), Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
                if slot.state.compare_exchange(claiming, pack(tag, gen, ST_LIVE), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return Ok(s);
                }
                let _ = flock(self.fd, libc::F_SETLK, libc::F_UNLCK, Self::lock_byte(s));
            }
            if pass == 0 {
                self.reclaim_dead_locked();
            }
        }
        Err(io::Error::other("simulated driver: process table full"))
    }

    /// Takes `bytes` of device `dev` for the process in `slot`. Never lets the device's
    /// usage pass its usable memory; reclaims dead processes once before failing.
    /// Returns false when the memory is not there (CUDA_ERROR_OUT_OF_MEMORY).
    #[inline]
    pub fn try_alloc(&self, slot: usize, dev: usize, bytes: u64) -> bool {
        if dev >= self.device_count() {
            return false;
        }
        // A process bound to a MIG device takes from its GPU instance's memory; the GPU's
        // counter follows (it is then the sum of its GPU instances').
        let bound = mig::unbinding(self.slot(slot).mig[dev].load(Ordering::Acquire));
        let (counter, limit) = match bound {
            Some((gi, _)) => (self.gi_used_counter(dev, gi), self.gi_memory(dev, gi)),
            None => (&self.dev(dev).used, self.device_usable(dev)),
        };
        let mut reclaimed = false;
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            match cur.checked_add(bytes) {
                Some(next) if next <= limit => match counter.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => {
                        if bound.is_some() {
                            self.dev(dev).used.fetch_add(bytes, Ordering::AcqRel);
                        }
                        self.slot(slot).used[dev].fetch_add(bytes, Ordering::AcqRel);
                        return true;
                    }
                    Err(actual) => cur = actual,
                },
                _ => {
                    if reclaimed {
                        return false;
                    }
                    reclaimed = true;
                    if self.reclaim_dead() == 0 {
                        return false;
                    }
                    cur = counter.load(Ordering::Relaxed);
                }
            }
        }
    }

    /// Gives back `bytes` of device `dev` taken by the process in `slot`.
    #[inline]
    pub fn release(&self, slot: usize, dev: usize, bytes: u64) {
        if dev >= MAX_DEVICES || bytes == 0 {
            return;
        }
        sat_sub(&self.slot(slot).used[dev], bytes);
        sat_sub(&self.dev(dev).used, bytes);
        if let Some((gi, _)) = mig::unbinding(self.slot(slot).mig[dev].load(Ordering::Acquire)) {
            sat_sub(self.gi_used_counter(dev, gi), bytes);
        }
    }

    /// Records a CUDA context created (`+1`) or destroyed (`-1`) on `dev` by `slot`.
    pub fn count_context(&self, slot: usize, dev: usize, created: bool) {
        if dev >= MAX_DEVICES {
            return;
        }
        let c = &self.slot(slot).contexts[dev];
        if created {
            c.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(1)));
        }
    }

    /// Bytes of `dev` the process in `slot` holds.
    pub fn slot_used(&self, slot: usize, dev: usize) -> u64 {
        self.slot(slot).used[dev.min(MAX_DEVICES - 1)].load(Ordering::Acquire)
    }
}

fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| Some(x.saturating_sub(v)));
}

#[cfg(test)]
mod temp_state;
#[cfg(test)]
mod tests;
