//! `fgpu __driver-probe`: loads `libcuda.so.1` and `libnvidia-ml.so.1` and prints, as JSON,
//! what they say about themselves and the GPUs. `fgpu doctor` runs it in a child process.
//!
//! The probe must see the driver as it is, never through the shim: the child is started
//! without `LD_PRELOAD`, but a shim in `/etc/ld.so.preload` is loaded into every process
//! whatever the environment says. So the probe never looks a driver function up through
//! the `dlsym` or `dlvsym` that a preloaded library may define (fgpu's return its own
//! wrappers, and its own `dlsym` for any lookup of either): it takes glibc's own `dlsym`
//! from libc's symbol table (`fgpu_core::sys::glibc_dlsym`), and resolves every driver
//! function with that. No call of the probe then reaches the shim, which so never reads a
//! cap, rewrites an answer or opens a ledger.

use std::ffi::{c_char, c_void, CStr};

pub use fgpu_cdi::probe::{DriverProbe, LibraryProbe, ProbedDevice};

use fgpu_core::sys::DlsymFn;

/// glibc's own `dlsym`, whatever a preloaded library defines under that name (read from
/// libc's symbol table: `fgpu_core::sys::glibc_dlsym`).
fn glibc_dlsym() -> Option<DlsymFn> {
    fgpu_core::sys::glibc_dlsym()
}

/// A driver library opened by the probe (or by `driver_lists`); never closed.
pub(crate) struct Library {
    handle: *mut c_void,
    dlsym: DlsymFn,
}

impl Library {
    /// `dlopen`s `name`, or returns the loader's message.
    pub(crate) fn open(name: &CStr) -> Result<Library, String> {
        let dlsym = glibc_dlsym().ok_or_else(|| "glibc's dlsym cannot be found in this process".to_string())?;
        // SAFETY: models dlopen(3) with a NUL-terminated soname. Loading the driver runs its
        // initialisers, which is what any CUDA program does.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: models dlerror(3): null, or this thread's last loader message.
            let message = unsafe { libc::dlerror() };
            if message.is_null() {
                return Err("unknown error".into());
            }
            // SAFETY: a NUL-terminated string owned by libc, read before any other dl call.
            return Err(unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned());
        }
        Ok(Library { handle, dlsym })
    }

    /// The driver's own `name`, as a function of type `F`.
    ///
    /// # Safety
    /// `F` is an `unsafe extern "C" fn` type matching the C prototype of `name` (cuda.h,
    /// nvml.h).
    pub(crate) unsafe fn get<F: Copy>(&self, name: &CStr) -> Option<F> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>(), "F must be a function pointer");
        // SAFETY: a live handle from dlopen and a NUL-terminated name, given to glibc's dlsym.
        let found = unsafe { (self.dlsym)(self.handle, name.as_ptr()) };
        if found.is_null() {
            return None;
        }
        // SAFETY: `found` is the address of `name`, whose prototype the caller vouches `F` is;
        // the sizes were checked above.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&found) })
    }
}

type CuFnI32 = unsafe extern "C" fn(*mut i32) -> u32;
type CuInit = unsafe extern "C" fn(u32) -> u32;
pub(crate) type NvmlInit = unsafe extern "C" fn() -> u32;
type NvmlString = unsafe extern "C" fn(*mut c_char, u32) -> u32;
pub(crate) type NvmlCount = unsafe extern "C" fn(*mut u32) -> u32;
pub(crate) type NvmlHandle = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
type NvmlDevString = unsafe extern "C" fn(*mut c_void, *mut c_char, u32) -> u32;
/// `nvmlMemory_t` (nvml.h): `{ total, free, used }`, all `unsigned long long`.
#[repr(C)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}
type NvmlMemoryInfo = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> u32;
/// `nvmlProcessInfo_v1_t` (nvml.h): `{ unsigned pid; unsigned long long usedGpuMemory; }`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct NvmlProcessInfoV1 {
    pub(crate) pid: u32,
    used_gpu_memory: u64,
}
pub(crate) type NvmlProcesses = unsafe extern "C" fn(*mut c_void, *mut u32, *mut NvmlProcessInfoV1) -> u32;

fn c_buffer_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Opens a driver library, recording in `probe` whether it loaded (or why not).
fn open_library(name: &std::ffi::CStr, probe: &mut LibraryProbe) -> Option<Library> {
    match Library::open(name) {
        Ok(lib) => {
            probe.loaded = true;
            Some(lib)
        }
        Err(e) => {
            probe.error = Some(e);
            None
        }
    }
}

fn probe_cuda() -> LibraryProbe {
    let mut p = LibraryProbe::default();
    let Some(lib) = open_library(c"libcuda.so.1", &mut p) else { return p };
    // SAFETY: each type is the prototype cuda.h gives the function named; every pointer
    // passed is to a live local.
    unsafe {
        if let Some(get_version) = lib.get::<CuFnI32>(c"cuDriverGetVersion") {
            let mut v = 0;
            if get_version(&mut v) == 0 {
                p.cuda_version = Some(v);
            }
        }
        match lib.get::<CuInit>(c"cuInit") {
            Some(init) => {
                let rc = init(0);
                if rc != 0 {
                    p.error = Some(format!("cuInit failed with CUDA error {rc}{}", if rc == 100 { " (no CUDA-capable device)" } else { "" }));
                } else if let Some(count) = lib.get::<CuFnI32>(c"cuDeviceGetCount") {
                    let mut n = 0;
                    if count(&mut n) == 0 {
                        p.device_count = Some(n.max(0) as u32);
                    }
                }
            }
            None => p.error = Some("it has no cuInit".into()),
        }
    }
    p
}

fn probe_nvml(devices: &mut Vec<ProbedDevice>) -> LibraryProbe {
    let mut p = LibraryProbe::default();
    let Some(lib) = open_library(c"libnvidia-ml.so.1", &mut p) else { return p };
    // SAFETY: each type is the prototype nvml.h gives the function named; buffers are sized
    // as NVML documents and passed with their length; other pointers are to live locals.
    unsafe {
        let Some(init) = lib.get::<NvmlInit>(c"nvmlInit_v2").or_else(|| lib.get::<NvmlInit>(c"nvmlInit")) else {
            p.error = Some("it has no nvmlInit".into());
            return p;
        };
        let rc = init();
        if rc != 0 {
            p.error = Some(format!("nvmlInit failed with NVML error {rc}"));
            return p;
        }
        if let Some(f) = lib.get::<NvmlString>(c"nvmlSystemGetDriverVersion") {
            let mut buf = [0 as c_char; 96];
            if f(buf.as_mut_ptr(), buf.len() as u32) == 0 {
                p.driver_version = Some(c_buffer_to_string(&buf));
            }
        }
        if let Some(f) = lib.get::<CuFnI32>(c"nvmlSystemGetCudaDriverVersion_v2").or_else(|| lib.get::<CuFnI32>(c"nvmlSystemGetCudaDriverVersion")) {
            let mut v = 0;
            if f(&mut v) == 0 {
                p.cuda_version = Some(v);
            }
        }
        let count = lib.get::<NvmlCount>(c"nvmlDeviceGetCount_v2").or_else(|| lib.get::<NvmlCount>(c"nvmlDeviceGetCount"));
        if let Some(count) = count {
            let mut n = 0;
            if count(&mut n) == 0 {
                p.device_count = Some(n);
                let handle = lib.get::<NvmlHandle>(c"nvmlDeviceGetHandleByIndex_v2");
                let uuid = lib.get::<NvmlDevString>(c"nvmlDeviceGetUUID");
                let name = lib.get::<NvmlDevString>(c"nvmlDeviceGetName");
                let memory = lib.get::<NvmlMemoryInfo>(c"nvmlDeviceGetMemoryInfo");
                let processes = lib.get::<NvmlProcesses>(c"nvmlDeviceGetComputeRunningProcesses");
                if let (Some(handle), Some(uuid)) = (handle, uuid) {
                    for index in 0..n.min(64) {
                        let mut dev = std::ptr::null_mut();
                        if handle(index, &mut dev) != 0 {
                            continue;
                        }
                        let mut d = ProbedDevice { index, ..Default::default() };
                        let mut buf = [0 as c_char; 96];
                        if uuid(dev, buf.as_mut_ptr(), buf.len() as u32) == 0 {
                            d.uuid = c_buffer_to_string(&buf);
                        }
                        if let Some(name) = name {
                            let mut buf = [0 as c_char; 96];
                            if name(dev, buf.as_mut_ptr(), buf.len() as u32) == 0 {
                                d.name = c_buffer_to_string(&buf);
                            }
                        }
                        if let Some(memory) = memory {
                            let mut m = NvmlMemory { total: 0, free: 0, used: 0 };
                            if memory(dev, &mut m) == 0 {
                                d.total_bytes = m.total;
                                d.used_bytes = m.used;
                            }
                        }
                        if let Some(processes) = processes {
                            let mut entries = [NvmlProcessInfoV1::default(); 256];
                            let mut n = entries.len() as u32;
                            if processes(dev, &mut n, entries.as_mut_ptr()) == 0 {
                                d.compute_processes = entries[..(n as usize).min(entries.len())].iter().map(|e| (e.pid, e.used_gpu_memory)).collect();
                            }
                        }
                        devices.push(d);
                    }
                }
            }
        }
        if let Some(shutdown) = lib.get::<NvmlInit>(c"nvmlShutdown") {
            shutdown();
        }
    }
    p
}

/// `fgpu __driver-probe`: prints a [`DriverProbe`] as JSON.
pub fn main() -> i32 {
    let mut probe = DriverProbe { cuda: probe_cuda(), ..Default::default() };
    probe.nvml = probe_nvml(&mut probe.devices);
    println!("{}", serde_json::to_string(&probe).expect("probe serialises"));
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_dlsym_is_found_and_resolves() {
        let dlsym = glibc_dlsym().expect("glibc's dlsym");
        // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
        let getpid = unsafe { dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert_eq!(getpid, libc::getpid as *mut c_void);
    }

    #[test]
    fn a_missing_library_gives_the_loaders_message() {
        let err = Library::open(c"libfgpu-no-such-library.so.1").err().unwrap();
        assert!(err.contains("libfgpu-no-such-library.so.1"), "{err}");
    }
}
