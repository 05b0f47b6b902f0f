//! Graph memory (`records/graph_book.rs`): at instantiation the graph's allocation nodes
//! are read; before a launch or upload what each device's graph pool may have to grow by
//! is reserved, so a graph that would pass the cap is refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` before the driver is asked; after it, and after trims,
//! graph-exec destruction and synchronisation, the pools settle to what they reserve. A
//! graph fgpu did not see instantiated (or whose nodes it cannot read) is counted after the
//! fact: its launch is not refused, its memory is counted once the call returns, and a
//! warning says so if that passes the cap. No lock is held across a launch or upload.

use super::active::Active;
use super::records::graph_book::graph_needs;
use crate::abi::cuda::*;

impl Active {
    /// Runs a call that makes the driver take graph memory for `needs` (an upload or
    /// launch); with `needs` unknown the current device is settled after the call.
    fn taking_graph_memory(&self, call: &str, needs: Option<&[(CUdevice, u64)]>, real: impl FnOnce() -> CUresult) -> CUresult {
        self.untracked.settling(|| {
            let Some(needs) = needs else {
                let rc = real();
                if let Ok(dev) = self.account.current_device() {
                    self.graphs.settle_device(self.account, dev.ordinal, call);
                }
                return rc;
            };
            let taken = match self.graphs.begin(self.account, needs, call, |dev, growth| self.count_ahead(dev, growth, call)) {
                Ok(taken) => taken,
                Err(rc) => return rc,
            };
            fgpu_core::crash_point!("graph.reserved");
            let rc = real();
            fgpu_core::crash_point!("graph.launched");
            self.graphs.finish(self.account, taken, call);
            rc
        })
    }

    /// A launch or upload of `exec` through `real`.
    pub fn graph_launch(&self, call: &str, exec: CUgraphExec, real: impl FnOnce() -> CUresult) -> CUresult {
        let needs = self.graphs.needs_of(exec);
        if matches!(&needs, Some(needs) if needs.is_empty()) {
            return real(); // no memory nodes
        }
        self.taking_graph_memory(call, needs.as_deref(), real)
    }

    /// An instantiation of `graph` through `real`: what the new exec (`exec`, which reads
    /// what the driver wrote) needs is remembered; with `upload` (the
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` of `cuGraphInstantiateWithParams`) the memory is
    /// taken now, as a launch takes it.
    pub fn graph_instantiate(
        &self,
        call: &str,
        graph: CUgraph,
        upload: bool,
        real: impl FnOnce() -> CUresult,
        exec: impl FnOnce() -> Option<usize>,
    ) -> CUresult {
        let needs = graph_needs(graph);
        let rc = if upload && needs.as_ref().is_some_and(|n| !n.is_empty()) { self.taking_graph_memory(call, needs.as_deref(), real) } else { real() };
        if rc == CUDA_SUCCESS {
            if let Some(exec) = exec() {
                self.graphs.instantiated(exec, needs);
            }
        }
        rc
    }

    /// After `cuDeviceGraphMemTrim` of `device`.
    pub fn graph_trimmed(&self, device: CUdevice) {
        self.graphs.settle_device(self.account, device, "cuDeviceGraphMemTrim");
    }

    /// After `cuGraphExecDestroy` of `exec` answered `rc`.
    pub fn graph_exec_destroyed(&self, exec: CUgraphExec, rc: CUresult) {
        if rc == CUDA_SUCCESS {
            self.graphs.exec_destroyed(exec);
        }
        self.graphs.refresh(self.account);
    }
}
