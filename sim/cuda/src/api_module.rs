// Modules: code and static data the driver places in device memory, which no allocation
// call shows (like a context's own memory). The simulator reads how much from the image:
// a NUL-terminated text that starts with "fgpu-sim-module <size>" (e.g. "fgpu-sim-module
// 200M") takes that much; any other image takes 2 MiB. The memory goes with
// cuModuleUnload or with the module's context.

pub type CUmodule = usize;
const MODULE_DEFAULT_BYTES: u64 = 2 << 20;

fn module_bytes(image: *const c_void) -> u64 {
    let mut head = Vec::with_capacity(64);
    for i in 0..64 {
        // SAFETY: the caller checked `image` is non-NULL; a simulated module image is text,
        // and reading stops at its NUL (or after 64 bytes).
        let b = unsafe { *(image as *const u8).add(i) };
        if b == 0 {
            break;
        }
        head.push(b);
    }
    let text = String::from_utf8_lossy(&head);
    text.strip_prefix("fgpu-sim-module ")
        .and_then(|rest| fgpu_sim_state::size::parse_size(rest.split_whitespace().next().unwrap_or("")))
        .unwrap_or(MODULE_DEFAULT_BYTES)
}

fn module_load(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    let d = tri!(driver());
    if pmod.is_null() || image.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let bytes = module_bytes(image);
    let mut g = d.lock();
    let (ctx, dev) = tri!(g.current(d));
    if !d.take(dev, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let h = g.new_handle();
    g.modules.insert(h, (ctx, dev, bytes));
    put(pmod, h);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| module_load(pmod, image))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    variant(46);
    guard(|| module_load(pmod, image))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        let Some((_, dev, bytes)) = g.modules.remove(&module) else { return CUDA_ERROR_INVALID_HANDLE };
        d.give(dev, bytes);
        CUDA_SUCCESS
    })
}
