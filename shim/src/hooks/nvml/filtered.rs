//! Utilisation samples, accounting data and encoder / frame-buffer-capture sessions: the
//! driver's answers, filtered to the ledger's processes and given with the PIDs the caller
//! sees (`accounting/listing.rs` maps them). While it is not known which PIDs the driver
//! gives, nothing of the driver's lists is shown; with a broken configuration they are
//! empty.

use crate::abi::nvml::*;
use crate::accounting::listing::Keyed;
use crate::accounting::{self, Active, Mode};
use crate::driver::raw;
use std::ffi::c_uint;

/// The driver's whole list, read into our own buffer: a size query, then the call, again
/// while the list grows. The caller's buffer is sized for the container's entries only, so
/// the driver never writes into it directly.
fn fetch_all<T: Copy + Default>(real: impl Fn(*mut T, *mut c_uint) -> NvmlReturn) -> Result<Vec<T>, NvmlReturn> {
    let mut n: c_uint = 0;
    let rc = real(std::ptr::null_mut(), &mut n);
    // Most lists answer a size query with INSUFFICIENT_SIZE; session lists with SUCCESS and
    // the count.
    if rc == NVML_SUCCESS && n == 0 {
        return Ok(Vec::new());
    }
    for _ in 0..4 {
        if rc != NVML_ERROR_INSUFFICIENT_SIZE && rc != NVML_SUCCESS {
            return Err(rc);
        }
        let mut entries = vec![T::default(); n as usize * 2 + 8];
        let mut got = entries.len() as c_uint;
        match real(entries.as_mut_ptr(), &mut got) {
            NVML_SUCCESS => {
                entries.truncate((got as usize).min(entries.len()));
                return Ok(entries);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => n = got,
            other => return Err(other),
        }
    }
    Err(NVML_ERROR_INSUFFICIENT_SIZE)
}

/// The entries of `all` whose PID stands for a ledger process ([`pid_map`]), each with the
/// PID as the caller sees it, and the number of the ledger's processes the driver can name
/// (at most one sample or accounting PID each).
fn keep_ours<T: Copy>(
    active: &Active,
    device: NvmlDevice,
    keyed: Keyed,
    all: &[T],
    pid: impl Fn(&T) -> c_uint,
    with_pid: impl Fn(T, c_uint) -> T,
) -> (Vec<T>, usize) {
    let map = active.pid_map(device, &active.snapshot(), keyed);
    let kept = all.iter().filter_map(|e| map.iter().find(|(driver, _)| *driver == pid(e)).map(|(_, here)| with_pid(*e, *here))).collect();
    (kept, map.len())
}

/// Hands `kept` to the caller with NVML's size rules: `*count` is the caller's capacity on
/// entry and the container's count on return; a NULL array or a short one gets
/// `NVML_ERROR_INSUFFICIENT_SIZE`, nothing written, and the count to allocate: at least
/// `bound`, what the count means in NVML's reference (for samples "the number of processes
/// running", for accounting the processes accounted), so that the client's second call still
/// fits when an entry arrives between its two calls (the two-call pattern). `none` is the
/// answer when nothing is kept; with `zero_is_query` a capacity of 0 is a size query
/// answered `NVML_SUCCESS` (the session lists' rule).
///
/// # Safety
/// `count` non-null and writable; `out` null or writable for `*count` entries.
unsafe fn answer<T: Copy>(kept: &[T], bound: usize, count: *mut c_uint, out: *mut T, none: NvmlReturn, zero_is_query: bool) -> NvmlReturn {
    // SAFETY: count is non-null, per the contract.
    let capacity = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = kept.len() as c_uint };
    if kept.is_empty() {
        return none;
    }
    if zero_is_query && capacity == 0 {
        return NVML_SUCCESS;
    }
    if out.is_null() || capacity < kept.len() {
        // SAFETY: as above.
        unsafe { *count = kept.len().max(bound) as c_uint };
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `capacity` >= kept.len() entries.
    unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), out, kept.len()) };
    NVML_SUCCESS
}

/// Keeps only samples of the ledger's processes, with PIDs as the caller sees them. The
/// size query answers the container's count, not the card's.
///
/// # Safety
/// `nvmlDeviceGetProcessUtilization` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    samples: *mut NvmlProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: u64,
) -> NvmlReturn {
    let real = |s: *mut NvmlProcessUtilizationSample, c: *mut c_uint| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetProcessUtilization(device, s, c, last_seen) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        if count.is_null() {
            return real(samples, count);
        }
        let (kept, bound) = match accounting::mode() {
            Mode::Off => return real(samples, count),
            // Fail closed: no samples.
            Mode::Closed(_) => (Vec::new(), 0),
            Mode::On(active) => match fetch_all(real) {
                Ok(all) => keep_ours(active, device, Keyed::Samples, &all, |s| s.pid, |s, pid| NvmlProcessUtilizationSample { pid, ..s }),
                Err(NVML_ERROR_NOT_FOUND) => (Vec::new(), 0),
                Err(rc) => return rc,
            },
        };
        // No sample of ours: what the driver answers when it has none, NOT_FOUND.
        // SAFETY: count is non-null; samples per the caller's contract.
        unsafe { answer(&kept, bound, count, samples, NVML_ERROR_NOT_FOUND, false) }
    })
}

/// The r550 form of per-process utilisation, filtered the same way.
///
/// # Safety
/// `nvmlDeviceGetProcessesUtilizationInfo` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(device: NvmlDevice, info: *mut NvmlProcessesUtilizationInfo) -> NvmlReturn {
    let call = |i: *mut NvmlProcessesUtilizationInfo| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetProcessesUtilizationInfo(device, i) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        if info.is_null() || matches!(accounting::mode(), Mode::Off) {
            return call(info);
        }
        // SAFETY: non-null, the caller's nvmlProcessesUtilizationInfo_t.
        let (version, last_seen, out) = unsafe { ((*info).version, (*info).last_seen_time_stamp, (*info).proc_util_array) };
        if version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            // A layout fgpu does not know: refused rather than passed through unfiltered.
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (kept, bound) = match accounting::mode() {
            Mode::On(active) => {
                let real = |p: *mut NvmlProcessUtilizationInfoV1, c: *mut c_uint| {
                    // SAFETY: fetch_all passes a pointer to its own live count.
                    let count = unsafe { *c };
                    let mut ours = NvmlProcessesUtilizationInfo { version, process_samples_count: count, last_seen_time_stamp: last_seen, proc_util_array: p };
                    let rc = call(&mut ours);
                    // SAFETY: as above.
                    unsafe { *c = ours.process_samples_count };
                    rc
                };
                match fetch_all(real) {
                    Ok(all) => keep_ours(active, device, Keyed::Samples, &all, |s| s.pid, |s, pid| NvmlProcessUtilizationInfoV1 { pid, ..s }),
                    Err(NVML_ERROR_NOT_FOUND) => (Vec::new(), 0),
                    Err(rc) => return rc,
                }
            }
            _ => (Vec::new(), 0),
        };
        // SAFETY: the count field of the caller's struct; its array per the NVML contract.
        unsafe { answer(&kept, bound, std::ptr::addr_of_mut!((*info).process_samples_count), out, NVML_ERROR_NOT_FOUND, false) }
    })
}

/// The ledger's processes among the driver's accounting PIDs, as the caller sees them. The
/// size query answers the container's count, not the card's.
///
/// # Safety
/// `nvmlDeviceGetAccountingPids` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(device: NvmlDevice, count: *mut c_uint, pids: *mut c_uint) -> NvmlReturn {
    let real = |p: *mut c_uint, c: *mut c_uint| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingPids(device, c, p) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        if count.is_null() {
            return real(pids, count);
        }
        let (kept, bound) = match accounting::mode() {
            Mode::Off => return real(pids, count),
            Mode::Closed(_) => (Vec::new(), 0),
            Mode::On(active) => match fetch_all(real) {
                Ok(all) => keep_ours(active, device, Keyed::Raw, &all, |p| *p, |_, pid| pid),
                Err(rc) => return rc,
            },
        };
        // SAFETY: count is non-null; pids per the caller's contract.
        unsafe { answer(&kept, bound, count, pids, NVML_SUCCESS, false) }
    })
}

/// Only the ledger's processes have accounting stats; the caller names them by its own PIDs.
///
/// # Safety
/// `nvmlDeviceGetAccountingStats` contract (`stats` is an opaque out-struct here).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(device: NvmlDevice, pid: c_uint, stats: *mut std::ffi::c_void) -> NvmlReturn {
    let real = |p: c_uint| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingStats(device, p, stats) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || match accounting::mode() {
        Mode::Off => real(pid),
        Mode::Closed(_) => NVML_ERROR_NOT_FOUND,
        Mode::On(active) => match active.host_pid_of(pid) {
            Some(host) => real(host),
            None => NVML_ERROR_NOT_FOUND,
        },
    })
}

/// The r610 form: the PID is a field of `stats`, translated for the driver and put back.
///
/// # Safety
/// `nvmlDeviceGetAccountingStats_v2` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats_v2(device: NvmlDevice, stats: *mut NvmlAccountingStatsV2) -> NvmlReturn {
    let real = || {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetAccountingStats_v2(device, stats) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        if stats.is_null() {
            return real();
        }
        let active = match accounting::mode() {
            Mode::Off => return real(),
            Mode::Closed(_) => return NVML_ERROR_NOT_FOUND,
            Mode::On(active) => active,
        };
        // SAFETY: non-null, the caller's nvmlAccountingStats_v2_t.
        let pid = unsafe { (*stats).pid };
        let Some(host) = active.host_pid_of(pid) else { return NVML_ERROR_NOT_FOUND };
        // SAFETY: as above.
        unsafe { (*stats).pid = host };
        let rc = real();
        // SAFETY: as above.
        unsafe { (*stats).pid = pid };
        rc
    })
}

/// Encoder or frame-buffer-capture sessions: the driver's list less other containers'
/// processes, with the sessions' size rules (a count of 0 is a query answered NVML_SUCCESS).
///
/// # Safety
/// The session-list contract for `T`.
unsafe fn session_list<T: Copy + Default>(
    device: NvmlDevice,
    count: *mut c_uint,
    out: *mut T,
    real: impl Fn(*mut c_uint, *mut T) -> NvmlReturn,
    pid: impl Fn(&T) -> c_uint,
    with_pid: impl Fn(T, c_uint) -> T,
) -> NvmlReturn {
    if count.is_null() {
        return real(count, out);
    }
    let kept = match accounting::mode() {
        Mode::Off => return real(count, out),
        Mode::Closed(_) => Vec::new(),
        Mode::On(active) => match fetch_all(|p, c| real(c, p)) {
            Ok(all) => keep_ours(active, device, Keyed::Raw, &all, pid, with_pid).0,
            Err(rc) => return rc,
        },
    };
    // A process can hold several sessions: the kept count is the bound.
    // SAFETY: count is non-null; out per the caller's contract.
    unsafe { answer(&kept, 0, count, out, NVML_SUCCESS, true) }
}

/// # Safety
/// `nvmlDeviceGetEncoderSessions` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(device: NvmlDevice, count: *mut c_uint, sessions: *mut NvmlEncoderSessionInfo) -> NvmlReturn {
    let real = |c, s| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetEncoderSessions(device, c, s) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { session_list(device, count, sessions, real, |s| s.pid, |s, pid| NvmlEncoderSessionInfo { pid, ..s }) }
    })
}

/// # Safety
/// `nvmlDeviceGetFBCSessions` contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(device: NvmlDevice, count: *mut c_uint, sessions: *mut NvmlFbcSessionInfo) -> NvmlReturn {
    let real = |c, s| {
        // SAFETY: the hook's caller's own arguments, passed on unchanged: the call's contract is theirs.
        unsafe { raw::nvmlDeviceGetFBCSessions(device, c, s) }.unwrap_or(NVML_ERROR_FUNCTION_NOT_FOUND)
    };
    crate::hooks::guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: forwarded caller pointers per the NVML contract.
        unsafe { session_list(device, count, sessions, real, |s| s.pid, |s, pid| NvmlFbcSessionInfo { pid, ..s }) }
    })
}
