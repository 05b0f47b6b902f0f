// Included by lib.rs: PCI, utilisation, sensors, clocks, modes, accounting.

/// `nvmlPciInfo_t` (v3 layout, 68 bytes).
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [u8; 32],
}

/// The pre-v3 layout used by nvmlDeviceGetPciInfo and _v2 (52 bytes).
#[repr(C)]
pub struct NvmlPciInfoLegacy {
    pub bus_id: [u8; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub reserved: [c_uint; 4],
}

const _: () = assert!(std::mem::size_of::<NvmlPciInfo>() == 68);
const _: () = assert!(std::mem::size_of::<NvmlPciInfoLegacy>() == 52);

fn fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    let n = s.len().min(N - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

fn pci_strings(s: &SimState, i: usize) -> (String, String) {
    let p = s.device_pci(i);
    (
        format!("{:04X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device),
        format!("{:08X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(h: NvmlDevice, pci: *mut NvmlPciInfo) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if pci.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = s.device_pci(i);
        let (legacy, full) = pci_strings(&s, i);
        put(
            pci,
            NvmlPciInfo {
                bus_id_legacy: fixed(&legacy),
                domain: p.domain,
                bus: p.bus,
                device: p.device,
                pci_device_id: p.pci_device_id,
                pci_sub_system_id: p.pci_subsystem_id,
                bus_id: fixed(&full),
            },
        );
        NVML_SUCCESS
    })
}

fn pci_legacy(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    let (s, i) = tri!(dev(h));
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let p = s.device_pci(i);
    let (legacy, _) = pci_strings(&s, i);
    put(
        pci,
        NvmlPciInfoLegacy {
            bus_id: fixed(&legacy),
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pci_device_id: p.pci_device_id,
            pci_sub_system_id: p.pci_subsystem_id,
            reserved: [0; 4],
        },
    );
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    guard(|| pci_legacy(h, pci))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(h: NvmlDevice, pci: *mut NvmlPciInfoLegacy) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        pci_legacy(h, pci)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(h: NvmlDevice, _counter: c_uint, value: *mut c_uint) -> NvmlReturn {
    guard(|| device_u32(h, value, |_, _| 0))
}

// ---- utilisation and sensors ----

#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `gpu`: percent of the last completed sample period (1/6 s unless
/// `FGPU_SIM_SAMPLE_PERIOD` says otherwise) during which some kernel ran
/// on the device timeline. `memory` (global memory traffic) is not modelled: 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(h: NvmlDevice, u: *mut NvmlUtilization) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if u.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = s.sample_period_ns();
        let last_end = fgpu_sim_state::now_ns() / p * p;
        let after = s.timestamp_us(last_end.saturating_sub(p));
        let gpu = s
            .utilisation_periods(i, after)
            .last()
            .map(|period| period.percent(period.device_busy_ns))
            .unwrap_or(0);
        put(u, NvmlUtilization { gpu, memory: 0 });
        NVML_SUCCESS
    })
}

fn codec_utilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    tri!(dev(h));
    if u.is_null() || period.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(u, 0);
    put(period, 167_000);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| codec_utilization(h, u, period))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        codec_utilization(h, u, period)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetJpgUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        codec_utilization(h, u, period)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetOfaUtilization(h: NvmlDevice, u: *mut c_uint, period: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(4u32);
        codec_utilization(h, u, period)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(h: NvmlDevice, sessions: *mut c_uint, fps: *mut c_uint, latency: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if sessions.is_null() || fps.is_null() || latency.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(sessions, 0);
        put(fps, 0);
        put(latency, 0);
        NVML_SUCCESS
    })
}

fn no_sessions(h: NvmlDevice, count: *mut c_uint) -> NvmlReturn {
    tri!(dev(h));
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(count, 0);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(h: NvmlDevice, count: *mut c_uint, _info: *mut c_void) -> NvmlReturn {
    guard(|| no_sessions(h, count))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(h: NvmlDevice, count: *mut c_uint, _info: *mut c_void) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        no_sessions(h, count)
    })
}

#[repr(C)]
pub struct NvmlFbcStats {
    pub sessions_count: c_uint,
    pub average_fps: c_uint,
    pub average_latency: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCStats(h: NvmlDevice, stats: *mut NvmlFbcStats) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if stats.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(stats, NvmlFbcStats { sessions_count: 0, average_fps: 0, average_latency: 0 });
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(h: NvmlDevice, sensor: c_uint, temp: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if sensor != 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if temp.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(temp, 32);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(h: NvmlDevice, kind: c_uint, temp: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if temp.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let v = match kind {
            0 => 92, // SHUTDOWN
            1 => 89, // SLOWDOWN
            2 => 95, // MEM_MAX
            3 => 87, // GPU_MAX
            _ => return NVML_ERROR_NOT_SUPPORTED,
        };
        put(temp, v);
        NVML_SUCCESS
    })
}

/// Passively cooled board: no fan.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(h: NvmlDevice, _speed: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_ERROR_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(h: NvmlDevice, min: *mut c_uint, max: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if min.is_null() || max.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(min, 200_000);
        put(max, 700_000);
        NVML_SUCCESS
    })
}

// ---- clocks ----

fn clock_mhz(kind: c_uint, max: bool) -> Option<c_uint> {
    Some(match (kind, max) {
        (0, false) | (1, false) => 345, // graphics / SM, idle
        (0, true) | (1, true) => 1980,
        (2, _) => 2619,                 // memory
        (3, false) => 765,              // video
        (3, true) => 1545,
        _ => return None,
    })
}

fn clock(h: NvmlDevice, kind: c_uint, out: *mut c_uint, max: bool) -> NvmlReturn {
    tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match clock_mhz(kind, max) {
        Some(v) => {
            put(out, v);
            NVML_SUCCESS
        }
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| clock(h, kind, mhz, false))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| clock(h, kind, mhz, true))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        clock(h, kind, mhz, true)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(h: NvmlDevice, kind: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        clock(h, kind, mhz, true)
    })
}
/// `nvmlDeviceGetClock(device, clockType, clockId, *mhz)`: CURRENT 0, APP_TARGET 1,
/// APP_DEFAULT 2, CUSTOMER_BOOST_MAX 3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(h: NvmlDevice, kind: c_uint, id: c_uint, mhz: *mut c_uint) -> NvmlReturn {
    guard(|| match id {
        0 => clock(h, kind, mhz, false),
        1..=3 => clock(h, kind, mhz, true),
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

fn u64_out(h: NvmlDevice, out: *mut c_ulonglong, v: c_ulonglong) -> NvmlReturn {
    tri!(dev(h));
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(out, v);
    NVML_SUCCESS
}

/// Idle GPU: `nvmlClocksEventReasonGpuIdle`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0x1))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        u64_out(h, r, 0x1)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0x1ff))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(h: NvmlDevice, r: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, r, 0))
}

// ---- modes, ECC, MIG ----

fn pair(h: NvmlDevice, a: *mut c_uint, b: *mut c_uint, va: c_uint, vb: c_uint) -> NvmlReturn {
    tri!(dev(h));
    if a.is_null() || b.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    put(a, va);
    put(b, vb);
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(h: NvmlDevice, current: *mut c_uint, pending: *mut c_uint) -> NvmlReturn {
    guard(|| pair(h, current, pending, 1, 1))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(h: NvmlDevice, current: *mut c_uint, pending: *mut c_uint) -> NvmlReturn {
    guard(|| pair(h, current, pending, 0, 0))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(h: NvmlDevice, _t: c_uint, _c: c_uint, n: *mut c_ulonglong) -> NvmlReturn {
    guard(|| u64_out(h, n, 0))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(h: NvmlDevice, _t: c_uint, _c: c_uint, _l: c_uint, n: *mut c_ulonglong) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        u64_out(h, n, 0)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(h: NvmlDevice, _cause: c_uint, count: *mut c_uint, _addrs: *mut c_ulonglong) -> NvmlReturn {
    guard(|| no_sessions(h, count))
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    h: NvmlDevice,
    _cause: c_uint,
    count: *mut c_uint,
    _addrs: *mut c_ulonglong,
    _ts: *mut c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(2u32);
        no_sessions(h, count)
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    h: NvmlDevice,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if corr.is_null() || unc.is_null() || pending.is_null() || failed.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for p in [corr, unc, pending, failed] {
            put(p, 0);
        }
        NVML_SUCCESS
    })
}

/// Not a MIG device: instance ids do not apply.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(h: NvmlDevice, _id: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_ERROR_NOT_SUPPORTED
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(h: NvmlDevice, _id: *mut c_uint) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        std::hint::black_box(2u32);
        NVML_ERROR_NOT_SUPPORTED
    })
}

/// Every requested field answers NVML_ERROR_NOT_SUPPORTED in its `nvmlReturn`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(h: NvmlDevice, count: c_int, values: *mut u8) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        if count < 0 || (count > 0 && values.is_null()) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for k in 0..count as usize {
            // nvmlFieldValue_t is 40 bytes; its nvmlReturn sits at offset 28.
            // SAFETY: the caller passes `count` nvmlFieldValue_t entries.
            put(unsafe { values.add(k * 40 + 28) } as *mut c_uint, NVML_ERROR_NOT_SUPPORTED);
        }
        NVML_SUCCESS
    })
}

// ---- accounting ----

/// `nvmlAccountingStats_t`.
#[repr(C)]
pub struct NvmlAccountingStats {
    pub gpu_utilization: c_uint,
    pub memory_utilization: c_uint,
    pub max_memory_usage: c_ulonglong,
    pub time: c_ulonglong,
    pub start_time: c_ulonglong,
    pub is_running: c_uint,
    pub reserved: [c_uint; 5],
}

/// The processes accounting knows on device `i`: every live one with a context there, by
/// its raw host PID (the driver records `pClient->ProcID` when the device is allocated and
/// looks stats up by it, whatever the caller's namespace: `gpuacctGetAcctPids`,
/// `gpuacctGetProcAcctInfo`). The simulator keeps no record of processes that have exited.
fn accounted(s: &SimState, i: usize) -> Vec<(u32, u64)> {
    s.reclaim_dead();
    s.processes()
        .into_iter()
        .filter(|p| p.host_pid != 0 && (p.per_device_contexts.get(i).copied().unwrap_or(0) > 0 || p.per_device_used.get(i).copied().unwrap_or(0) > 0))
        .map(|p| (p.host_pid, p.per_device_used.get(i).copied().unwrap_or(0)))
        .collect()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(h: NvmlDevice, count: *mut c_uint, pids: *mut c_uint) -> NvmlReturn {
    guard(|| {
        std::hint::black_box(3u32);
        let (s, i) = tri!(dev(h));
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let found = accounted(&s, i);
        // SAFETY: count is non-NULL (checked above) and points to an unsigned int.
        let cap = unsafe { count.read_unaligned() } as usize;
        put(count, found.len() as c_uint);
        if found.is_empty() {
            return NVML_SUCCESS;
        }
        if pids.is_null() || cap < found.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (k, (pid, _)) in found.iter().enumerate() {
            // SAFETY: the caller's array holds `cap` >= found.len() entries.
            put(unsafe { pids.add(k) }, *pid);
        }
        NVML_SUCCESS
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(h: NvmlDevice, pid: c_uint, stats: *mut NvmlAccountingStats) -> NvmlReturn {
    guard(|| {
        let (s, i) = tri!(dev(h));
        if stats.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match accounted(&s, i).into_iter().find(|(p, _)| *p == pid) {
            Some((_, used)) => {
                put(stats, NvmlAccountingStats { gpu_utilization: 0, memory_utilization: 0, max_memory_usage: used, time: 0, start_time: 0, is_running: 1, reserved: [0; 5] });
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceClearAccountingPids(h: NvmlDevice) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_SUCCESS
    })
}

// ---- events ----

const NVML_ERROR_TIMEOUT: NvmlReturn = 10;

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    static SETS: [u64; 1] = [0];
    guard(|| {
        tri!(ready());
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(set, SETS.as_ptr() as *mut c_void);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(_set: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        NVML_SUCCESS
    })
}

/// The simulated device raises no events (`nvmlDeviceGetSupportedEventTypes` is 0).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(h: NvmlDevice, _types: c_ulonglong, _set: *mut c_void) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_ERROR_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(_set: *mut c_void, _data: *mut c_void, _timeout_ms: c_uint) -> NvmlReturn {
    guard(|| {
        tri!(ready());
        NVML_ERROR_TIMEOUT
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceValidateInforom(h: NvmlDevice) -> NvmlReturn {
    guard(|| {
        tri!(dev(h));
        NVML_SUCCESS
    })
}

// ---- features the simulated board does not have (Windows driver model, vGPU, GRID
// licensing, NVLink fabric, confidential computing, ...): NVML_ERROR_NOT_SUPPORTED, as
// the real library answers on such boards. ----

macro_rules! not_supported {
    ($($name:ident($($a:ident: $t:ty),*);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: NvmlDevice, $($a: $t),*) -> NvmlReturn {
            $(let _ = $a;)*
            guard(|| {
                tri!(dev(h));
                std::hint::black_box(stringify!($name));
                NVML_ERROR_NOT_SUPPORTED
            })
        }
    )*};
}

not_supported! {
    nvmlDeviceGetAutoBoostedClocksEnabled(is_enabled: *mut c_uint, default_is_enabled: *mut c_uint);
    nvmlDeviceGetBridgeChipInfo(hierarchy: *mut c_void);
    nvmlDeviceGetConfComputeProtectedMemoryUsage(memory: *mut NvmlMemory);
    nvmlDeviceGetDriverModel(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetGpuFabricInfo(info: *mut c_void);
    nvmlDeviceGetGpuOperationMode(current: *mut c_uint, pending: *mut c_uint);
    nvmlDeviceGetGridLicensableFeatures_v4(features: *mut c_void);
    nvmlDeviceGetHostVgpuMode(mode: *mut c_uint);
    nvmlDeviceGetLastBBXFlushTime(timestamp: *mut c_ulonglong, duration_us: *mut std::ffi::c_ulong);
    nvmlDeviceGetRowRemapperHistogram(values: *mut c_void);
    nvmlDeviceGetSramEccErrorStatus(status: *mut c_void);
    nvmlDeviceGetViolationStatus(policy: c_uint, time: *mut c_void);
    nvmlDeviceGetTopologyNearestGpus(level: c_uint, count: *mut c_uint, devices: *mut NvmlDevice);
    nvmlDeviceGetCpuAffinity(size: c_uint, cpu_set: *mut std::ffi::c_ulong);
    nvmlDeviceGetMemoryAffinity(size: c_uint, node_set: *mut std::ffi::c_ulong, scope: c_uint);
    nvmlDeviceGetSupportedMemoryClocks(count: *mut c_uint, clocks: *mut c_uint);
    nvmlDeviceGetSupportedGraphicsClocks(memory_mhz: c_uint, count: *mut c_uint, clocks: *mut c_uint);
    nvmlDeviceGetSamples(kind: c_uint, last_seen: c_ulonglong, value_type: *mut c_uint, count: *mut c_uint, samples: *mut c_void);
    nvmlDeviceGetNvLinkCapability(link: c_uint, capability: c_uint, result: *mut c_uint);
    nvmlDeviceGetNvLinkRemotePciInfo_v2(link: c_uint, pci: *mut NvmlPciInfo);
    nvmlDeviceGetGpcClkVfOffset(offset: *mut c_int);
    nvmlDeviceGetConfComputeMemSizeInfo(info: *mut c_void);
}
