//! The process's bookkeeping: handles, contexts and their primary contexts, device and
//! pool allocations, the host pages of managed memory, and arrays' sizes.

use super::records::*;
use super::threads::*;
use crate::errors::*;
use fgpu_sim_state::pool::{round_up, PoolModel};
use fgpu_sim_state::{MigDevice, TimelineContext, TimelineError};
use std::sync::MutexGuard;

impl Driver {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[inline]
    pub fn phys(&self, dev: usize) -> usize {
        self.visible[dev]
    }
    pub fn ndev(&self) -> usize {
        self.visible.len()
    }
    /// The MIG device ordinal `dev` is, if it is one.
    #[inline]
    pub fn mig(&self, dev: usize) -> Option<&MigDevice> {
        self.mig.get(dev).and_then(Option::as_ref)
    }
    /// The timeline ordinal `dev`'s kernels run on: its GPU's, or its compute instance's.
    pub fn timeline_of(&self, dev: usize) -> usize {
        self.mig(dev).map_or(self.phys(dev), MigDevice::timeline)
    }
    /// Memory of ordinal `dev`: its GPU's, or its GPU instance's.
    pub fn total_mem(&self, dev: usize) -> u64 {
        self.mig(dev).map_or_else(|| self.state.device_total(self.phys(dev)), MigDevice::memory)
    }
    /// Free memory of ordinal `dev` as `cuMemGetInfo` reports it.
    pub fn free_mem(&self, dev: usize) -> u64 {
        match self.mig(dev) {
            Some(m) => self.state.gpu_instance_free(m.device, m.gpu_instance.id),
            None => self.state.device_free(self.phys(dev)),
        }
    }
    /// Multiprocessors of ordinal `dev`.
    pub fn multiprocessors(&self, dev: usize) -> u32 {
        self.mig(dev).map_or_else(|| self.state.product().sms(), MigDevice::sms)
    }
    pub fn check_dev(&self, dev: i32) -> Result<usize, CUresult> {
        if dev < 0 || dev as usize >= self.ndev() {
            Err(CUDA_ERROR_INVALID_DEVICE)
        } else {
            Ok(dev as usize)
        }
    }
    #[inline]
    pub fn take(&self, dev: usize, bytes: u64) -> bool {
        bytes == 0 || self.state.try_alloc(self.slot, self.phys(dev), bytes)
    }
    #[inline]
    pub fn give(&self, dev: usize, bytes: u64) {
        self.state.release(self.slot, self.phys(dev), bytes)
    }
}

impl Inner {
    pub fn new_handle(&mut self) -> usize {
        self.next_handle += 0x40;
        self.next_handle as usize
    }

    /// The calling thread's current context and its device. Re-activates a retained
    /// primary context after a reset.
    pub fn current(&mut self, d: &Driver) -> Result<(usize, usize), CUresult> {
        let h = ctx_top();
        if h == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        self.ctx_ready(d, h, CUDA_ERROR_CONTEXT_IS_DESTROYED).map(|dev| (h, dev))
    }

    /// Device of context `h`, making a retained primary context active if it is not.
    pub fn ctx_ready(&mut self, d: &Driver, h: usize, missing: CUresult) -> Result<usize, CUresult> {
        let (dev, primary) = match self.contexts.get(&h) {
            Some(c) => (c.dev, c.primary),
            None => return Err(missing),
        };
        if primary && !self.primary[dev].active {
            if self.primary[dev].refcount == 0 {
                return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
            }
            self.activate_primary(d, dev)?;
        }
        Ok(dev)
    }

    pub fn activate_primary(&mut self, d: &Driver, dev: usize) -> Result<(), CUresult> {
        if !d.take(dev, d.state.context_overhead()) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        d.state.count_context(d.slot, d.phys(dev), true);
        self.primary[dev].active = true;
        Ok(())
    }

    pub fn primary_handle(&mut self, dev: usize) -> usize {
        if self.primary[dev].handle == 0 {
            let h = self.new_handle();
            self.primary[dev].handle = h;
            self.contexts.insert(h, Ctx { dev, flags: 0, primary: true });
        }
        self.primary[dev].handle
    }

    /// Frees everything that belongs to context `h` (allocations, arrays, streams,
    /// events) and its own device memory.
    pub fn teardown_ctx(&mut self, d: &Driver, h: usize, dev: usize) {
        let victims: Vec<u64> = self.allocs.iter().filter(|(_, a)| a.ctx == h && !matches!(a.kind, Kind::Pool(_))).map(|(&p, _)| p).collect();
        for p in victims {
            self.free_alloc(d, p);
        }
        let arrays: Vec<usize> = self.arrays.iter().filter(|(_, a)| a.ctx == h).map(|(&k, _)| k).collect();
        for k in arrays {
            if let Some(a) = self.arrays.remove(&k) {
                d.give(a.dev, a.bytes);
            }
        }
        let modules: Vec<usize> = self.modules.iter().filter(|(_, m)| m.ctx == h).map(|(&k, _)| k).collect();
        for k in modules {
            self.unload_module(d, k);
        }
        self.streams.retain(|_, c| *c != h);
        self.events.retain(|_, e| e.ctx != h);
        self.stream_seq.retain(|k, _| k.0 != h);
        if let Some(tl) = self.timelines.remove(&h) {
            // The caller waited for the context's work (without holding this lock).
            d.state.timeline_close(tl);
        }
        d.give(dev, d.state.context_overhead());
        d.state.count_context(d.slot, d.phys(dev), false);
    }

    /// Unloads module `m`: its functions go, its memory is given back.
    pub fn unload_module(&mut self, d: &Driver, m: usize) -> bool {
        let Some(rec) = self.modules.remove(&m) else { return false };
        self.functions.retain(|_, f| f.module != m);
        if let Some(lib) = self.libraries.get_mut(&rec.library) {
            lib.loaded.retain(|_, &mut module| module != m);
        }
        d.give(rec.dev, rec.bytes);
        true
    }

    /// The context's record on its device's timeline, opened at its first work.
    pub fn timeline(&mut self, d: &Driver, ctx: usize, dev: usize) -> Result<TimelineContext, CUresult> {
        if let Some(tl) = self.timelines.get(&ctx) {
            return Ok(*tl);
        }
        let tl = d.state.timeline_open(d.timeline_of(dev), d.slot, ctx as u64).map_err(|e| match e {
            TimelineError::Full => CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            TimelineError::Gone => CUDA_ERROR_UNKNOWN,
        })?;
        self.timelines.insert(ctx, tl);
        Ok(tl)
    }

    /// Device allocation of `size` accounted bytes (and `va_size` of address space).
    pub fn alloc_device(&mut self, d: &Driver, dev: usize, ctx: usize, size: u64, va_size: u64, kind: Kind, low: bool) -> Result<u64, CUresult> {
        if !d.take(dev, size) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let va_size = round_up(va_size.max(1), 512);
        let align = if va_size >= GRANULARITY { GRANULARITY } else { 512 };
        let ptr = if kind == Kind::Managed {
            map_host(va_size)
        } else if low {
            self.va32.alloc(va_size, align)
        } else {
            self.va.alloc(va_size, align)
        };
        let Some(ptr) = ptr else {
            d.give(dev, size);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.allocs.insert(ptr, Alloc { size, va_size, dev, ctx, kind, low });
        Ok(ptr)
    }

    /// Frees allocation `ptr` (must be a key of `allocs`), wherever its memory goes.
    pub fn free_alloc(&mut self, d: &Driver, ptr: u64) -> Option<Alloc> {
        let a = self.allocs.remove(&ptr)?;
        match a.kind {
            Kind::Managed => unmap_host(ptr, a.va_size),
            _ if a.low => self.va32.free(ptr, a.va_size),
            _ => self.va.free(ptr, a.va_size),
        }
        match a.kind {
            Kind::Device | Kind::Managed => d.give(a.dev, a.size),
            Kind::Pool(ph) => {
                let mut drop_pool = false;
                if let Some(p) = self.pools.get_mut(&ph) {
                    p.model.free(a.size);
                    p.outstanding = p.outstanding.saturating_sub(1);
                    if p.destroyed && p.outstanding == 0 {
                        let r = p.model.destroy();
                        d.give(p.dev, r);
                        drop_pool = true;
                    }
                }
                if drop_pool {
                    self.pools.remove(&ph);
                }
            }
        }
        Some(a)
    }

    /// The allocation or VMM mapping containing `[ptr, ptr+len)`: (base, size, host-backed).
    pub fn find_range(&self, ptr: u64, len: u64) -> Option<(u64, u64, bool)> {
        if let Some((&b, a)) = self.allocs.range(..=ptr).next_back() {
            if ptr.checked_add(len)? <= b + a.size.max(1) && ptr >= b {
                return Some((b, a.size, a.kind == Kind::Managed));
            }
        }
        if let Some((&b, &(size, _))) = self.mappings.range(..=ptr).next_back() {
            if ptr.checked_add(len)? <= b + size {
                return Some((b, size, false));
            }
        }
        None
    }

    pub fn default_pool(&mut self, dev: usize) -> usize {
        if self.default_pool[dev] == 0 {
            let h = self.new_handle();
            self.pools.insert(h, PoolRec { dev, model: PoolModel::new(), reuse: [1, 1, 1], max_size: 0, destroyed: false, outstanding: 0 });
            self.default_pool[dev] = h;
            if self.current_pool[dev] == 0 {
                self.current_pool[dev] = h;
            }
        }
        self.default_pool[dev]
    }

    pub fn current_pool(&mut self, dev: usize) -> usize {
        let dp = self.default_pool(dev);
        if self.current_pool[dev] == 0 {
            self.current_pool[dev] = dp;
        }
        self.current_pool[dev]
    }

    pub fn pool_alloc(&mut self, d: &Driver, ph: usize, ctx: usize, size: u64) -> Result<u64, CUresult> {
        let (dev, grow) = {
            let p = self.pools.get(&ph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if p.destroyed {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let grow = p.model.grow_needed(size);
            if p.max_size != 0 && p.model.reserved + grow > p.max_size {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            (p.dev, grow)
        };
        if !d.take(dev, grow) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let va_size = round_up(size, 512);
        let align = if va_size >= GRANULARITY { GRANULARITY } else { 512 };
        let Some(ptr) = self.va.alloc(va_size, align) else {
            d.give(dev, grow);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        if let Some(p) = self.pools.get_mut(&ph) {
            p.model.commit_alloc(size, grow);
            p.outstanding += 1;
        }
        self.allocs.insert(ptr, Alloc { size, va_size, dev, ctx, kind: Kind::Pool(ph), low: false });
        Ok(ptr)
    }

    /// A synchronisation point: every pool gives back what is above its threshold.
    pub fn sync_pools(&mut self, d: &Driver) {
        for p in self.pools.values_mut() {
            let r = p.model.sync();
            if r > 0 {
                d.give(p.dev, r);
            }
        }
    }
}

/// Host pages for managed memory (accessible from the CPU, like real managed memory).
fn map_host(len: u64) -> Option<u64> {
    // SAFETY: fresh anonymous private mapping; the kernel picks the address.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        Some(p as u64)
    }
}

pub fn unmap_host(ptr: u64, len: u64) {
    // SAFETY: (ptr, len) is a mapping made by map_host and removed from every table.
    unsafe { libc::munmap(ptr as *mut libc::c_void, len as usize) };
}

/// Array bytes: width x height x depth x channels x element size, each dimension at least
/// 1, summed over mip levels, rounded up to the 2 MiB granularity.
pub fn array_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u32, levels: u32) -> Option<u64> {
    let elem: u64 = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0 => return None,
        _ => 4,
    };
    if !matches!(channels, 1 | 2 | 4) || width == 0 {
        return None;
    }
    let (mut w, mut h, mut dd) = (width, height.max(1), depth.max(1));
    let mut total: u64 = 0;
    for _ in 0..levels.max(1) {
        let b = w.checked_mul(h)?.checked_mul(dd)?.checked_mul(elem * channels as u64)?;
        total = total.checked_add(b)?;
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        dd = (dd / 2).max(1);
    }
    Some(round_up(total, GRANULARITY))
}
