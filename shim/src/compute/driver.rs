//! The driver calls the compute limiter makes itself: its events (markers on the process's
//! own streams), the current context, capture state, and NVML's per-process utilisation.
//! Each wraps one real driver function (never a hook) and says which C call it models.

use crate::abi::cuda::*;
use crate::abi::nvml::*;
use fgpu_core::compute::Sample;
use std::ffi::{c_float, c_uint};
use std::ptr::null_mut;

/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`: the calling thread's context (null: none).
pub fn current_context() -> Option<CUcontext> {
    let mut ctx: CUcontext = null_mut();
    let rc = crate::call_real!(cuCtxGetCurrent: fn(*mut CUcontext) -> CUresult, &mut ctx)?;
    (rc == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

/// `CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)` in the current context.
pub fn event_create() -> Option<CUevent> {
    let mut event: CUevent = null_mut();
    let rc = crate::call_real!(cuEventCreate: fn(*mut CUevent, c_uint) -> CUresult, &mut event, CU_EVENT_DEFAULT)?;
    (rc == CUDA_SUCCESS && !event.is_null()).then_some(event)
}

/// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)`, or its `_ptsz` form when the
/// launch it follows was a per-thread-stream call (stream 0 is then the thread's own).
pub fn event_record(event: CUevent, stream: CUstream, ptsz: bool) -> bool {
    let rc = if ptsz {
        crate::call_real!(cuEventRecord_ptsz: fn(CUevent, CUstream) -> CUresult, event, stream)
    } else {
        crate::call_real!(cuEventRecord: fn(CUevent, CUstream) -> CUresult, event, stream)
    };
    rc == Some(CUDA_SUCCESS)
}

/// What `cuEventQuery(CUevent)` says of a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    Done,
    Pending,
    /// Any other answer: the marker cannot tell any more.
    Failed,
}

/// `CUresult cuEventQuery(CUevent hEvent)`.
pub fn event_query(event: CUevent) -> Query {
    match crate::call_real!(cuEventQuery: fn(CUevent) -> CUresult, event) {
        Some(CUDA_SUCCESS) => Query::Done,
        Some(CUDA_ERROR_NOT_READY) => Query::Pending,
        _ => Query::Failed,
    }
}

/// Nanoseconds between two completed markers: `cuEventElapsedTime_v2` (CUDA 12.8+) or
/// `cuEventElapsedTime` (`CUresult (float *pMilliseconds, CUevent hStart, CUevent hEnd)`).
pub fn elapsed_ns(start: CUevent, end: CUevent) -> Option<u64> {
    let mut ms: c_float = 0.0;
    let rc = crate::call_real!(cuEventElapsedTime_v2: fn(*mut c_float, CUevent, CUevent) -> CUresult, &mut ms, start, end)
        .or_else(|| crate::call_real!(cuEventElapsedTime: fn(*mut c_float, CUevent, CUevent) -> CUresult, &mut ms, start, end))?;
    (rc == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0).then_some((ms as f64 * 1e6) as u64)
}

/// `CUresult cuEventDestroy_v2(CUevent hEvent)` (returns at once even if the event is still
/// pending; the driver frees it when it completes).
pub fn event_destroy(event: CUevent) {
    if crate::call_real!(cuEventDestroy_v2: fn(CUevent) -> CUresult, event).is_none() {
        let _ = crate::call_real!(cuEventDestroy: fn(CUevent) -> CUresult, event);
    }
}

/// What `cuStreamIsCapturing` says of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Work sent to the stream runs.
    No,
    /// Work sent to the stream goes into a graph being captured (it does not run now).
    Yes,
    /// The driver answered an error: whether the stream is being captured is unknown.
    Unknown,
}

/// `CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)`
/// (or `_ptsz`): whether work sent to the stream now goes into a graph being captured.
pub fn stream_capturing(stream: CUstream, ptsz: bool) -> Capture {
    let mut status: u32 = CU_STREAM_CAPTURE_STATUS_NONE;
    let rc = if ptsz {
        crate::call_real!(cuStreamIsCapturing_ptsz: fn(CUstream, *mut u32) -> CUresult, stream, &mut status)
    } else {
        crate::call_real!(cuStreamIsCapturing: fn(CUstream, *mut u32) -> CUresult, stream, &mut status)
    };
    match rc {
        Some(CUDA_SUCCESS) if status == CU_STREAM_CAPTURE_STATUS_NONE => Capture::No,
        Some(CUDA_SUCCESS) => Capture::Yes,
        // A driver without the call has no stream capture either.
        None => Capture::No,
        Some(_) => Capture::Unknown,
    }
}

/// Runs `f` with the calling thread's stream-capture interaction mode set to relaxed
/// (`CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)`, pushed and
/// popped), so that fgpu's own event calls never invalidate a capture the program has
/// under way in this or another thread (CUDA forbids "potentially unsafe" calls during a
/// capture in the default global mode).
pub fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let mut mode: u32 = CU_STREAM_CAPTURE_MODE_RELAXED;
    let swapped = exchange_capture_mode(&mut mode);
    let out = f();
    if swapped {
        exchange_capture_mode(&mut mode);
    }
    out
}

/// `CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)`.
fn exchange_capture_mode(mode: &mut u32) -> bool {
    crate::call_real!(cuThreadExchangeStreamCaptureMode: fn(*mut u32) -> CUresult, mode) == Some(CUDA_SUCCESS)
}

/// Sets the calling thread's stream-capture interaction mode to relaxed for good (the
/// sampler's own thread, which runs nothing of the program's).
pub fn relax_this_thread() {
    exchange_capture_mode(&mut CU_STREAM_CAPTURE_MODE_RELAXED.clone());
}

/// Why NVML's per-process samples cannot be had for a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplesError {
    /// The driver does not give them (`NVML_ERROR_NOT_SUPPORTED`, no NVML, no such call).
    Unavailable(NvmlReturn),
    /// This call failed; the next may work.
    Transient(NvmlReturn),
}

/// The per-process samples newer than `last_seen_us`:
/// `nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
/// nvmlProcessUtilizationSample_t *utilization, unsigned int *processSamplesCount,
/// unsigned long long lastSeenTimeStamp)`, a size query first. `NVML_ERROR_NOT_FOUND` (no
/// sample newer than that) is an empty answer.
pub fn process_samples(device: NvmlDevice, last_seen_us: u64) -> Result<Vec<Sample>, SamplesError> {
    let call = |buffer: *mut NvmlProcessUtilizationSample, count: &mut c_uint| {
        crate::call_real!(nvmlDeviceGetProcessUtilization, device, buffer, count, last_seen_us)
            .ok_or(SamplesError::Unavailable(NVML_ERROR_FUNCTION_NOT_FOUND))
    };
    let mut count: c_uint = 0;
    for _ in 0..4 {
        let mut buffer = vec![NvmlProcessUtilizationSample::default(); count as usize];
        let pointer = if buffer.is_empty() { null_mut() } else { buffer.as_mut_ptr() };
        match call(pointer, &mut count)? {
            NVML_SUCCESS if !pointer.is_null() || count == 0 => {
                buffer.truncate((count as usize).min(buffer.len()));
                return Ok(buffer.iter().map(|s| Sample { pid: s.pid, timestamp_us: s.time_stamp, sm_util: s.sm_util }).collect());
            }
            NVML_ERROR_NOT_FOUND => return Ok(Vec::new()),
            NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => count = count.saturating_mul(2).max(count + 8),
            rc @ (NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND | NVML_ERROR_NO_PERMISSION) => return Err(SamplesError::Unavailable(rc)),
            rc => return Err(SamplesError::Transient(rc)),
        }
    }
    Err(SamplesError::Transient(NVML_ERROR_INSUFFICIENT_SIZE))
}
