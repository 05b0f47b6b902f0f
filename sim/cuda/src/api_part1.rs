// Exported CUDA driver entry points (part 1: init, devices, contexts, plain memory).
// Included by lib.rs.

/// cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| if flags != 0 { CUDA_ERROR_INVALID_VALUE } else { driver::init() })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(|| {
        if version.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let v = match driver::state_only() {
            Some(s) => s.driver_version(),
            None => fgpu_sim_state::SimConfig::from_env().map(|c| c.driver_version).unwrap_or(12080),
        };
        put(version, v as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if device.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(d.check_dev(ordinal));
        put(device, ordinal);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if count.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(count, d.ndev() as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put_cstr(name, len as usize, &d.state.device_name(d.phys(dev)));
        CUDA_SUCCESS
    })
}

fn get_uuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    if uuid.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    put(uuid, d.state.device_uuid(d.phys(dev)));
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(|| get_uuid(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    variant(1);
    guard(|| get_uuid(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(bytes, d.state.device_total(d.phys(dev)).min(u32::MAX as u64) as c_uint);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if bytes.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(bytes, d.state.device_total(d.phys(dev)) as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pi.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match attributes::value(&d.state, d.phys(dev), attrib) {
            Some(v) => {
                put(pi, v);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        tri!(d.check_dev(dev));
        if major.is_null() || minor.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(major, 9);
        put(minor, 0);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if pci_bus_id.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = d.state.device_pci(d.phys(dev));
        put_cstr(pci_bus_id, len as usize, &format!("{:04x}:{:02x}:{:02x}.0", p.domain, p.bus, p.device));
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, pci_bus_id: *const c_char) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if dev.is_null() || pci_bus_id.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated string (CUDA API contract).
        let s = unsafe { CStr::from_ptr(pci_bus_id) }.to_string_lossy().to_ascii_lowercase();
        let parse = |s: &str| -> Option<(u32, u32, u32)> {
            let mut it = s.split(':');
            let (a, b, c) = (it.next()?, it.next()?, it.next());
            let (dom, bus, rest) = match c {
                Some(c) => (u32::from_str_radix(a, 16).ok()?, u32::from_str_radix(b, 16).ok()?, c),
                None => (0, u32::from_str_radix(a, 16).ok()?, b),
            };
            let devn = u32::from_str_radix(rest.split('.').next()?, 16).ok()?;
            Some((dom, bus, devn))
        };
        let Some((dom, bus, devn)) = parse(&s) else { return CUDA_ERROR_INVALID_VALUE };
        for o in 0..d.ndev() {
            let p = d.state.device_pci(d.phys(o));
            if (p.domain, p.bus, p.device) == (dom, bus, devn) {
                put(dev, o as c_int);
                return CUDA_SUCCESS;
            }
        }
        CUDA_ERROR_INVALID_DEVICE
    })
}

// ---- contexts ----

fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let d = tri!(driver());
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let dev = tri!(d.check_dev(dev));
    let mut g = d.lock();
    if !d.take(dev, d.state.context_overhead()) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    d.state.count_context(d.slot, d.phys(dev), true);
    let h = g.new_handle();
    g.contexts.insert(h, Ctx { dev, flags, primary: false });
    driver::ctx_push(h);
    put(pctx, h);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    variant(2);
    guard(|| ctx_create(pctx, flags, dev))
}

/// `cuCtxCreate_v3(CUcontext*, CUexecAffinityParam*, int numParams, unsigned flags, CUdevice)`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        ctx_create(pctx, flags, dev)
    })
}

/// `cuCtxCreate_v4(CUcontext*, CUctxCreateParams*, unsigned flags, CUdevice)`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

fn ctx_destroy(ctx: CUcontext) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    let (dev, primary) = match g.contexts.get(&ctx) {
        Some(c) => (c.dev, c.primary),
        None => return CUDA_ERROR_INVALID_CONTEXT,
    };
    if primary {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    g.teardown_ctx(d, ctx, dev);
    g.contexts.remove(&ctx);
    driver::ctx_pop_if_top(ctx);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    guard(|| ctx_destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    variant(3);
    guard(|| ctx_destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        tri!(driver());
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(pctx, driver::ctx_top());
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if ctx != 0 && !d.lock().contexts.contains_key(&ctx) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        driver::ctx_set_top(ctx);
        CUDA_SUCCESS
    })
}

fn ctx_push(ctx: CUcontext) -> CUresult {
    let d = tri!(driver());
    if ctx == 0 || !d.lock().contexts.contains_key(&ctx) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    driver::ctx_push(ctx);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    guard(|| ctx_push(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    variant(4);
    guard(|| ctx_push(ctx))
}

fn ctx_pop(pctx: *mut CUcontext) -> CUresult {
    tri!(driver());
    match driver::ctx_pop() {
        Some(h) => {
            put(pctx, h);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_CONTEXT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| ctx_pop(pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    variant(5);
    guard(|| ctx_pop(pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if device.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (_, dev) = tri!(d.lock().current(d));
        put(device, dev as c_int);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if flags.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (h, dev) = tri!(g.current(d));
        let f = match g.contexts.get(&h) {
            Some(c) if c.primary => g.primary[dev].flags,
            Some(c) => c.flags,
            None => 0,
        };
        put(flags, f);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        tri!(g.current(d));
        g.sync_pools(d);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        tri!(d.lock().current(d));
        put(least, 0);
        put(greatest, -5);
        CUDA_SUCCESS
    })
}

// ---- primary contexts ----

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = tri!(d.check_dev(dev));
        let mut g = d.lock();
        let h = g.primary_handle(dev);
        if !g.primary[dev].active {
            tri!(g.activate_primary(d, dev));
        }
        g.primary[dev].refcount += 1;
        put(pctx, h);
        CUDA_SUCCESS
    })
}

fn primary_release(dev: CUdevice) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    let mut g = d.lock();
    if g.primary[dev].refcount == 0 {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    g.primary[dev].refcount -= 1;
    if g.primary[dev].refcount == 0 && g.primary[dev].active {
        let h = g.primary[dev].handle;
        g.teardown_ctx(d, h, dev);
        g.primary[dev].active = false;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    variant(6);
    guard(|| primary_release(dev))
}

fn primary_reset(dev: CUdevice) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    let mut g = d.lock();
    if g.primary[dev].active {
        let h = g.primary[dev].handle;
        g.teardown_ctx(d, h, dev);
        g.primary[dev].active = false;
    }
    g.primary[dev].flags = 0;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(|| primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    variant(7);
    guard(|| primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if flags.is_null() || active.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        put(flags, g.primary[dev].flags);
        put(active, g.primary[dev].active as c_int);
        CUDA_SUCCESS
    })
}

fn primary_set_flags(dev: CUdevice, flags: c_uint, allow_active: bool) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    let mut g = d.lock();
    if !allow_active && g.primary[dev].active {
        return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    }
    g.primary[dev].flags = flags;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| primary_set_flags(dev, flags, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    variant(25);
    guard(|| primary_set_flags(dev, flags, true))
}

// ---- device memory ----

#[inline]
fn mem_alloc(size: u64, low: bool) -> Result<u64, CUresult> {
    let d = driver()?;
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = d.lock();
    let (ctx, dev) = g.current(d)?;
    g.alloc_device(d, dev, ctx, size, size, Kind::Device, low)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(dptr, tri!(mem_alloc(bytesize as u64, false)));
        CUDA_SUCCESS
    })
}

/// Legacy 32-bit `cuMemAlloc(CUdeviceptr_v1*, unsigned int)`: pointers from a 32-bit range.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        put(dptr, tri!(mem_alloc(bytesize as u64, true)) as c_uint);
        CUDA_SUCCESS
    })
}

fn pitch_alloc(width: u64, height: u64, elem: u32, low: bool) -> Result<(u64, u64), CUresult> {
    if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = round_up(width, driver::PITCH_ALIGN);
    let bytes = pitch.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((mem_alloc(bytes, low)?, pitch))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    ppitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(|| {
        if dptr.is_null() || ppitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (p, pitch) = tri!(pitch_alloc(width as u64, height as u64, elem, false));
        put(dptr, p);
        put(ppitch, pitch as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut c_uint,
    ppitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    guard(|| {
        if dptr.is_null() || ppitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (p, pitch) = tri!(pitch_alloc(width as u64, height as u64, elem, true));
        put(dptr, p as c_uint);
        put(ppitch, pitch as c_uint);
        CUDA_SUCCESS
    })
}

#[inline]
fn mem_free(ptr: u64) -> CUresult {
    let d = tri!(driver());
    if ptr == 0 {
        // free(NULL) semantics, like the real driver.
        return CUDA_SUCCESS;
    }
    let mut g = d.lock();
    match g.allocs.get(&ptr) {
        Some(_) => {
            g.free_alloc(d, ptr);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| mem_free(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: c_uint) -> CUresult {
    guard(|| mem_free(dptr as u64))
}

fn mem_info() -> Result<(u64, u64), CUresult> {
    let d = driver()?;
    let (_, dev) = d.lock().current(d)?;
    let p = d.phys(dev);
    let total = d.state.device_total(p);
    let mut used = d.state.device_used_counter(p);
    if used > 0 && d.state.reclaim_dead() > 0 {
        used = d.state.device_used_counter(p);
    }
    Ok((d.state.device_usable(p).saturating_sub(used), total))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let (f, t) = tri!(mem_info());
        put(free, f as usize);
        put(total, t as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    guard(|| {
        let (f, t) = tri!(mem_info());
        put(free, f.min(u32::MAX as u64) as c_uint);
        put(total, t.min(u32::MAX as u64) as c_uint);
        CUDA_SUCCESS
    })
}

fn addr_range(ptr: u64) -> Result<(u64, u64), CUresult> {
    let d = driver()?;
    let g = d.lock();
    g.find_range(ptr, 0).map(|(b, s, _)| (b, s)).ok_or(CUDA_ERROR_NOT_FOUND)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        let (b, s) = tri!(addr_range(dptr));
        put(pbase, b);
        put(psize, s as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange(pbase: *mut c_uint, psize: *mut c_uint, dptr: c_uint) -> CUresult {
    guard(|| {
        let (b, s) = tri!(addr_range(dptr as u64));
        put(pbase, b as c_uint);
        put(psize, s as c_uint);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if dptr.is_null() || bytesize == 0 || !matches!(flags, 1 | 2) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (ctx, dev) = tri!(g.current(d));
        let p = tri!(g.alloc_device(d, dev, ctx, bytesize as u64, bytesize as u64, Kind::Managed, false));
        put(dptr, p);
        CUDA_SUCCESS
    })
}

// ---- host memory (no device usage) ----

fn host_alloc(pp: *mut *mut c_void, size: usize) -> CUresult {
    let d = tri!(driver());
    if pp.is_null() || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = d.lock();
    tri!(g.current(d));
    // SAFETY: a fresh anonymous mapping of `size` bytes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g.host.insert(p as usize, size);
    put(pp, p);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    guard(|| host_alloc(pp, bytesize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: c_uint) -> CUresult {
    guard(|| host_alloc(pp, bytesize as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    guard(|| {
        if flags & !0x0f != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        host_alloc(pp, bytesize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if p.is_null() {
            // free(NULL) semantics, like the real driver.
            return CUDA_SUCCESS;
        }
        let mut g = d.lock();
        match g.host.remove(&(p as usize)) {
            Some(len) => {
                driver::unmap_host(p as u64, len as u64);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}
