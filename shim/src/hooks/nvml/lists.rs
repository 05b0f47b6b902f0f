//! The process lists: compute lists are built from the ledger (only this container's
//! processes, with PIDs as the caller's namespace sees them and the memory the ledger
//! counts, whatever PIDs the driver gives); graphics and MPS lists are the driver's,
//! filtered to the ledger's processes. With a broken configuration they are empty.

use crate::abi::nvml::*;
use crate::accounting::listing::{ledger_processes, Keyed, Listed, NO_INSTANCE};
use crate::accounting::{self, Mode};
use crate::driver::instance::driver;
use crate::driver::raw;
use crate::driver::seam::NvmlDriver;
use std::ffi::c_uint;

#[derive(Clone, Copy, PartialEq)]
enum ListKind {
    Compute,
    Other,
}

/// Writes `listed` into the caller's buffer with NVML's size-query rules.
///
/// # Safety
/// `count` writable; `infos` null or writable for `*count` entries of `T`.
unsafe fn write_list<T>(listed: &[Listed], count: *mut c_uint, infos: *mut T, make: impl Fn(&Listed) -> T) -> NvmlReturn {
    // SAFETY: checked non-null by the caller.
    let capacity = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = listed.len() as c_uint };
    if listed.is_empty() {
        return NVML_SUCCESS;
    }
    if infos.is_null() || capacity < listed.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, entry) in listed.iter().enumerate() {
        // SAFETY: i < listed.len() <= capacity, the caller's buffer size.
        unsafe { infos.add(i).write(make(entry)) };
    }
    NVML_SUCCESS
}

/// Shared body of the nine process-list entry points.
///
/// # Safety
/// NVML process-list contract for the layout `T`.
unsafe fn process_list<T>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    kind: ListKind,
    real: impl Fn(*mut c_uint, *mut T) -> NvmlReturn,
    pid_and_memory: impl Fn(&T) -> (u32, u64),
    make: impl Fn(&Listed) -> T,
) -> NvmlReturn {
    let active = match accounting::mode() {
        Mode::On(active) => active,
        Mode::Off => return real(count, infos),
        // Fail closed: a broken configuration shows no other tenant's processes either.
        Mode::Closed(_) if count.is_null() => return NVML_ERROR_INVALID_ARGUMENT,
        // SAFETY: count checked non-null; infos per the caller's contract.
        Mode::Closed(_) => return unsafe { write_list(&[], count, infos, &make) },
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let (id, snapshot) = active.listing(device);
    let listed = match (kind, id) {
        (ListKind::Compute, Some(id)) => {
            // Ask the driver first so invalid handles still get its error.
            let mut probe: c_uint = 0;
            let rc = real(&mut probe, std::ptr::null_mut());
            if rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE {
                return rc;
            }
            ledger_processes(&snapshot, id)
        }
        (ListKind::Compute, None) => Vec::new(),
        (ListKind::Other, _) => {
            let mut entries: Vec<T> = Vec::with_capacity(256);
            let mut n: c_uint = 256;
            let rc = real(&mut n, entries.as_mut_ptr());
            if rc != NVML_SUCCESS {
                if rc == NVML_ERROR_INSUFFICIENT_SIZE {
                    // More graphics processes than we asked for: list ours only if we can
                    // see them all; an empty answer leaks nothing.
                    Vec::new()
                } else {
                    return rc;
                }
            } else {
                // A driver that answers with more entries than the buffer holds is not
                // believed past the buffer.
                let n = (n as usize).min(entries.capacity());
                // SAFETY: n is at most the capacity (bounded just above), and the driver
                // initialised the first n entries of the buffer it was given.
                unsafe { entries.set_len(n) };
                let map = active.pid_map(device, &snapshot, Keyed::Lists);
                entries
                    .iter()
                    .map(&pid_and_memory)
                    .filter_map(|(pid, used)| map.iter().find(|(host, _)| *host == pid).map(|(_, here)| Listed { pid: *here, used, instance: NO_INSTANCE }))
                    .collect()
            }
        }
    };
    let mut listed = listed;
    if !listed.is_empty() {
        // On a MIG device handle every entry runs in its GPU and compute instance, as the
        // driver's own list says (nvml.h's nvmlProcessInfo_t).
        if let Some(instance) = driver().nvml_instance_ids(device) {
            listed.iter_mut().for_each(|l| l.instance = instance);
        }
    }
    // SAFETY: count checked non-null; infos per the caller's contract.
    unsafe { write_list(&listed, count, infos, make) }
}

fn v1(l: &Listed) -> NvmlProcessInfoV1 {
    NvmlProcessInfoV1 { pid: l.pid, used_gpu_memory: l.used }
}

fn v2(l: &Listed) -> NvmlProcessInfoV2 {
    NvmlProcessInfoV2 { pid: l.pid, used_gpu_memory: l.used, gpu_instance_id: l.instance.0, compute_instance_id: l.instance.1 }
}

/// Drivers 535.43 to 535.86 wrote 32-byte `nvmlProcessInfo_t` entries for the `_v3` calls
/// (with `usedGpuCcProtectedMemory`); every other driver writes 24 bytes. Answer in the
/// layout the driver in this process uses, as its callers (nvitop checks the version) expect.
fn v3_entries_are_wide() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| driver().nvml_driver_version().is_some_and(|v| wide_v3_driver(&v)))
}

fn wide_v3_driver(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    major == 535 && (43..=86).contains(&minor)
}

fn v3_wide(l: &Listed) -> NvmlProcessInfoV3Cc {
    NvmlProcessInfoV3Cc { pid: l.pid, used_gpu_memory: l.used, gpu_instance_id: l.instance.0, compute_instance_id: l.instance.1, used_cc_protected_memory: 0 }
}

macro_rules! process_list_hook {
    ($name:ident, $ty:ty, $kind:expr, $make:expr) => {
        /// # Safety
        /// NVML process-list contract.
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: NvmlDevice, count: *mut c_uint, infos: *mut $ty) -> NvmlReturn {
            // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
            let real = |c, i| unsafe { raw::$name(device, c, i) };
            // SAFETY: forwarded caller pointers per the NVML contract.
            unsafe { list_in_layout::<$ty>(device, count, infos, $kind, real, $make) }
        }
    };
    ($name:ident, v3, $kind:expr) => {
        /// # Safety
        /// NVML process-list contract (`_v3`: 24- or 32-byte entries, by driver).
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) -> NvmlReturn {
            if v3_entries_are_wide() {
                // SAFETY: the caller's own count and buffer, which on these drivers holds 32-byte
                // entries: the driver writes the layout it always writes.
                let real = |c, i: *mut NvmlProcessInfoV3Cc| unsafe { raw::$name(device, c, i.cast()) };
                // SAFETY: on these drivers the caller's buffer holds 32-byte entries.
                unsafe { list_in_layout(device, count, infos.cast::<NvmlProcessInfoV3Cc>(), $kind, real, v3_wide) }
            } else {
                // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
                let real = |c, i| unsafe { raw::$name(device, c, i) };
                // SAFETY: forwarded caller pointers per the NVML contract.
                unsafe { list_in_layout(device, count, infos, $kind, real, v2) }
            }
        }
    };
}

/// A process list in entry layout `T`, with the panic guard.
///
/// # Safety
/// NVML process-list contract for `T`.
unsafe fn list_in_layout<T: ProcessEntry>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    kind: ListKind,
    real: impl Fn(*mut c_uint, *mut T) -> Option<NvmlReturn>,
    make: impl Fn(&Listed) -> T,
) -> NvmlReturn {
    let real = |c: *mut c_uint, i: *mut T| real(c, i).unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { process_list(device, count, infos, kind, real, |e: &T| e.pid_and_memory(), make) }
    })
}

/// The two fields every process-entry layout starts with.
trait ProcessEntry {
    fn pid_and_memory(&self) -> (u32, u64);
}

impl ProcessEntry for NvmlProcessInfoV1 {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

impl ProcessEntry for NvmlProcessInfoV2 {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

impl ProcessEntry for NvmlProcessInfoV3Cc {
    fn pid_and_memory(&self) -> (u32, u64) {
        (self.pid, self.used_gpu_memory)
    }
}

process_list_hook!(nvmlDeviceGetComputeRunningProcesses, NvmlProcessInfoV1, ListKind::Compute, v1);
process_list_hook!(nvmlDeviceGetComputeRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Compute, v2);
process_list_hook!(nvmlDeviceGetComputeRunningProcesses_v3, v3, ListKind::Compute);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses, NvmlProcessInfoV1, ListKind::Other, v1);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Other, v2);
process_list_hook!(nvmlDeviceGetGraphicsRunningProcesses_v3, v3, ListKind::Other);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses, NvmlProcessInfoV1, ListKind::Other, v1);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses_v2, NvmlProcessInfoV2, ListKind::Other, v2);
process_list_hook!(nvmlDeviceGetMPSComputeRunningProcesses_v3, v3, ListKind::Other);

/// The r550 process list, one call for all three kinds: compute mode is built from the
/// ledger as `nvmlDeviceGetComputeRunningProcesses` is, graphics and MPS modes are the
/// driver's list filtered like the other graphics and MPS calls.
///
/// # Safety
/// `nvmlDeviceGetRunningProcessDetailList` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(device: NvmlDevice, plist: *mut NvmlProcessDetailList) -> NvmlReturn {
    let call = |list: *mut NvmlProcessDetailList| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetRunningProcessDetailList(device, list) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        if plist.is_null() || matches!(accounting::mode(), Mode::Off) {
            return call(plist);
        }
        // SAFETY: non-null, the caller's nvmlProcessDetailList_t.
        let (version, mode, array) = unsafe { ((*plist).version, (*plist).mode, (*plist).proc_array) };
        if version != NVML_PROCESS_DETAIL_LIST_V1 {
            // A layout fgpu does not know: refused rather than passed through unfiltered.
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let kind = match mode {
            NVML_PROCESS_MODE_COMPUTE => ListKind::Compute,
            NVML_PROCESS_MODE_GRAPHICS | NVML_PROCESS_MODE_MPS => ListKind::Other,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        // The driver's list of this mode, read through a list struct of our own so that the
        // driver never writes the caller's.
        let real = |count: *mut c_uint, infos: *mut NvmlProcessDetailV1| {
            // SAFETY: process_list passes a pointer to a live count.
            let mut ours = NvmlProcessDetailList { version, mode, num_proc_array_entries: unsafe { *count }, proc_array: infos };
            let rc = call(&mut ours);
            // SAFETY: as above.
            unsafe { *count = ours.num_proc_array_entries };
            rc
        };
        // SAFETY: the count field of the caller's struct; its array null or holding that many
        // entries, per the NVML contract.
        unsafe { process_list(device, std::ptr::addr_of_mut!((*plist).num_proc_array_entries), array, kind, real, |e| e.pid_and_memory(), v3_wide) }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_early_535_drivers_use_wide_v3_entries() {
        assert!(super::wide_v3_driver("535.54.03"));
        assert!(super::wide_v3_driver("535.43.02"));
        assert!(!super::wide_v3_driver("535.104.05"));
        assert!(!super::wide_v3_driver("570.26"));
        assert!(!super::wide_v3_driver("530.30.02"));
    }
}
