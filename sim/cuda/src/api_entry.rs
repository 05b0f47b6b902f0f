// Exported CUDA driver entry points: error strings, export tables, cuGetProcAddress.
// Included by lib.rs.

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
