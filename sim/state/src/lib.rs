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

mod config;
mod devices;
pub mod duration;
pub mod events;
mod layout;
pub mod mig;
pub mod pool;
mod processes;
pub mod size;
mod sys;
pub mod timeline;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use config::own_kinds;
pub use config::{parse_mig_mask, NvmlPidsMode, SimConfig, KIND_GRAPHICS, KIND_MPS};
pub use duration::parse_duration;
pub use layout::*;
pub use mig::{ComputeInstance, GpuInstance, MigDevice, MigError, Product};
pub use size::parse_size;
use sys::*;
pub use sys::{in_init_pid_namespace, own_host_pid};
pub use timeline::{now_ns, BusyWindow, ContextBusy, ProcessSample, ProcessUtilisation, TimelineContext, TimelineError, UtilisationPeriod, Work};

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
}

#[cfg(test)]
mod temp_state;
#[cfg(test)]
mod tests;
