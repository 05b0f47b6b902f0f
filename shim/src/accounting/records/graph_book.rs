//! CUDA graph memory: the physical memory behind graph memory nodes
//! (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured into a graph), which the driver
//! takes when a graph is uploaded or launched, from a per-device graph pool that keeps it
//! until `cuDeviceGraphMemTrim`. The book counts each device's graph pool as what it
//! reserves (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`), and remembers what each
//! instantiated graph's allocation nodes need. Overlapping launches are counted as
//! `counted_pool.rs` says.

use super::counted_pool::{CountedPool, InFlight};
use crate::abi::cuda::*;
use crate::driver::instance::driver;
use crate::driver::seam::CudaDriver;
use crate::process::account::Account;
use crate::process::devices::Dev;
use fgpu_core::limit::format_bytes;
use fgpu_core::log::{self, Level, RateLimit};
use fgpu_core::log_at;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

const GRAPH_GRANULE: u64 = 2 << 20;

/// What a graph's allocation nodes take: (device, bytes in pool granules) per device.
pub type Needs = Vec<(CUdevice, u64)>;

#[derive(Default)]
pub struct GraphBook {
    inner: Mutex<Book>,
    /// Whether graph memory was ever counted (synchronisations skip the re-read until then).
    any: AtomicBool,
}

#[derive(Default)]
struct Book {
    /// Device -> what is counted for its graph pool.
    counted: HashMap<CUdevice, CountedPool>,
    /// Instantiated graph -> what its allocation nodes need, per device.
    execs: HashMap<usize, Needs>,
}

/// The memory a graph's allocation nodes take, per device, in pool granules. `None` when
/// the driver cannot tell, or when the graph holds child graphs or conditional bodies
/// (whose nodes are not read): the graph is then counted after the fact.
pub fn graph_needs(graph: CUgraph) -> Option<Needs> {
    let nodes = driver().graph_nodes(graph)?;
    let mut needs: Needs = Vec::new();
    for node in nodes {
        let kind = driver().graph_node_type(node)?;
        if kind == CU_GRAPH_NODE_TYPE_GRAPH || kind == CU_GRAPH_NODE_TYPE_CONDITIONAL {
            return None;
        }
        if kind != CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        let Ok(params) = driver().mem_alloc_node_params(node)? else { continue };
        if params.pool_props.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            continue;
        }
        let bytes = (params.bytesize as u64).next_multiple_of(GRAPH_GRANULE);
        match needs.iter_mut().find(|(d, _)| *d == params.pool_props.location_id) {
            Some((_, total)) => *total += bytes,
            None => needs.push((params.pool_props.location_id, bytes)),
        }
    }
    Some(needs)
}

impl GraphBook {
    /// Brings the count of `ordinal`'s graph pool to what the driver reserves for it, once
    /// `done` (the part of a call that just ran, or nothing) has finished.
    fn settle(&self, account: &Account, book: &mut Book, ordinal: CUdevice, done: InFlight, call: &str) {
        let Some(dev) = account.known_device(ordinal) else { return };
        let counted = book.counted.entry(ordinal).or_insert_with(|| CountedPool::new(ordinal));
        let (before, after) = counted.finish(done, driver().graph_mem_attribute(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
        account.settle(dev, before, after);
        if after > 0 {
            self.any.store(true, Ordering::Release);
        }
        let held = account.container_used(dev);
        if after > before && held > dev.limit {
            static LIMIT: RateLimit = RateLimit::new(1_000_000_000);
            if LIMIT.check(log::monotonic_ns()).is_some() {
                log_at!(
                    Level::Warn,
                    "{call} took {} of graph memory on {} that fgpu could not reserve beforehand: the container now holds {} of its {} cap; allocations are refused until graph memory is trimmed (cuDeviceGraphMemTrim)",
                    format_bytes(after - before),
                    dev.uuid,
                    format_bytes(held),
                    format_bytes(dev.limit)
                );
            }
        }
    }

    /// Settles `ordinal`'s graph pool after a call that may have changed it (`call` names
    /// it in the warning when it passed the cap).
    pub fn settle_device(&self, account: &Account, ordinal: CUdevice, call: &str) {
        self.settle(account, &mut self.inner.lock(), ordinal, InFlight::default(), call);
    }

    /// Re-reads the graph pool of every device this process has counted graph memory on.
    pub fn refresh(&self, account: &Account) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut book = self.inner.lock();
        let ordinals: Vec<CUdevice> = book.counted.keys().copied().collect();
        for ordinal in ordinals {
            self.settle(account, &mut book, ordinal, InFlight::default(), "synchronisation");
        }
    }

    /// Before a call that makes the driver take graph memory for `needs`: reserves (through
    /// `reserve`) the growth of each device's graph pool and records it in flight. On a
    /// refusal what was reserved for the other devices is settled back, and the refusal
    /// returned.
    pub fn begin(
        &self,
        account: &Account,
        needs: &[(CUdevice, u64)],
        call: &str,
        mut reserve: impl FnMut(&Dev, u64) -> Result<(), CUresult>,
    ) -> Result<Vec<(CUdevice, InFlight)>, CUresult> {
        let mut taken: Vec<(CUdevice, InFlight)> = Vec::with_capacity(needs.len());
        let mut book = self.inner.lock();
        for &(ordinal, bytes) in needs {
            let Ok(dev) = account.device(ordinal) else { continue };
            let reserved = driver().graph_mem_attribute(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
            let used = driver().graph_mem_attribute(ordinal, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT).unwrap_or(0);
            let counted = book.counted.entry(ordinal).or_insert_with(|| CountedPool::new(ordinal));
            // A graph pool keeps its memory until trimmed.
            let growth = counted.growth_for(bytes, reserved, used, u64::MAX, GRAPH_GRANULE);
            if growth > 0 {
                if let Err(rc) = reserve(dev, growth) {
                    for (ordinal, in_flight) in taken {
                        self.settle(account, &mut book, ordinal, in_flight, call);
                    }
                    return Err(rc);
                }
            }
            let in_flight = book.counted.get_mut(&ordinal).expect("inserted above").begin(growth, bytes);
            taken.push((ordinal, in_flight));
        }
        Ok(taken)
    }

    /// After the call: every pool it took from settles to what the driver reserves now.
    pub fn finish(&self, account: &Account, taken: Vec<(CUdevice, InFlight)>, call: &str) {
        let mut book = self.inner.lock();
        for (ordinal, in_flight) in taken {
            self.settle(account, &mut book, ordinal, in_flight, call);
        }
    }

    /// What an instantiated graph needs, if it was seen instantiated.
    pub fn needs_of(&self, exec: CUgraphExec) -> Option<Needs> {
        self.inner.lock().execs.get(&(exec as usize)).cloned()
    }

    /// A graph instantiated as `exec`: what it needs, or `None` when that cannot be told.
    pub fn instantiated(&self, exec: usize, needs: Option<Needs>) {
        let mut book = self.inner.lock();
        match needs {
            Some(needs) => book.execs.insert(exec, needs),
            None => book.execs.remove(&exec),
        };
    }

    /// `cuGraphExecDestroy` succeeded.
    pub fn exec_destroyed(&self, exec: CUgraphExec) {
        self.inner.lock().execs.remove(&(exec as usize));
    }
}
