//! The per-device pool graph allocations come from, as the application sees it:
//! cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute and cuDeviceGraphMemTrim.

use crate::boundary::*;
use crate::driver::driver;
use crate::errors::*;
use std::ffi::{c_int, c_void};

pub(crate) const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub(crate) const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: c_int = 1;
pub(crate) const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;
pub(crate) const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: c_int = 3;

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let g = d.lock();
        let pool = g.graph_pools[dev];
        let v = match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => pool.used,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => pool.used_high,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => pool.reserved,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => pool.reserved_high,
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        put(value as *mut u64, v);
        CUDA_SUCCESS
    })
}

/// Only the high watermarks can be set, and only to 0 (which resets them to the current value).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        if value.is_null() || get::<u64>(value) != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let pool = &mut g.graph_pools[dev];
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => pool.used_high = pool.used,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => pool.reserved_high = pool.reserved,
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let dev = tri!(d.check_dev(dev));
        let mut g = d.lock();
        let pool = &mut g.graph_pools[dev];
        let spare = pool.reserved - pool.used;
        pool.reserved = pool.used;
        d.give(dev, spare);
        CUDA_SUCCESS
    })
}
