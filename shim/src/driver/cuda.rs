//! [`CudaDriver`] on the real driver: each method one or two calls of `raw.rs` with
//! pointers to its own locals, never a caller's.

use super::raw;
use super::seam::{Capture, CudaDriver, EventState, Real};
use crate::abi::cuda::*;
use fgpu_core::uuid::DeviceUuid;
use std::ffi::{c_float, c_int, c_uint, c_void};
use std::ptr::null_mut;

impl CudaDriver for Real {
    fn device_uuid(&self, ordinal: CUdevice) -> Result<DeviceUuid, CUresult> {
        let (mut v2, mut v1) = (CUuuid::default(), CUuuid::default());
        // SAFETY: a live CUuuid local for the driver to write and a plain ordinal.
        let rc2 = unsafe { raw::cuDeviceGetUuid_v2(&mut v2, ordinal) };
        // SAFETY: as above.
        let rc1 = unsafe { raw::cuDeviceGetUuid(&mut v1, ordinal) };
        match (rc2, rc1) {
            // cuda.h: `_v2` gives a MIG device's own UUID; the first version, older than
            // MIG UUIDs, gives its GPU's. Where they differ the device is a MIG device.
            (Some(CUDA_SUCCESS), Some(CUDA_SUCCESS)) if v1.bytes != v2.bytes => Ok(DeviceUuid::mig(v2.bytes)),
            (Some(CUDA_SUCCESS), _) => Ok(DeviceUuid::gpu(v2.bytes)),
            (None, Some(CUDA_SUCCESS)) => Ok(DeviceUuid::gpu(v1.bytes)),
            (Some(rc), _) | (None, Some(rc)) => Err(rc),
            (None, None) => Err(CUDA_ERROR_NOT_FOUND),
        }
    }

    fn device_total_mem(&self, ordinal: CUdevice) -> Result<u64, CUresult> {
        let mut total: usize = 0;
        // SAFETY: a live size_t local for the driver to write.
        let rc = unsafe { raw::cuDeviceTotalMem_v2(&mut total, ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
        if rc == CUDA_SUCCESS {
            Ok(total as u64)
        } else {
            Err(rc)
        }
    }

    fn context_device(&self) -> Result<CUdevice, CUresult> {
        let mut ordinal: CUdevice = 0;
        // SAFETY: a live CUdevice local for the driver to write.
        let rc = unsafe { raw::cuCtxGetDevice(&mut ordinal) }.unwrap_or(CUDA_ERROR_NOT_FOUND);
        if rc == CUDA_SUCCESS {
            Ok(ordinal)
        } else {
            Err(rc)
        }
    }

    fn current_context(&self) -> Option<CUcontext> {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: a live CUcontext local for the driver to write.
        let rc = unsafe { raw::cuCtxGetCurrent(&mut ctx) }?;
        (rc == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
    }

    fn primary_context_active(&self, ordinal: CUdevice) -> Option<bool> {
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: live locals of the C types for the driver to write.
        let rc = unsafe { raw::cuDevicePrimaryCtxGetState(ordinal, &mut flags, &mut active) }?;
        (rc == CUDA_SUCCESS).then_some(active != 0)
    }

    fn device_mem_pool(&self, ordinal: CUdevice) -> Option<CUmemoryPool> {
        let mut pool: CUmemoryPool = null_mut();
        // SAFETY: a live CUmemoryPool local for the driver to write.
        let rc = unsafe { raw::cuDeviceGetMemPool(&mut pool, ordinal) }?;
        (rc == CUDA_SUCCESS && !pool.is_null()).then_some(pool)
    }

    fn mem_pool_attribute(&self, pool: CUmemoryPool, attribute: u32) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: the attributes asked for are 64-bit (cuuint64_t); `value` is a live u64.
        let rc = unsafe { raw::cuMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast()) }?;
        (rc == CUDA_SUCCESS).then_some(value)
    }

    fn graph_mem_attribute(&self, ordinal: CUdevice, attribute: u32) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: the attributes asked for are 64-bit (cuuint64_t); `value` is a live u64.
        let rc = unsafe { raw::cuDeviceGetGraphMemAttribute(ordinal, attribute, (&mut value as *mut u64).cast()) }?;
        (rc == CUDA_SUCCESS).then_some(value)
    }

    fn graph_nodes(&self, graph: CUgraph) -> Option<Vec<CUgraphNode>> {
        let mut count: usize = 0;
        // SAFETY: a NULL array asks for the count only, written to the live `count`.
        let rc = unsafe { raw::cuGraphGetNodes(graph, null_mut(), &mut count) }?;
        if rc != CUDA_SUCCESS {
            return None;
        }
        let mut nodes: Vec<CUgraphNode> = vec![null_mut(); count];
        // SAFETY: `nodes` holds `count` entries, the capacity the driver is told.
        let rc = unsafe { raw::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }?;
        if rc != CUDA_SUCCESS {
            return None;
        }
        nodes.truncate(count);
        Some(nodes)
    }

    fn graph_node_type(&self, node: CUgraphNode) -> Option<u32> {
        let mut kind: u32 = 0;
        // SAFETY: a live CUgraphNodeType (an enum: unsigned int) local for the driver to write.
        let rc = unsafe { raw::cuGraphNodeGetType(node, &mut kind) }?;
        (rc == CUDA_SUCCESS).then_some(kind)
    }

    fn mem_alloc_node_params(&self, node: CUgraphNode) -> Option<Result<CudaMemAllocNodeParams, CUresult>> {
        let mut params = CudaMemAllocNodeParams::default();
        // SAFETY: a live CUDA_MEM_ALLOC_NODE_PARAMS local for the driver to write.
        let rc = unsafe { raw::cuGraphMemAllocNodeGetParams(node, &mut params) }?;
        Some(if rc == CUDA_SUCCESS { Ok(params) } else { Err(rc) })
    }

    fn array_size(&self, array: *mut c_void, mipmapped: bool, ordinal: CUdevice) -> Option<u64> {
        let mut req = CudaArrayMemoryRequirements::default();
        let rc = if mipmapped {
            // SAFETY: a live CUDA_ARRAY_MEMORY_REQUIREMENTS local for the driver to write.
            unsafe { raw::cuMipmappedArrayGetMemoryRequirements(&mut req, array, ordinal) }?
        } else {
            // SAFETY: as above.
            unsafe { raw::cuArrayGetMemoryRequirements(&mut req, array, ordinal) }?
        };
        (rc == CUDA_SUCCESS && req.size > 0).then_some(req.size as u64)
    }

    fn event_create(&self) -> Option<CUevent> {
        let mut event: CUevent = null_mut();
        // SAFETY: a live CUevent local for the driver to write.
        let rc = unsafe { raw::cuEventCreate(&mut event, CU_EVENT_DEFAULT) }?;
        (rc == CUDA_SUCCESS && !event.is_null()).then_some(event)
    }

    fn event_record(&self, event: CUevent, stream: CUstream, ptsz: bool) -> bool {
        let rc = if ptsz {
            // SAFETY: an event of ours and the program's stream, both handles.
            unsafe { raw::cuEventRecord_ptsz(event, stream) }
        } else {
            // SAFETY: as above.
            unsafe { raw::cuEventRecord(event, stream) }
        };
        rc == Some(CUDA_SUCCESS)
    }

    fn event_query(&self, event: CUevent) -> EventState {
        // SAFETY: an event handle of ours.
        match unsafe { raw::cuEventQuery(event) } {
            Some(CUDA_SUCCESS) => EventState::Done,
            Some(CUDA_ERROR_NOT_READY) => EventState::Pending,
            _ => EventState::Failed,
        }
    }

    fn event_elapsed_ns(&self, start: CUevent, end: CUevent) -> Option<u64> {
        let mut ms: c_float = 0.0;
        // SAFETY: a live float local for the driver to write, and two event handles of ours.
        let rc = unsafe { raw::cuEventElapsedTime_v2(&mut ms, start, end) }
            // SAFETY: as above.
            .or_else(|| unsafe { raw::cuEventElapsedTime(&mut ms, start, end) })?;
        (rc == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0).then_some((ms as f64 * 1e6) as u64)
    }

    fn event_destroy(&self, event: CUevent) {
        // SAFETY: an event handle of ours, destroyed once.
        if unsafe { raw::cuEventDestroy_v2(event) }.is_none() {
            // SAFETY: as above.
            let _ = unsafe { raw::cuEventDestroy(event) };
        }
    }

    fn stream_capturing(&self, stream: CUstream, ptsz: bool) -> Capture {
        let mut status: u32 = CU_STREAM_CAPTURE_STATUS_NONE;
        let rc = if ptsz {
            // SAFETY: the program's stream handle and a live CUstreamCaptureStatus local.
            unsafe { raw::cuStreamIsCapturing_ptsz(stream, &mut status) }
        } else {
            // SAFETY: as above.
            unsafe { raw::cuStreamIsCapturing(stream, &mut status) }
        };
        match rc {
            Some(CUDA_SUCCESS) if status == CU_STREAM_CAPTURE_STATUS_NONE => Capture::No,
            Some(CUDA_SUCCESS) => Capture::Yes,
            // A driver without the call has no stream capture either.
            None => Capture::No,
            Some(_) => Capture::Unknown,
        }
    }

    fn exchange_capture_mode(&self, mode: u32) -> Option<u32> {
        let mut mode = mode;
        // SAFETY: a live CUstreamCaptureMode local, read and written by the driver.
        (unsafe { raw::cuThreadExchangeStreamCaptureMode(&mut mode) } == Some(CUDA_SUCCESS)).then_some(mode)
    }
}
