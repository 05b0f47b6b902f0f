//! Simulated NVML (`libnvidia-ml.so.1`): devices, memory and utilisation from the shared
//! state of `fgpu-sim-state` (utilisation from its device timeline), enough for the real
//! `nvidia-smi`, pynvml, gpustat and nvitop.
//! Real exported names, signatures and struct layouts (nvml.h); see `docs/simulator.md`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

#[cfg(test)]
mod abi_layout;

use fgpu_sim_state::SimState;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub type NvmlReturn = c_uint;
pub type NvmlDevice = *const u64;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_v2` version: sizeof(nvmlMemory_v2_t) | 2 << 24.
const NVML_MEMORY_V2: c_uint = 0x0200_0028;
/// Instance ids reported for processes of a GPU without MIG.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// Device handles are the addresses of these words.
static HANDLES: [u64; fgpu_sim_state::MAX_DEVICES] = [0; fgpu_sim_state::MAX_DEVICES];

fn state() -> Option<SimState> {
    // The state file is opened once and never closed (see fgpu-sim-state).
    static S: OnceLock<Option<SimState>> = OnceLock::new();
    *S.get_or_init(|| SimState::open_default().ok())
}

fn guard<F: FnOnce() -> NvmlReturn>(f: F) -> NvmlReturn {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

/// Writes through a caller's output pointer (ignored when NULL).
fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: the NVML API contract makes the caller pass a pointer valid for one T.
        unsafe { p.write_unaligned(v) }
    }
}

/// Copies `s` (NUL-terminated) into a caller buffer of `len` bytes.
fn put_str(dst: *mut c_char, len: c_uint, s: &str) -> NvmlReturn {
    if dst.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (len as usize) < s.len() + 1 {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, s.len());
        *dst.add(s.len()) = 0;
    }
    NVML_SUCCESS
}

fn ready() -> Result<SimState, NvmlReturn> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    state().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The device index behind a handle.
fn dev(h: NvmlDevice) -> Result<(SimState, usize), NvmlReturn> {
    let s = ready()?;
    let base = HANDLES.as_ptr() as usize;
    let p = h as usize;
    if p < base || !(p - base).is_multiple_of(8) || (p - base) / 8 >= s.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((s, (p - base) / 8))
}

fn handle_of(i: usize) -> NvmlDevice {
    &HANDLES[i] as *const u64
}

/// Linux driver version string for the simulated CUDA version: the minimum driver of
/// that CUDA release as NVIDIA's release notes list it.
fn driver_version_string(cuda: u32) -> &'static str {
    match cuda {
        ..=12000 => "525.60.13",
        12001..=12010 => "530.30.02",
        12011..=12020 => "535.54.03",
        12021..=12030 => "545.23.06",
        12031..=12040 => "550.54.14",
        12041..=12050 => "555.42.02",
        12051..=12060 => "560.28.03",
        12061..=12080 => "570.26",
        12081..=12090 => "575.51.03",
        _ => "580.65.06",
    }
}

fn init_common() -> NvmlReturn {
    if state().is_none() {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> NvmlReturn {
    guard(init_common)
}
#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(init_common)
}
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    guard(init_common)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(|| {
        let r = INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        if r.is_ok() {
            NVML_SUCCESS
        } else {
            NVML_ERROR_UNINITIALIZED
        }
    })
}

static ERROR_STRINGS: &[(NvmlReturn, &str)] = &[
    (0, "Success\0"),
    (1, "Uninitialized\0"),
    (2, "Invalid Argument\0"),
    (3, "Not Supported\0"),
    (4, "Insufficient Permissions\0"),
    (5, "Already Initialized\0"),
    (6, "Not Found\0"),
    (7, "Insufficient Size\0"),
    (8, "Insufficient External Power\0"),
    (9, "Driver Not Loaded\0"),
    (10, "Timeout\0"),
    (11, "Interrupt Request Issue\0"),
    (12, "NVML Shared Library Not Found\0"),
    (13, "Function Not Found\0"),
    (14, "Corrupted infoROM\0"),
    (15, "GPU is lost\0"),
    (16, "GPU requires restart\0"),
    (17, "The operating system has blocked the request.\0"),
    (18, "RM has detected an NVML/RM version mismatch.\0"),
    (19, "In use by another client\0"),
    (20, "Insufficient Memory\0"),
    (21, "No data\0"),
    (22, "The requested vgpu operation is not available on target device, becasue ECC is enabled\0"),
    (23, "Insufficient resources\0"),
    (24, "Frequency not supported\0"),
    (25, "Argument version mismatch\0"),
    (26, "Deprecated\0"),
    (27, "Not Ready\0"),
    (28, "GPU not found\0"),
    (29, "Invalid state\0"),
    (999, "Unknown Error\0"),
];

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s = ERROR_STRINGS.iter().find(|e| e.0 == result).map(|e| e.1).unwrap_or("Unknown Error\0");
    s.as_ptr() as *const c_char
}

// ---- system ----

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        put_str(version, length, driver_version_string(s.driver_version()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        let v = format!("{}.{}", s.driver_version() / 1000, driver_version_string(s.driver_version()));
        put_str(version, length, &v)
    })
}

fn cuda_version(v: *mut c_int) -> NvmlReturn {
    let s = tri!(ready());
    if v.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(v, s.driver_version() as c_int);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> NvmlReturn {
    guard(|| cuda_version(v))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> NvmlReturn {
    guard(|| cuda_version(v))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        let n = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
            .or_else(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string()));
        match n {
            Some(n) => {
                let cut: String = n.chars().take((length as usize).saturating_sub(1)).collect();
                put_str(name, length, &cut)
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetHicVersion(count: *mut c_uint, _entries: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        put(count, 0);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlUnitGetCount(count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, 0);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(count, 0);
        NVML_SUCCESS
    })
}

/// nvidia-smi requires this private entry point to succeed. A table that holds only its
/// own size makes it fall back to the public API.
#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(table: *mut *const c_void, _id: *const c_void) -> NvmlReturn {
    static TABLE: [u64; 1] = [8];
    guard(|| {
        if table.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(table, TABLE.as_ptr() as *const c_void);
        NVML_SUCCESS
    })
}

// ---- device enumeration ----

fn count(c: *mut c_uint) -> NvmlReturn {
    let s = tri!(ready());
    if c.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(c, s.device_count() as c_uint);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(c: *mut c_uint) -> NvmlReturn {
    guard(|| count(c))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(c: *mut c_uint) -> NvmlReturn {
    guard(|| count(c))
}

fn by_index(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    let s = tri!(ready());
    if h.is_null() || i as usize >= s.device_count() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(h, handle_of(i as usize));
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, h))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_index(i, h))
}

fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string (NVML API contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| {
        let s = tri!(ready());
        let (Some(u), false) = (c_string(uuid), h.is_null()) else { return NVML_ERROR_INVALID_ARGUMENT };
        match (0..s.device_count()).find(|&i| s.device_uuid_string(i).eq_ignore_ascii_case(u.trim())) {
            Some(i) => {
                put(h, handle_of(i));
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (dom, bus, rest) = match parts.len() {
        3 => (u32::from_str_radix(parts[0], 16).ok()?, u32::from_str_radix(parts[1], 16).ok()?, parts[2]),
        2 => (0, u32::from_str_radix(parts[0], 16).ok()?, parts[1]),
        _ => return None,
    };
    let d = u32::from_str_radix(rest.split('.').next()?, 16).ok()?;
    Some((dom, bus, d))
}

fn by_pci(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    let s = tri!(ready());
    let (Some(b), false) = (c_string(bus_id), h.is_null()) else { return NVML_ERROR_INVALID_ARGUMENT };
    let Some(want) = parse_bus_id(&b) else { return NVML_ERROR_INVALID_ARGUMENT };
    for i in 0..s.device_count() {
        let p = s.device_pci(i);
        if (p.domain, p.bus, p.device) == want {
            put(h, handle_of(i));
            return NVML_SUCCESS;
        }
    }
    NVML_ERROR_NOT_FOUND
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_pci(bus_id, h))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, h: *mut NvmlDevice) -> NvmlReturn {
    guard(|| by_pci(bus_id, h))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(h: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let (_, i) = tri!(dev(h));
        if index.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(index, i as c_uint);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(h: NvmlDevice, name: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        put_str(name, length, &s.device_name(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(h: NvmlDevice, uuid: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        put_str(uuid, length, &s.device_uuid_string(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(h: NvmlDevice, serial: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        put_str(serial, length, &s.device_serial(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(h: NvmlDevice, pn: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(pn, length, "699-2G530-0200-000")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(h: NvmlDevice, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "96.00.99.00.01")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(h: NvmlDevice, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "G530.0200.00.05")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(h: NvmlDevice, _object: c_uint, v: *mut c_char, length: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put_str(v, length, "1.0")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareVersion(h: NvmlDevice, v: *mut c_char) -> NvmlReturn {
    guard(|| {
        let (s, _) = tri!(dev(h));
        // NVML_GSP_FIRMWARE_VERSION_BUF_SIZE is 0x40.
        put_str(v, 0x40, driver_version_string(s.driver_version()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareMode(h: NvmlDevice, enabled: *mut c_uint, default_mode: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        put(enabled, 1);
        put(default_mode, 1);
        NVML_SUCCESS
    })
}

/// Writes a fixed u32 answer for a device query.
fn device_u32(h: NvmlDevice, out: *mut c_uint, v: impl FnOnce(&SimState, usize) -> c_uint) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(out, v(&s, i));
    NVML_SUCCESS
}

macro_rules! u32_query {
    ($($name:ident => $v:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: NvmlDevice, out: *mut c_uint) -> NvmlReturn {
            guard(|| device_u32(h, out, $v))
        }
    )*};
}

u32_query! {
    nvmlDeviceGetMinorNumber => |s, i| s.device_minor(i);
    nvmlDeviceGetBrand => |_, _| 2;                 // NVML_BRAND_TESLA
    nvmlDeviceGetArchitecture => |_, _| 9;          // NVML_DEVICE_ARCH_HOPPER
    nvmlDeviceGetMultiGpuBoard => |_, _| 0;
    nvmlDeviceGetBoardId => |s, i| s.device_pci(i).bus << 8;
    nvmlDeviceGetModuleId => |_, i| i as c_uint + 1;
    nvmlDeviceGetCurrPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetMaxPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetGpuMaxPcieLinkGeneration => |_, _| 5;
    nvmlDeviceGetCurrPcieLinkWidth => |_, _| 16;
    nvmlDeviceGetMaxPcieLinkWidth => |_, _| 16;
    nvmlDeviceGetPcieReplayCounter => |_, _| 0;
    nvmlDeviceGetPersistenceMode => |_, _| 1;       // NVML_FEATURE_ENABLED
    nvmlDeviceGetComputeMode => |_, _| 0;           // NVML_COMPUTEMODE_DEFAULT
    nvmlDeviceGetPerformanceState => |_, _| 0;      // NVML_PSTATE_0
    nvmlDeviceGetPowerState => |_, _| 0;
    nvmlDeviceGetPowerUsage => |_, _| 72_000;       // mW
    nvmlDeviceGetPowerManagementLimit => |_, _| 700_000;
    nvmlDeviceGetPowerManagementDefaultLimit => |_, _| 700_000;
    nvmlDeviceGetEnforcedPowerLimit => |_, _| 700_000;
    nvmlDeviceGetPowerManagementMode => |_, _| 1;
    nvmlDeviceGetDisplayMode => |_, _| 0;
    nvmlDeviceGetDisplayActive => |_, _| 0;
    nvmlDeviceGetVirtualizationMode => |_, _| 0;    // NVML_GPU_VIRTUALIZATION_MODE_NONE
    nvmlDeviceGetAccountingMode => |_, _| 1;        // NVML_FEATURE_ENABLED
    nvmlDeviceGetAccountingBufferSize => |_, _| 4000;
    nvmlDeviceGetRetiredPagesPendingStatus => |_, _| 0;
    nvmlDeviceIsMigDeviceHandle => |_, _| 0;
    nvmlDeviceGetMaxMigDeviceCount => |_, _| 0;
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(h: NvmlDevice, major: *mut c_int, minor: *mut c_int) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if major.is_null() || minor.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(major, 9);
        put(minor, 0);
        NVML_SUCCESS
    })
}

// ---- memory ----

/// Returns (total, reserved, used by processes) of device `i`, dead processes reclaimed.
fn memory(s: &SimState, i: usize) -> (u64, u64, u64) {
    s.reclaim_dead();
    (s.device_total(i), s.driver_reserved(), s.device_used(i))
}

#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

const _: () = assert!(std::mem::size_of::<NvmlMemoryV2>() == 0x28);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(h: NvmlDevice, m: *mut NvmlMemory) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (total, reserved, used) = memory(&s, i);
        // Version 1 counts the driver's reservation as used.
        let used = used.saturating_add(reserved).min(total);
        put(m, NvmlMemory { total, free: total - used, used });
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(h: NvmlDevice, m: *mut NvmlMemoryV2) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: m is non-NULL and points to an nvmlMemory_v2_t (NVML API contract).
        let version = unsafe { std::ptr::addr_of!((*m).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (total, reserved, used) = memory(&s, i);
        let free = total.saturating_sub(reserved).saturating_sub(used);
        put(m, NvmlMemoryV2 { version, total, reserved, free, used });
        NVML_SUCCESS
    })
}

#[repr(C)]
pub struct NvmlBar1Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(h: NvmlDevice, m: *mut NvmlBar1Memory) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if m.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // BAR1 as large as the framebuffer (large-BAR server part); 2 MiB used by the driver.
        let total = s.device_total(i).next_power_of_two();
        put(m, NvmlBar1Memory { total, free: total - (2 << 20), used: 2 << 20 });
        NVML_SUCCESS
    })
}

// ---- processes ----

/// Which process list.
#[derive(Clone, Copy, PartialEq)]
enum ListKind {
    Compute,
    Graphics,
    Mps,
}

/// The entries of one process list of device `i` as NVML gives them to the calling
/// process: (PID, used bytes), by the mode of `FGPU_SIM_NVML_PIDS` (see
/// [`SimState::nvml_list_pid`]). Compute lists every process with a context or memory on
/// the device; graphics and MPS those that registered as such (`FGPU_SIM_PROCESS_KINDS`).
fn device_processes(s: &SimState, i: usize, kind: ListKind) -> Vec<(u32, u64)> {
    s.reclaim_dead();
    let all = s.processes();
    all.iter()
        .filter(|p| p.per_device_contexts.get(i).copied().unwrap_or(0) > 0 || p.per_device_used.get(i).copied().unwrap_or(0) > 0)
        .filter(|p| match kind {
            ListKind::Compute => true,
            ListKind::Graphics => p.kinds & fgpu_sim_state::KIND_GRAPHICS != 0,
            ListKind::Mps => p.kinds & fgpu_sim_state::KIND_MPS != 0,
        })
        .filter_map(|p| {
            let pid = s.nvml_list_pid(p)?;
            Some((pid, s.nvml_list_memory(p, pid, i, &all)))
        })
        .collect()
}

#[repr(C)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

#[repr(C)]
pub struct ProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessInfoV1>() == 16);
const _: () = assert!(std::mem::size_of::<ProcessInfoV2>() == 24);

/// The NVML list convention: a count too small gets NVML_ERROR_INSUFFICIENT_SIZE and
/// the needed count; otherwise the entries and their number.
fn fill<T>(procs: &[(u32, u64)], count: *mut c_uint, infos: *mut T, make: impl Fn(u32, u64) -> T) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: count is non-NULL and points to an unsigned int (NVML API contract).
    let cap = unsafe { count.read_unaligned() } as usize;
    let n = procs.len();
    put(count, n as c_uint);
    if n == 0 {
        return NVML_SUCCESS;
    }
    if cap < n || infos.is_null() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (k, &(pid, used)) in procs.iter().enumerate() {
        // SAFETY: the caller's array holds `cap` >= n entries.
        put(unsafe { infos.add(k) }, make(pid, used));
    }
    NVML_SUCCESS
}

fn list_v1(h: NvmlDevice, kind: ListKind, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    fill(&device_processes(&s, i, kind), count, infos, |pid, used| ProcessInfoV1 { pid, used_gpu_memory: used })
}

fn list_v2(h: NvmlDevice, kind: ListKind, count: *mut c_uint, infos: *mut ProcessInfoV2) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    fill(&device_processes(&s, i, kind), count, infos, |pid, used| ProcessInfoV2 {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| list_v1(h, ListKind::Compute, c, p))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        list_v2(h, ListKind::Compute, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        list_v2(h, ListKind::Compute, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| list_v1(h, ListKind::Graphics, c, p))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(12u32);
        list_v2(h, ListKind::Graphics, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(13u32);
        list_v2(h, ListKind::Graphics, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV1) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(21u32);
        list_v1(h, ListKind::Mps, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(22u32);
        list_v2(h, ListKind::Mps, c, p)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(h: NvmlDevice, c: *mut c_uint, p: *mut ProcessInfoV2) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(23u32);
        list_v2(h, ListKind::Mps, c, p)
    })
}

// ---- utilisation samples, from the device timeline of fgpu-sim-state ----

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
pub struct ProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `nvmlProcessUtilizationInfo_v1_t` (r550).
#[repr(C)]
pub struct ProcessUtilizationInfoV1 {
    pub time_stamp: c_ulonglong,
    pub pid: c_uint,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
    pub jpg_util: c_uint,
    pub ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1_t` (r550).
#[repr(C)]
pub struct ProcessesUtilizationInfo {
    pub version: c_uint,
    pub process_samples_count: c_uint,
    pub last_seen_time_stamp: c_ulonglong,
    pub proc_util_array: *mut ProcessUtilizationInfoV1,
}

/// `nvmlProcessesUtilizationInfo_v1` = sizeof | 1 << 24.
const NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint = std::mem::size_of::<ProcessesUtilizationInfo>() as c_uint | (1 << 24);
const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// First CUDA version whose driver (r550) has `nvmlDeviceGetProcessesUtilizationInfo`.
const PROCESSES_UTILIZATION_INFO_SINCE: u32 = 12040;

const _: () = {
    assert!(std::mem::size_of::<ProcessUtilizationSample>() == 32);
    assert!(std::mem::size_of::<ProcessUtilizationInfoV1>() == 40);
    assert!(std::mem::size_of::<ProcessesUtilizationInfo>() == 24);
    assert!(NVML_PROCESSES_UTILIZATION_INFO_V1 == 0x0100_0018);
};

/// One sample per process and completed sample period after `last_seen` (CPU
/// microseconds): (timestamp, pid, SM percent), oldest first.
fn process_samples(s: &SimState, i: usize, last_seen: u64) -> Vec<(u64, u32, u32)> {
    let mut out = Vec::new();
    for p in s.utilisation_periods(i, last_seen) {
        // A PID the simulator cannot give (a host PID it has not learnt) is left out.
        for (pid, ns) in p.processes.iter().filter(|(pid, _)| *pid != 0) {
            out.push((p.timestamp_us, *pid, p.percent(*ns)));
        }
    }
    out
}

/// NVML's sample-list rules: none is `NVML_ERROR_NOT_FOUND`; a NULL array or a count
/// smaller than the samples is `NVML_ERROR_INSUFFICIENT_SIZE` with the count needed.
fn give_samples<T>(samples: &[(u64, u32, u32)], count: *mut c_uint, out: *mut T, make: impl Fn(u64, u32, u32) -> T) -> NvmlReturn {
    // SAFETY: count is non-NULL (checked by the callers) and points to an unsigned int.
    let cap = unsafe { count.read_unaligned() } as usize;
    put(count, samples.len() as c_uint);
    if samples.is_empty() {
        return NVML_ERROR_NOT_FOUND;
    }
    if out.is_null() || cap < samples.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (k, &(ts, pid, sm)) in samples.iter().enumerate() {
        // SAFETY: the caller's array holds `cap` >= samples.len() entries.
        put(unsafe { out.add(k) }, make(ts, pid, sm));
    }
    NVML_SUCCESS
}

/// `nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t*,
/// unsigned *processSamplesCount, unsigned long long lastSeenTimeStamp)`: one sample per
/// process that ran kernels, for each completed 1/6 s period newer than
/// `lastSeenTimeStamp`, with PIDs by `FGPU_SIM_NVML_PIDS` (the caller's PID for a process it
/// can see and the raw host PID otherwise, in the caller modes; host PIDs in the others)
/// and CPU timestamps in microseconds.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    h: NvmlDevice,
    samples: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        give_samples(&process_samples(&s, i, last_seen), count, samples, |time_stamp, pid, sm_util| ProcessUtilizationSample {
            pid,
            time_stamp,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        })
    })
}

/// `nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t, nvmlProcessesUtilizationInfo_t*)`
/// (r550): the same samples in the v1 layout. Drivers before r550 do not have it.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(h: NvmlDevice, info: *mut ProcessesUtilizationInfo) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if s.driver_version() < PROCESSES_UTILIZATION_INFO_SINCE {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL, the caller's nvmlProcessesUtilizationInfo_t.
        let (version, last_seen, out) = unsafe { ((*info).version, (*info).last_seen_time_stamp, (*info).proc_util_array) };
        if version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        // SAFETY: the count field of the caller's struct.
        let count = unsafe { std::ptr::addr_of_mut!((*info).process_samples_count) };
        give_samples(&process_samples(&s, i, last_seen), count, out, |time_stamp, pid, sm_util| ProcessUtilizationInfoV1 {
            time_stamp,
            pid,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
            jpg_util: 0,
            ofa_util: 0,
        })
    })
}

include!("rest.rs");
