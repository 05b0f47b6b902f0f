#![allow(dead_code)]
//! CUresult values (cuda.h) and their names / descriptions for cuGetErrorName/String.

pub type CUresult = u32;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_OPERATING_SYSTEM: CUresult = 304;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: CUresult = 903;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// (code, name, description) — names as in cuda.h; NUL-terminated for the C API.
pub static ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (5, "CUDA_ERROR_PROFILER_DISABLED\0", "profiler disabled while using external profiling tool\0"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED\0", "profiler not initialized: call cudaProfilerInitialize()\0"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED\0", "profiler already started\0"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED\0", "profiler already stopped\0"),
    (34, "CUDA_ERROR_STUB_LIBRARY\0", "CUDA driver is a stub library\0"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE\0", "CUDA-capable device(s) is/are busy or unavailable\0"),
    (100, "CUDA_ERROR_NO_DEVICE\0", "no CUDA-capable device is detected\0"),
    (101, "CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED\0", "device doesn't have valid Grid license\0"),
    (200, "CUDA_ERROR_INVALID_IMAGE\0", "device kernel image is invalid\0"),
    (201, "CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT\0", "context already current\0"),
    (205, "CUDA_ERROR_MAP_FAILED\0", "mapping of buffer object failed\0"),
    (206, "CUDA_ERROR_UNMAP_FAILED\0", "unmapping of buffer object failed\0"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED\0", "array is mapped\0"),
    (208, "CUDA_ERROR_ALREADY_MAPPED\0", "resource already mapped\0"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU\0", "no kernel image is available for execution on the device\0"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED\0", "resource already acquired\0"),
    (211, "CUDA_ERROR_NOT_MAPPED\0", "resource not mapped\0"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY\0", "resource not mapped as array\0"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER\0", "resource not mapped as pointer\0"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE\0", "uncorrectable ECC error encountered\0"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT\0", "limit is not supported on this architecture\0"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE\0", "exclusive-thread device already in use by a different thread\0"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED\0", "peer access is not supported between these two devices\0"),
    (218, "CUDA_ERROR_INVALID_PTX\0", "a PTX JIT compilation failed\0"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT\0", "invalid OpenGL or DirectX context\0"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE\0", "uncorrectable NVLink error detected during the execution\0"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND\0", "PTX JIT compiler library not found\0"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION\0", "the provided PTX was compiled with an unsupported toolchain.\0"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED\0", "PTX JIT compilation was disabled\0"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY\0", "the provided execution affinity is not supported\0"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC\0", "the provided PTX contains unsupported call to cudaDeviceSynchronize\0"),
    (300, "CUDA_ERROR_INVALID_SOURCE\0", "device kernel image is invalid\0"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND\0", "file not found\0"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND\0", "shared object symbol not found\0"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED\0", "shared object initialization failed\0"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM\0", "OS call failed or operation not supported on this OS\0"),
    (400, "CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
    (401, "CUDA_ERROR_ILLEGAL_STATE\0", "the operation cannot be performed in the present state\0"),
    (402, "CUDA_ERROR_LOSSY_QUERY\0", "attempted introspection would be semantically lossy\0"),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS\0", "an illegal memory access was encountered\0"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0", "too many resources requested for launch\0"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT\0", "the launch timed out and was terminated\0"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING\0", "launch uses incompatible texturing mode\0"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0", "peer access is already enabled\0"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0", "peer access has not been enabled\0"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE\0", "cannot set while device is active in this process\0"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED\0", "context is destroyed\0"),
    (710, "CUDA_ERROR_ASSERT\0", "device-side assert triggered\0"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS\0", "peer mapping resources exhausted\0"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED\0", "part or all of the requested memory range is already mapped\0"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED\0", "pointer does not correspond to a registered memory region\0"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR\0", "hardware stack error\0"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION\0", "an illegal instruction was encountered\0"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS\0", "misaligned address\0"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE\0", "operation not supported on global/shared address space\0"),
    (718, "CUDA_ERROR_INVALID_PC\0", "invalid program counter\0"),
    (719, "CUDA_ERROR_LAUNCH_FAILED\0", "unspecified launch failure\0"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE\0", "too many blocks in cooperative launch\0"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK\0", "tensor memory not completely freed\0"),
    (800, "CUDA_ERROR_NOT_PERMITTED\0", "operation not permitted\0"),
    (801, "CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY\0", "system not yet initialized\0"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH\0", "system has unsupported display driver / cuda driver combination\0"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE\0", "forward compatibility was attempted on non supported HW\0"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED\0", "MPS client failed to connect to the MPS control daemon or the MPS server\0"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE\0", "the remote procedural call between the MPS server and the MPS client failed\0"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY\0", "MPS server is not ready to accept new MPS client requests\0"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED\0", "the hardware resources required to create MPS client have been exhausted\0"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED\0", "the hardware resources required to support device connections have been exhausted\0"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED\0", "the MPS client has been terminated by the server\0"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED\0", "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not support it\0"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH\0", "unsupported interaction between different versions of CUDA Dynamic Parallelism\0"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0", "operation not permitted when stream is capturing\0"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0", "operation failed due to a previous error during capture\0"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE\0", "operation would result in a merge of separate capture sequences\0"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0", "capture was not ended in the same stream as it began\0"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED\0", "capturing stream has unjoined work\0"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION\0", "dependency created on uncaptured work in another stream\0"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT\0", "operation would make the legacy stream depend on a capturing blocking stream\0"),
    (907, "CUDA_ERROR_CAPTURED_EVENT\0", "operation not permitted on an event last recorded in a capturing stream\0"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD\0", "attempt to terminate a thread-local capture sequence from another thread\0"),
    (909, "CUDA_ERROR_TIMEOUT\0", "wait operation timed out\0"),
    (
        910,
        "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE\0",
        "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update\0",
    ),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE\0", "an async error has occured in external entity outside of CUDA\0"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE\0", "a kernel launch error has occurred due to cluster misconfiguration\0"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED\0", "the function handle is not loaded when calling an API that requires a loaded function\0"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE\0", "one or more resources passed in are not valid resource types for the operation\0"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION\0", "one or more resources are insufficient or non-applicable for the operation\0"),
    (916, "CUDA_ERROR_KEY_ROTATION\0", "an error happened during the key rotation sequence\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];
