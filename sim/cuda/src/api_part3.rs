// Exported CUDA driver entry points (part 3: VMM, arrays, errors, entry points).
// Included by lib.rs.

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub alloc_type: c_uint,
    pub requested_handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pub win32_handle_meta_data: *mut c_void,
    // allocFlags
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
pub struct CUmemAccessDesc {
    pub location_type: c_uint,
    pub location_id: c_int,
    pub flags: c_uint,
}

const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// Sentinel device index for host-located VMM memory.
const HOST_LOCATION: usize = usize::MAX;

/// Validates an allocation property: Some(device) or Some(HOST_LOCATION).
fn check_prop(d: &Driver, prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a valid CUmemAllocationProp (CUDA API contract).
    let p = unsafe { &*prop };
    if p.alloc_type != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match p.location_type {
        CU_MEM_LOCATION_TYPE_DEVICE => d.check_dev(p.location_id),
        2..=4 => Ok(HOST_LOCATION),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if granularity.is_null() || option > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(check_prop(d, prop));
        put(granularity, driver::GRANULARITY as usize);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if handle.is_null() || flags != 0 || size == 0 || !(size as u64).is_multiple_of(driver::GRANULARITY) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = tri!(check_prop(d, prop));
        let mut g = d.lock();
        if dev != HOST_LOCATION && !d.take(dev, size as u64) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let h = g.new_handle() as u64;
        g.vmm.insert(h, VmmHandle { dev, size: size as u64, released: false, maps: 0 });
        put(handle, h);
        CUDA_SUCCESS
    })
}

fn vmm_maybe_free(g: &mut Inner, d: &Driver, h: u64) {
    let done = matches!(g.vmm.get(&h), Some(v) if v.released && v.maps == 0);
    if done {
        if let Some(v) = g.vmm.remove(&h) {
            if v.dev != HOST_LOCATION {
                d.give(v.dev, v.size);
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        match g.vmm.get_mut(&handle) {
            Some(v) if !v.released => v.released = true,
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        vmm_maybe_free(&mut g, d, handle);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let gran = driver::GRANULARITY;
        if ptr.is_null() || flags != 0 || size == 0 || !(size as u64).is_multiple_of(gran) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let align = if alignment == 0 { gran } else { alignment as u64 };
        if !align.is_power_of_two() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let Some(p) = g.va.alloc(size as u64, align.max(gran)) else { return CUDA_ERROR_OUT_OF_MEMORY };
        g.reservations.insert(p, size as u64);
        put(ptr, p);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        match g.reservations.get(&ptr) {
            Some(&s) if s == size as u64 => {}
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        if g.mappings.range(ptr..ptr + size as u64).next().is_some() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        g.reservations.remove(&ptr);
        g.va.free(ptr, size as u64);
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let (size, offset) = (size as u64, offset as u64);
        let gran = driver::GRANULARITY;
        if flags != 0 || size == 0 || size % gran != 0 || offset % gran != 0 || !ptr.is_multiple_of(gran) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let hsize = match g.vmm.get(&handle) {
            Some(v) if !v.released => v.size,
            _ => return CUDA_ERROR_INVALID_HANDLE,
        };
        if offset.checked_add(size).is_none_or(|e| e > hsize) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // Inside one reservation, not overlapping another mapping.
        let inside = matches!(g.reservations.range(..=ptr).next_back(), Some((&b, &s)) if ptr + size <= b + s);
        if !inside {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let overlaps_prev = matches!(g.mappings.range(..=ptr).next_back(), Some((&b, &(s, _))) if b + s > ptr);
        if overlaps_prev || g.mappings.range(ptr..ptr + size).next().is_some() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        g.mappings.insert(ptr, (size, handle));
        if let Some(v) = g.vmm.get_mut(&handle) {
            v.maps += 1;
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let end = ptr.saturating_add(size as u64);
        let mut g = d.lock();
        let starts: Vec<(u64, u64, u64)> =
            g.mappings.range(ptr..end).map(|(&b, &(s, h))| (b, s, h)).collect();
        let partial_before = matches!(g.mappings.range(..ptr).next_back(), Some((&b, &(s, _))) if b + s > ptr);
        if starts.is_empty() || partial_before || starts.iter().any(|&(b, s, _)| b + s > end) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (b, _, h) in starts {
            g.mappings.remove(&b);
            if let Some(v) = g.vmm.get_mut(&h) {
                v.maps = v.maps.saturating_sub(1);
            }
            vmm_maybe_free(&mut g, d, h);
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if desc.is_null() || count == 0 || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors (CUDA API contract).
            let a = unsafe { &*desc.add(i) };
            if a.location_type == CU_MEM_LOCATION_TYPE_DEVICE && d.check_dev(a.location_id).is_err() {
                return CUDA_ERROR_INVALID_DEVICE;
            }
            if a.flags > 3 || a.flags == 2 {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        let g = d.lock();
        // The whole range must be mapped.
        let mut cur = ptr;
        let end = ptr.saturating_add(size as u64);
        while cur < end {
            match g.mappings.range(..=cur).next_back() {
                Some((&b, &(s, _))) if b + s > cur => cur = b + s,
                _ => return CUDA_ERROR_INVALID_VALUE,
            }
        }
        CUDA_SUCCESS
    })
}

// ---- arrays ----

#[repr(C)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}
#[repr(C)]
pub struct ArrayDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
}
#[repr(C)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}
#[repr(C)]
pub struct Array3DDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}
/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING: no memory until mapped.
const ARRAY_NO_BACKING: c_uint = 0x40 | 0x80;

fn array_create(ph: *mut usize, dims: (u64, u64, u64), format: c_uint, ch: c_uint, flags: c_uint, levels: u32, mip: bool) -> CUresult {
    let d = tri!(driver());
    if ph.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(bytes) = driver::array_bytes(dims.0, dims.1, dims.2, format, ch, levels) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let charged = if flags & ARRAY_NO_BACKING != 0 { 0 } else { bytes };
    let mut g = d.lock();
    let (ctx, dev) = tri!(g.current(d));
    if !d.take(dev, charged) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let h = g.new_handle();
    g.arrays.insert(h, ArrayRec { dev, ctx, bytes: charged, mipmapped: mip });
    put(ph, h);
    CUDA_SUCCESS
}

fn array_destroy(h: usize, mip: bool) -> CUresult {
    let d = tri!(driver());
    let mut g = d.lock();
    match g.arrays.get(&h) {
        Some(a) if a.mipmapped == mip => {}
        _ => return CUDA_ERROR_INVALID_HANDLE,
    }
    if let Some(a) = g.arrays.remove(&h) {
        d.give(a.dev, a.bytes);
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(ph: *mut CUarray, desc: *const ArrayDesc) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, 0), a.format, a.num_channels, 0, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(ph: *mut CUarray, desc: *const ArrayDescV1) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, 0), a.format, a.num_channels, 0, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(ph: *mut CUarray, desc: *const Array3DDesc) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(ph: *mut CUarray, desc: *const Array3DDescV1) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, 1, false)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(h: CUarray) -> CUresult {
    guard(|| array_destroy(h, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(ph: *mut CUmipmappedArray, desc: *const Array3DDesc, levels: c_uint) -> CUresult {
    guard(|| {
        if desc.is_null() || levels == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: valid descriptor per the CUDA API contract.
        let a = unsafe { &*desc };
        array_create(ph, (a.width as u64, a.height as u64, a.depth as u64), a.format, a.num_channels, a.flags, levels, true)
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: CUmipmappedArray) -> CUresult {
    guard(|| array_destroy(h, true))
}

fn array_requirements(req: *mut ArrayMemoryRequirements, h: usize, dev: CUdevice, mip: bool) -> CUresult {
    let d = tri!(driver());
    let dev = tri!(d.check_dev(dev));
    if req.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let g = d.lock();
    match g.arrays.get(&h) {
        Some(a) if a.mipmapped == mip && a.dev == dev => {
            put(req, ArrayMemoryRequirements { size: a.bytes.max(driver::GRANULARITY) as usize, alignment: driver::GRANULARITY as usize, reserved: [0; 4] });
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(req: *mut ArrayMemoryRequirements, array: CUarray, dev: CUdevice) -> CUresult {
    guard(|| array_requirements(req, array, dev, false))
}
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    req: *mut ArrayMemoryRequirements,
    array: CUmipmappedArray,
    dev: CUdevice,
) -> CUresult {
    guard(|| array_requirements(req, array, dev, true))
}

// ---- errors ----

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        if pstr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match ERRORS.iter().find(|e| e.0 == error) {
            Some(e) => {
                put(pstr, e.1.as_ptr() as *const c_char);
                CUDA_SUCCESS
            }
            None => {
                put(pstr, std::ptr::null());
                CUDA_ERROR_INVALID_VALUE
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        if pstr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match ERRORS.iter().find(|e| e.0 == error) {
            Some(e) => {
                put(pstr, e.2.as_ptr() as *const c_char);
                CUDA_SUCCESS
            }
            None => {
                put(pstr, std::ptr::null());
                CUDA_ERROR_INVALID_VALUE
            }
        }
    })
}

/// The real runtime needs private export tables the simulator does not have.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const [u8; 16]) -> CUresult {
    guard(|| {
        put(table, std::ptr::null());
        CUDA_ERROR_NOT_SUPPORTED
    })
}

// ---- entry points ----

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    guard(|| procaddr::get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> CUresult {
    guard(|| procaddr::get_proc_address(symbol, pfn, cuda_version, flags, status))
}
