//! NVML's memory answers as the container sees them: total = the cap (the GPU's own memory
//! when the cap is larger), used = what the ledger's processes hold (contexts included),
//! free = the rest. `_v2`'s `reserved` is 0: the driver's reservation belongs to the card,
//! not the container, so total = used + free holds in both layouts.

use crate::abi::nvml::*;
use crate::accounting::{self, Mode};
use crate::driver::raw;

/// How a memory answer from the driver is to be rewritten.
enum MemoryAnswer {
    /// No cap for this device, or no cap at all: the driver's answer stands.
    Keep,
    /// Failing closed: nothing is free.
    NothingFree,
    /// The container's view.
    Container { total: u64, free: u64, used: u64 },
}

fn memory_answer(device: NvmlDevice, real_total: u64) -> MemoryAnswer {
    match accounting::mode() {
        Mode::On(active) => match active.nvml_memory_view(device, real_total) {
            Some((view, used)) => MemoryAnswer::Container { total: view.total, free: view.free(used, None), used },
            None => MemoryAnswer::Keep,
        },
        Mode::Closed(_) => MemoryAnswer::NothingFree,
        Mode::Off => MemoryAnswer::Keep,
    }
}

/// # Safety
/// `nvmlDeviceGetMemoryInfo` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::nvmlDeviceGetMemoryInfo(device, memory) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: the driver just filled *memory, a caller-provided nvmlMemory_t.
    let m = unsafe { &mut *memory };
    crate::hooks::guard(rc, || {
        match memory_answer(device, m.total) {
            MemoryAnswer::Keep => {}
            MemoryAnswer::NothingFree => m.free = 0,
            MemoryAnswer::Container { total, free, used } => *m = NvmlMemory { total, free, used },
        }
        rc
    })
}

/// # Safety
/// `nvmlDeviceGetMemoryInfo_v2` contract (`version` set by the caller).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn {
    // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
    let rc = unsafe { raw::nvmlDeviceGetMemoryInfo_v2(device, memory) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND);
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: the driver just filled *memory, a caller-provided nvmlMemory_v2_t.
    let m = unsafe { &mut *memory };
    crate::hooks::guard(rc, || {
        match memory_answer(device, m.total) {
            MemoryAnswer::Keep => {}
            MemoryAnswer::NothingFree => m.free = 0,
            MemoryAnswer::Container { total, free, used } => (m.total, m.reserved, m.free, m.used) = (total, 0, free, used),
        }
        rc
    })
}
