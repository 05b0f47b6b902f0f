//! Finding the real driver functions without going through our own `dlsym`.
//!
//! Every symbol fgpu wraps or calls has one entry in [`Sym`]. Its real address comes from,
//! in order: what the program itself got back from `dlsym`/`cuGetProcAddress` (remembered
//! by those hooks, so a driver loaded from an unusual path is still the one called), or our
//! own `dlopen` of `libcuda.so.1` / `libnvidia-ml.so.1` looked up with the real `dlsym`.
//! The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`, which our
//! `dlsym` hook never sees.

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The libc `dlsym`, set on first use by [`init_real_dlsym`].
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

macro_rules! symbols {
    (
        hooked { $( $hlib:ident $hname:ident => $wrapper:path ; )* }
        called { $( $clib:ident $cname:ident ; )* }
    ) => {
        /// Every driver symbol fgpu wraps (`hooked`) or only calls (`called`).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Sym { $( $hname, )* $( $cname, )* }

        pub const ALL: &[Sym] = &[ $( Sym::$hname, )* $( Sym::$cname, )* ];

        impl Sym {
            /// NUL-terminated symbol name.
            pub fn c_name(self) -> &'static str {
                match self {
                    $( Sym::$hname => concat!(stringify!($hname), "\0"), )*
                    $( Sym::$cname => concat!(stringify!($cname), "\0"), )*
                }
            }

            pub fn name(self) -> &'static str {
                let c = self.c_name();
                &c[..c.len() - 1]
            }

            pub fn lib(self) -> Lib {
                match self {
                    $( Sym::$hname => Lib::$hlib, )*
                    $( Sym::$cname => Lib::$clib, )*
                }
            }

            /// Our exported replacement, for symbols we wrap.
            pub fn wrapper(self) -> Option<*mut c_void> {
                match self {
                    $( Sym::$hname => Some($wrapper as *mut c_void), )*
                    _ => None,
                }
            }

            /// The wrapped symbol with this exact name.
            pub fn hooked_by_name(name: &[u8]) -> Option<Sym> {
                $( if name == stringify!($hname).as_bytes() { return Some(Sym::$hname); } )*
                None
            }
        }
    };
}

use crate::hooks::{alloc, array, context, dlsym as dl, graph, info, launch, module, nvml, pool, procaddr, vmm};

symbols! {
    hooked {
        Cuda cuGetProcAddress => procaddr::cuGetProcAddress;
        Cuda cuGetProcAddress_v2 => procaddr::cuGetProcAddress_v2;
        Cuda cuMemAlloc => alloc::cuMemAlloc;
        Cuda cuMemAlloc_v2 => alloc::cuMemAlloc_v2;
        Cuda cuMemAllocPitch => alloc::cuMemAllocPitch;
        Cuda cuMemAllocPitch_v2 => alloc::cuMemAllocPitch_v2;
        Cuda cuMemAllocManaged => alloc::cuMemAllocManaged;
        Cuda cuMemFree => alloc::cuMemFree;
        Cuda cuMemFree_v2 => alloc::cuMemFree_v2;
        Cuda cuMemGetInfo => info::cuMemGetInfo;
        Cuda cuMemGetInfo_v2 => info::cuMemGetInfo_v2;
        Cuda cuDeviceTotalMem => info::cuDeviceTotalMem;
        Cuda cuDeviceTotalMem_v2 => info::cuDeviceTotalMem_v2;
        Cuda cuCtxCreate => context::cuCtxCreate;
        Cuda cuCtxCreate_v2 => context::cuCtxCreate_v2;
        Cuda cuCtxCreate_v3 => context::cuCtxCreate_v3;
        Cuda cuCtxCreate_v4 => context::cuCtxCreate_v4;
        Cuda cuCtxDestroy => context::cuCtxDestroy;
        Cuda cuCtxDestroy_v2 => context::cuCtxDestroy_v2;
        Cuda cuDevicePrimaryCtxRetain => context::cuDevicePrimaryCtxRetain;
        Cuda cuDevicePrimaryCtxRelease => context::cuDevicePrimaryCtxRelease;
        Cuda cuDevicePrimaryCtxRelease_v2 => context::cuDevicePrimaryCtxRelease_v2;
        Cuda cuDevicePrimaryCtxReset => context::cuDevicePrimaryCtxReset;
        Cuda cuDevicePrimaryCtxReset_v2 => context::cuDevicePrimaryCtxReset_v2;
        Cuda cuMemAllocAsync => pool::cuMemAllocAsync;
        Cuda cuMemAllocAsync_ptsz => pool::cuMemAllocAsync_ptsz;
        Cuda cuMemAllocFromPoolAsync => pool::cuMemAllocFromPoolAsync;
        Cuda cuMemAllocFromPoolAsync_ptsz => pool::cuMemAllocFromPoolAsync_ptsz;
        Cuda cuMemFreeAsync => pool::cuMemFreeAsync;
        Cuda cuMemFreeAsync_ptsz => pool::cuMemFreeAsync_ptsz;
        Cuda cuMemPoolTrimTo => pool::cuMemPoolTrimTo;
        Cuda cuMemPoolDestroy => pool::cuMemPoolDestroy;
        Cuda cuStreamSynchronize => pool::cuStreamSynchronize;
        Cuda cuStreamSynchronize_ptsz => pool::cuStreamSynchronize_ptsz;
        Cuda cuEventSynchronize => pool::cuEventSynchronize;
        Cuda cuCtxSynchronize => pool::cuCtxSynchronize;
        Cuda cuMemCreate => vmm::cuMemCreate;
        Cuda cuMemRelease => vmm::cuMemRelease;
        Cuda cuMemMap => vmm::cuMemMap;
        Cuda cuMemUnmap => vmm::cuMemUnmap;
        Cuda cuArrayCreate => array::cuArrayCreate;
        Cuda cuArrayCreate_v2 => array::cuArrayCreate_v2;
        Cuda cuArray3DCreate => array::cuArray3DCreate;
        Cuda cuArray3DCreate_v2 => array::cuArray3DCreate_v2;
        Cuda cuMipmappedArrayCreate => array::cuMipmappedArrayCreate;
        Cuda cuArrayDestroy => array::cuArrayDestroy;
        Cuda cuMipmappedArrayDestroy => array::cuMipmappedArrayDestroy;
        Cuda cuGraphInstantiate => graph::cuGraphInstantiate;
        Cuda cuGraphInstantiate_v2 => graph::cuGraphInstantiate_v2;
        Cuda cuGraphInstantiateWithFlags => graph::cuGraphInstantiateWithFlags;
        Cuda cuGraphInstantiateWithParams => graph::cuGraphInstantiateWithParams;
        Cuda cuGraphInstantiateWithParams_ptsz => graph::cuGraphInstantiateWithParams_ptsz;
        Cuda cuGraphLaunch => graph::cuGraphLaunch;
        Cuda cuGraphLaunch_ptsz => graph::cuGraphLaunch_ptsz;
        Cuda cuGraphUpload => graph::cuGraphUpload;
        Cuda cuGraphUpload_ptsz => graph::cuGraphUpload_ptsz;
        Cuda cuDeviceGraphMemTrim => graph::cuDeviceGraphMemTrim;
        Cuda cuGraphExecDestroy => graph::cuGraphExecDestroy;
        Cuda cuModuleLoad => module::cuModuleLoad;
        Cuda cuModuleLoadData => module::cuModuleLoadData;
        Cuda cuModuleLoadDataEx => module::cuModuleLoadDataEx;
        Cuda cuModuleLoadFatBinary => module::cuModuleLoadFatBinary;
        Cuda cuLibraryLoadData => module::cuLibraryLoadData;
        Cuda cuLibraryLoadFromFile => module::cuLibraryLoadFromFile;
        Cuda cuLaunchKernel => launch::cuLaunchKernel;
        Cuda cuLaunchKernel_ptsz => launch::cuLaunchKernel_ptsz;
        Cuda cuLaunchKernelEx => launch::cuLaunchKernelEx;
        Cuda cuLaunchKernelEx_ptsz => launch::cuLaunchKernelEx_ptsz;
        Cuda cuLaunchCooperativeKernel => launch::cuLaunchCooperativeKernel;
        Cuda cuLaunchCooperativeKernel_ptsz => launch::cuLaunchCooperativeKernel_ptsz;
        Nvml nvmlDeviceGetMemoryInfo => nvml::nvmlDeviceGetMemoryInfo;
        Nvml nvmlDeviceGetMemoryInfo_v2 => nvml::nvmlDeviceGetMemoryInfo_v2;
        Nvml nvmlDeviceGetComputeRunningProcesses => nvml::nvmlDeviceGetComputeRunningProcesses;
        Nvml nvmlDeviceGetComputeRunningProcesses_v2 => nvml::nvmlDeviceGetComputeRunningProcesses_v2;
        Nvml nvmlDeviceGetComputeRunningProcesses_v3 => nvml::nvmlDeviceGetComputeRunningProcesses_v3;
        Nvml nvmlDeviceGetGraphicsRunningProcesses => nvml::nvmlDeviceGetGraphicsRunningProcesses;
        Nvml nvmlDeviceGetGraphicsRunningProcesses_v2 => nvml::nvmlDeviceGetGraphicsRunningProcesses_v2;
        Nvml nvmlDeviceGetGraphicsRunningProcesses_v3 => nvml::nvmlDeviceGetGraphicsRunningProcesses_v3;
        Nvml nvmlDeviceGetMPSComputeRunningProcesses => nvml::nvmlDeviceGetMPSComputeRunningProcesses;
        Nvml nvmlDeviceGetMPSComputeRunningProcesses_v2 => nvml::nvmlDeviceGetMPSComputeRunningProcesses_v2;
        Nvml nvmlDeviceGetMPSComputeRunningProcesses_v3 => nvml::nvmlDeviceGetMPSComputeRunningProcesses_v3;
        Nvml nvmlDeviceGetProcessUtilization => nvml::nvmlDeviceGetProcessUtilization;
        Nvml nvmlDeviceGetAccountingPids => nvml::nvmlDeviceGetAccountingPids;
        Nvml nvmlDeviceGetAccountingStats => nvml::nvmlDeviceGetAccountingStats;
        Nvml nvmlDeviceGetAccountingStats_v2 => nvml::nvmlDeviceGetAccountingStats_v2;
        Nvml nvmlDeviceGetRunningProcessDetailList => nvml::nvmlDeviceGetRunningProcessDetailList;
        Nvml nvmlDeviceGetProcessesUtilizationInfo => nvml::nvmlDeviceGetProcessesUtilizationInfo;
        Nvml nvmlDeviceGetEncoderSessions => nvml::nvmlDeviceGetEncoderSessions;
        Nvml nvmlDeviceGetFBCSessions => nvml::nvmlDeviceGetFBCSessions;
    }
    called {
        Cuda cuCtxGetDevice;
        Cuda cuDeviceGetUuid;
        Cuda cuDeviceGetUuid_v2;
        Cuda cuDevicePrimaryCtxGetState;
        Cuda cuDeviceGetMemPool;
        Cuda cuMemPoolGetAttribute;
        Cuda cuArrayGetMemoryRequirements;
        Cuda cuMipmappedArrayGetMemoryRequirements;
        Cuda cuDeviceGetGraphMemAttribute;
        Cuda cuGraphGetNodes;
        Cuda cuGraphNodeGetType;
        Cuda cuGraphMemAllocNodeGetParams;
        Cuda cuCtxGetCurrent;
        Cuda cuEventCreate;
        Cuda cuEventRecord;
        Cuda cuEventRecord_ptsz;
        Cuda cuEventQuery;
        Cuda cuEventElapsedTime;
        Cuda cuEventElapsedTime_v2;
        Cuda cuEventDestroy;
        Cuda cuEventDestroy_v2;
        Cuda cuStreamIsCapturing;
        Cuda cuStreamIsCapturing_ptsz;
        Cuda cuThreadExchangeStreamCaptureMode;
        Nvml nvmlInit_v2;
        Nvml nvmlDeviceGetCount_v2;
        Nvml nvmlDeviceGetHandleByIndex_v2;
        Nvml nvmlDeviceGetMigMode;
        Nvml nvmlDeviceGetMaxMigDeviceCount;
        Nvml nvmlDeviceGetMigDeviceHandleByIndex;
        Nvml nvmlDeviceGetHandleByUUID;
        Nvml nvmlDeviceGetUUID;
        Nvml nvmlSystemGetDriverVersion;
    }
}

// Keeps the `dl` import used: the dlsym hook is exported from its module, not the table.
#[allow(unused_imports)]
use dl as _;

static REAL: [AtomicPtr<c_void>; ALL.len()] = [const { AtomicPtr::new(null_mut()) }; ALL.len()];

/// `Sym` discriminants follow declaration order, which is also the order of `ALL`.
fn index(sym: Sym) -> usize {
    sym as usize
}

const _: () = {
    let mut i = 0;
    while i < ALL.len() {
        assert!(ALL[i] as usize == i);
        i += 1;
    }
};

/// Resolves the real `dlsym`. Called once by the `dlsym` entry point (and by anyone else
/// needing it first). Returns null only if glibc has no `dlsym` at any known version.
#[no_mangle]
pub extern "C" fn fgpu_init_real_dlsym() -> *mut c_void {
    let current = REAL_DLSYM.load(Ordering::Acquire);
    if !current.is_null() {
        return current;
    }
    let found = fgpu_core::sys::glibc_dlsym_address(fgpu_core::sys::DlsymFrom::NextObject);
    if !found.is_null() {
        REAL_DLSYM.store(found, Ordering::Release);
    }
    found
}

/// Calls the real `dlsym`.
///
/// # Safety
/// `dlsym(3)`'s contract: `handle` from `dlopen` (or a pseudo-handle), `name` NUL-terminated.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = fgpu_init_real_dlsym();
    if f.is_null() {
        return null_mut();
    }
    // SAFETY: `f` is glibc's dlsym (resolved above), whose C signature DlsymFn matches; the
    // caller upholds dlsym's contract for the arguments.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f)(handle, name) }
}

struct Handle(*mut c_void);
// SAFETY: a dlopen handle is an opaque token usable from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above; it is never dereferenced by us.
unsafe impl Sync for Handle {}

fn library(lib: Lib) -> *mut c_void {
    static CUDA: OnceLock<Handle> = OnceLock::new();
    static NVML: OnceLock<Handle> = OnceLock::new();
    let (cell, name) = match lib {
        Lib::Cuda => (&CUDA, c"libcuda.so.1"),
        Lib::Nvml => (&NVML, c"libnvidia-ml.so.1"),
    };
    cell.get_or_init(|| {
        // SAFETY: models dlopen(3) with a NUL-terminated soname; null on failure.
        Handle(unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) })
    })
    .0
}

/// Whether the driver library can be loaded at all in this process.
pub fn library_present(lib: Lib) -> bool {
    !library(lib).is_null()
}

/// The real address of `sym`, or null if the driver does not have it.
pub fn get(sym: Sym) -> *mut c_void {
    let cell = &REAL[index(sym)];
    let known = cell.load(Ordering::Acquire);
    if !known.is_null() {
        return known;
    }
    let handle = library(sym.lib());
    if handle.is_null() {
        return null_mut();
    }
    // SAFETY: a live dlopen handle and a NUL-terminated name from the symbol table.
    let found = unsafe { real_dlsym(handle, sym.c_name().as_ptr().cast()) };
    if !found.is_null() && Some(found) != sym.wrapper() {
        cell.store(found, Ordering::Release);
        return found;
    }
    null_mut()
}

/// Records the address a program got for `sym` from the driver, if we had none yet.
pub fn remember(sym: Sym, address: *mut c_void) {
    if address.is_null() || Some(address) == sym.wrapper() {
        return;
    }
    let _ = REAL[index(sym)].compare_exchange(null_mut(), address, Ordering::AcqRel, Ordering::Acquire);
}

/// Which wrapped symbol's real implementation lives at `address`, if any.
pub fn identify(address: *mut c_void) -> Option<Sym> {
    ALL.iter()
        .copied()
        .filter(|s| s.lib() == Lib::Cuda && s.wrapper().is_some())
        .find(|s| get(*s) == address)
}

macro_rules! prototypes {
    ($( $(#[$doc:meta])* $name:ident: fn($($ty:ty),*) -> $ret:ty; )*) => {
        $( $(#[$doc])* pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*

        /// The symbols declared here.
        #[cfg(test)]
        pub const DECLARED: &[&str] = &[$(stringify!($name)),*];
    };
}

/// C prototypes (`cuda.h`, `nvml.h`) of the driver functions that more than one place
/// calls, each declared once: `call_real!(symbol, args...)` calls through these. A symbol
/// called from one place only may instead be typed at its `call_real!` site; never both,
/// and never twice (checked by this module's tests).
#[allow(non_camel_case_types)]
pub mod proto {
    use crate::abi::cuda::{CUdevice, CUgraph, CUgraphNode, CUresult};
    use crate::abi::nvml::{NvmlDevice, NvmlMemory, NvmlProcessUtilizationSample, NvmlReturn};
    use std::ffi::c_uint;

    prototypes! {
        /// `cuMemGetInfo` before CUDA 3.2: 32-bit outputs.
        cuMemGetInfo: fn(*mut c_uint, *mut c_uint) -> CUresult;
        /// `CUresult cuMemGetInfo(size_t *free, size_t *total)`.
        cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CUresult;
        /// `CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)`.
        cuDeviceTotalMem_v2: fn(*mut usize, CUdevice) -> CUresult;
        /// `CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)`.
        cuGraphGetNodes: fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
        /// `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)`.
        nvmlDeviceGetMemoryInfo: fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
        /// `nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
        /// nvmlProcessUtilizationSample_t *utilization, unsigned int *processSamplesCount,
        /// unsigned long long lastSeenTimeStamp)`.
        nvmlDeviceGetProcessUtilization: fn(NvmlDevice, *mut NvmlProcessUtilizationSample, *mut c_uint, u64) -> NvmlReturn;
    }
}

/// Calls a real driver function: `call_real!(Sym, args...)` through its prototype in
/// [`proto`], or `call_real!(Sym: fn(args) -> ret, args...)` for a symbol typed at its only
/// call site. Evaluates to `None` when the driver lacks the symbol. Call sites pass plain
/// values (forwarded arguments, pointers to locals), so evaluating them inside the unsafe
/// call is harmless.
#[macro_export]
macro_rules! call_real {
    ($sym:ident $(, $arg:expr)* $(,)?) => {{
        let address = $crate::real::get($crate::real::Sym::$sym);
        if address.is_null() {
            None
        } else {
            // SAFETY: `address` is the driver's own implementation of this symbol, whose C
            // prototype (from cuda.h / nvml.h) is the one declared in `real::proto`.
            let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, $crate::real::proto::$sym>(address) };
            // SAFETY: arguments are forwarded as the caller of the hook passed them, or are
            // pointers to live locals of the right C type.
            Some(unsafe { f($($arg),*) })
        }
    }};
    ($sym:ident : fn($($ty:ty),*) -> $ret:ty $(, $arg:expr)* ) => {{
        let address = $crate::real::get($crate::real::Sym::$sym);
        if address.is_null() {
            None
        } else {
            // SAFETY: `address` is the driver's own implementation of this symbol, whose C
            // prototype (from cuda.h / nvml.h) is the signature written at the call site.
            let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(address) };
            // SAFETY: arguments are forwarded as the caller of the hook passed them, or are
            // pointers to live locals of the right C type.
            Some(unsafe { f($($arg),*) })
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::proto::DECLARED;
    use std::collections::BTreeMap;

    /// Every `call_real!(name: fn(...) ...)` site in the shim's sources: (name, file:line).
    fn typed_call_sites() -> Vec<(String, String)> {
        let mut sites = Vec::new();
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("call_real!(") {
                    let rest = text[at + "call_real!(".len()..].trim_start();
                    let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && rest[name.len()..].trim_start().starts_with(':') {
                        let line = text[..at].lines().count();
                        sites.push((name, format!("{}:{line}", path.display())));
                    }
                }
            }
        }
        sites
    }

    #[test]
    fn each_driver_prototype_is_declared_once() {
        let mut typed: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, site) in typed_call_sites() {
            typed.entry(name).or_default().push(site);
        }
        assert!(typed.len() > 20, "found only {} typed call sites: has call_real! changed shape?", typed.len());
        for (name, sites) in &typed {
            assert!(sites.len() == 1, "{name} is typed at {} call sites ({}): declare it once in real::proto", sites.len(), sites.join(", "));
            assert!(!DECLARED.contains(&name.as_str()), "{name} is declared in real::proto and typed again at {}", sites[0]);
        }
    }
}
