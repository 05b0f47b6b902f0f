//! Modules, functions, libraries and kernels.
//!
//! A module image for the simulator is a NUL-terminated text; lines (or `;`-separated
//! parts) after the first declare its kernels:
//!
//!     fgpu-sim-module [<memory>]
//!     kernel <name> <duration per block>
//!
//! e.g. "fgpu-sim-module 4M\nkernel spin 1us\n". `<memory>` (default 2 MiB) is the device
//! memory the loaded module takes, which no allocation call shows (like a context's own
//! memory), given back with cuModuleUnload or with the module's context. A launch of
//! kernel `spin` with a grid of X x Y x Z blocks occupies the device for
//! X*Y*Z * <duration per block> (see docs/simulator.md). Any other image takes 2 MiB and
//! declares no kernels (cuModuleGetFunction answers CUDA_ERROR_NOT_FOUND for every name).

use crate::boundary::*;
use crate::driver::{driver, Driver, FuncRec, Inner, KernelRec, LibraryRec, ModuleRec};
use crate::errors::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

pub type CUmodule = usize;
pub type CUfunction = usize;
pub type CUlibrary = usize;
pub type CUkernel = usize;
const MODULE_DEFAULT_BYTES: u64 = 2 << 20;
const MODULE_MAGIC: &[u8] = b"fgpu-sim-module";
/// Longest simulator image read (a text image must end with a NUL before this).
const MODULE_MAX_TEXT: usize = 1 << 20;

/// What an image holds: the memory it takes and its kernels (name, ns per block).
struct Image {
    bytes: u64,
    kernels: Vec<(String, u64)>,
}

fn parse_image_text(text: &str) -> Result<Image, CUresult> {
    let mut parts = text.split(['\n', ';']).map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
    let head = parts.next().unwrap_or("");
    let mut words = head.split_whitespace();
    if words.next() != Some("fgpu-sim-module") {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let bytes = match words.next() {
        Some(size) => fgpu_sim_state::parse_size(size).ok_or(CUDA_ERROR_INVALID_IMAGE)?,
        None => MODULE_DEFAULT_BYTES,
    };
    if words.next().is_some() {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let mut kernels: Vec<(String, u64)> = Vec::new();
    for line in parts {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["kernel", name, dur] => {
                let ns = fgpu_sim_state::parse_duration(dur).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
                if kernels.iter().any(|k| k.0 == *name) {
                    return Err(CUDA_ERROR_INVALID_IMAGE);
                }
                kernels.push((name.to_string(), ns));
            }
            _ => return Err(CUDA_ERROR_INVALID_IMAGE),
        }
    }
    Ok(Image { bytes, kernels })
}

fn read_image(image: *const c_void) -> Result<Image, CUresult> {
    let p = image as *const u8;
    let mut text = Vec::new();
    for i in 0..MODULE_MAX_TEXT {
        // SAFETY: the caller checked `image` is non-NULL. The first bytes are read only as far
        // as they match the simulator's magic (a real image's header differs within them);
        // a simulator image is text, read up to its NUL.
        let b = unsafe { *p.add(i) };
        if b == 0 {
            break;
        }
        if MODULE_MAGIC.get(i).is_some_and(|&m| m != b) {
            return Ok(Image { bytes: MODULE_DEFAULT_BYTES, kernels: Vec::new() });
        }
        text.push(b);
    }
    if text.len() < MODULE_MAGIC.len() {
        return Ok(Image { bytes: MODULE_DEFAULT_BYTES, kernels: Vec::new() });
    }
    if text.len() == MODULE_MAX_TEXT {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    parse_image_text(std::str::from_utf8(&text).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?)
}

fn read_image_file(path: *const c_char) -> Result<Image, CUresult> {
    if path.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated path (CUDA API contract).
    let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
    let mut data = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    data.push(0);
    read_image(data.as_ptr() as *const c_void)
}

/// Loads `image` as a module of the current context.
fn load_module(g: &mut Inner, d: &Driver, ctx: usize, dev: usize, image: &Image, library: usize) -> Result<usize, CUresult> {
    if !d.take(dev, image.bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let h = g.new_handle();
    g.modules.insert(h, ModuleRec { ctx, dev, bytes: image.bytes, kernels: image.kernels.clone(), library });
    Ok(h)
}

fn module_load(pmod: *mut CUmodule, image: Result<Image, CUresult>) -> CUresult {
    let d = tri!(driver());
    if pmod.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let image = tri!(image);
    let mut g = d.lock();
    let (ctx, dev) = tri!(g.current(d));
    let h = tri!(load_module(&mut g, d, ctx, dev, &image, 0));
    put(pmod, h);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| {
        if image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        module_load(pmod, read_image(image))
    })
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
    guard(|| {
        if image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        module_load(pmod, read_image(image))
    })
}

/// `cuModuleLoadFatBinary(CUmodule*, const void *fatCubin)`: the same image rules.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    variant(47);
    guard(|| {
        if image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        module_load(pmod, read_image(image))
    })
}

/// `cuModuleLoad(CUmodule*, const char *fname)`: the file's contents are the image.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(pmod: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard(|| module_load(pmod, read_image_file(fname)))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        if g.modules.get(&module).is_none_or(|m| m.library != 0) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        g.unload_module(d, module);
        CUDA_SUCCESS
    })
}

/// The function handle of kernel `name` of module `module` (the same handle every time).
fn module_function(g: &mut Inner, module: usize, name: &str) -> Result<usize, CUresult> {
    let ns = {
        let m = g.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        m.kernels.iter().find(|k| k.0 == name).map(|k| k.1).ok_or(CUDA_ERROR_NOT_FOUND)?
    };
    if let Some((&h, _)) = g.functions.iter().find(|(_, f)| f.module == module && f.name == name) {
        return Ok(h);
    }
    let h = g.new_handle();
    g.functions.insert(h, FuncRec { module, name: name.to_string(), ns_per_block: ns });
    Ok(h)
}

/// `cuModuleGetFunction(CUfunction*, CUmodule, const char *name)`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(hfunc: *mut CUfunction, module: CUmodule, name: *const c_char) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if hfunc.is_null() || name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated name (CUDA API contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let mut g = d.lock();
        let f = tri!(module_function(&mut g, module, &name));
        put(hfunc, f);
        CUDA_SUCCESS
    })
}

/// `cuFuncGetModule(CUmodule*, CUfunction)`.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(hmod: *mut CUmodule, func: CUfunction) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if hmod.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match d.lock().functions.get(&func) {
            Some(f) => {
                put(hmod, f.module);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

/// `cuFuncGetName(const char **name, CUfunction)`: names live as long as the process.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, func: CUfunction) -> CUresult {
    guard(|| {
        static NAMES: std::sync::Mutex<Vec<std::ffi::CString>> = std::sync::Mutex::new(Vec::new());
        let d = tri!(driver());
        if name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let n = match d.lock().functions.get(&func) {
            Some(f) => f.name.clone(),
            None => return CUDA_ERROR_INVALID_HANDLE,
        };
        let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
        let c = match names.iter().find(|c| c.to_bytes() == n.as_bytes()) {
            Some(c) => c.as_ptr(),
            None => {
                names.push(std::ffi::CString::new(n).unwrap_or_default());
                names.last().map(|c| c.as_ptr()).unwrap_or(std::ptr::null())
            }
        };
        put(name, c);
        CUDA_SUCCESS
    })
}

// ---- libraries (CUDA 12.0): context-independent, loaded into a context at first use ----

fn library_load(plib: *mut CUlibrary, image: Result<Image, CUresult>) -> CUresult {
    let d = tri!(driver());
    if plib.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let image = tri!(image);
    let mut g = d.lock();
    let h = g.new_handle();
    g.libraries.insert(h, LibraryRec { bytes: image.bytes, kernels: image.kernels, loaded: HashMap::new() });
    put(plib, h);
    CUDA_SUCCESS
}

/// `cuLibraryLoadData(CUlibrary*, const void *code, CUjit_option*, void**, unsigned,
/// CUlibraryOption*, void**, unsigned)`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    plib: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    guard(|| {
        if code.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        library_load(plib, read_image(code))
    })
}

/// `cuLibraryLoadFromFile(CUlibrary*, const char *fileName, ...)` (options as above).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    plib: *mut CUlibrary,
    file: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    guard(|| library_load(plib, read_image_file(file)))
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        let mut g = d.lock();
        let Some(lib) = g.libraries.remove(&library) else { return CUDA_ERROR_INVALID_HANDLE };
        for (_, module) in lib.loaded {
            g.unload_module(d, module);
        }
        g.kernels.retain(|_, k| k.library != library);
        CUDA_SUCCESS
    })
}

/// `cuLibraryGetKernel(CUkernel*, CUlibrary, const char *name)`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(pkernel: *mut CUkernel, library: CUlibrary, name: *const c_char) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if pkernel.is_null() || name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated name (CUDA API contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let mut g = d.lock();
        let Some(lib) = g.libraries.get(&library) else { return CUDA_ERROR_INVALID_HANDLE };
        let Some(ns) = lib.kernels.iter().find(|k| k.0 == name).map(|k| k.1) else { return CUDA_ERROR_NOT_FOUND };
        let h = match g.kernels.iter().find(|(_, k)| k.library == library && k.name == name) {
            Some((&h, _)) => h,
            None => {
                let h = g.new_handle();
                g.kernels.insert(h, KernelRec { library, name, ns_per_block: ns });
                h
            }
        };
        put(pkernel, h);
        CUDA_SUCCESS
    })
}

impl Inner {
    /// The module library `library` became in context `ctx`, loading it there (and taking
    /// its memory) at first use.
    pub fn library_module(&mut self, d: &Driver, library: usize, ctx: usize, dev: usize) -> Result<usize, CUresult> {
        let lib = self.libraries.get(&library).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(&m) = lib.loaded.get(&ctx) {
            return Ok(m);
        }
        let image = Image { bytes: lib.bytes, kernels: lib.kernels.clone() };
        let m = load_module(self, d, ctx, dev, &image, library)?;
        if let Some(lib) = self.libraries.get_mut(&library) {
            lib.loaded.insert(ctx, m);
        }
        Ok(m)
    }

    /// Nanoseconds per block of a `CUfunction`, or of a `CUkernel` used as one (allowed
    /// by the launch calls since CUDA 12.0), in context `ctx`.
    pub fn launch_ns_per_block(&mut self, d: &Driver, f: usize, ctx: usize, dev: usize) -> Result<u64, CUresult> {
        if let Some(func) = self.functions.get(&f) {
            return Ok(func.ns_per_block);
        }
        let (library, ns) = match self.kernels.get(&f) {
            Some(k) => (k.library, k.ns_per_block),
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        self.library_module(d, library, ctx, dev)?;
        Ok(ns)
    }
}

/// `cuLibraryGetModule(CUmodule*, CUlibrary)`: the library's module in the current context.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(pmod: *mut CUmodule, library: CUlibrary) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if pmod.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (ctx, dev) = tri!(g.current(d));
        let m = tri!(g.library_module(d, library, ctx, dev));
        put(pmod, m);
        CUDA_SUCCESS
    })
}

/// `cuKernelGetFunction(CUfunction*, CUkernel)`: the kernel's function in the current
/// context.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(pfunc: *mut CUfunction, kernel: CUkernel) -> CUresult {
    guard(|| {
        let d = tri!(driver());
        if pfunc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut g = d.lock();
        let (ctx, dev) = tri!(g.current(d));
        let Some(k) = g.kernels.get(&kernel) else { return CUDA_ERROR_INVALID_HANDLE };
        let (library, name) = (k.library, k.name.clone());
        let m = tri!(g.library_module(d, library, ctx, dev));
        let f = tri!(module_function(&mut g, m, &name));
        put(pfunc, f);
        CUDA_SUCCESS
    })
}

#[cfg(test)]
mod tests;
