//! Exported CUDA driver entry points: contexts and primary contexts.

use super::stream::{ctx_drain, ctx_sync};
use crate::boundary::*;
use crate::driver;
use crate::driver::{driver, Ctx};
use crate::errors::*;
use std::ffi::{c_int, c_uint, c_void};

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
pub unsafe extern "C" fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) -> CUresult {
    guard(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        ctx_create(pctx, flags, dev)
    })
}

/// `cuCtxCreate_v4(CUcontext*, CUctxCreateParams*, unsigned flags, CUdevice)`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult {
    guard(|| ctx_create(pctx, flags, dev))
}

/// Destroying a context waits for its work first.
fn ctx_destroy(ctx: CUcontext) -> CUresult {
    let d = tri!(driver());
    ctx_drain(d, ctx);
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

/// Waits for all the work of the current context.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(ctx_sync)
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
    let last = {
        let g = d.lock();
        (g.primary[dev].refcount == 1 && g.primary[dev].active).then_some(g.primary[dev].handle)
    };
    if let Some(h) = last {
        ctx_drain(d, h);
    }
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
    let active = {
        let g = d.lock();
        g.primary[dev].active.then_some(g.primary[dev].handle)
    };
    if let Some(h) = active {
        ctx_drain(d, h);
    }
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
