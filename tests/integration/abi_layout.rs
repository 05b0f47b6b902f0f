//! The C types and constants of the `fgpu-abi` crate (`abi/src/`) against NVIDIA's `cuda.h` and
//! `nvml.h`: every field's offset, size and alignment, every struct's size and alignment,
//! and the value of every constant, as a C compiler reads the pinned headers
//! (tests/abi/requirements.txt). The mechanism is in tests/support/c_layout.rs.
//!
//! The prototypes too: every driver function the shim calls is declared once, in
//! `abi/src/prototypes.rs`, and each one's return value and parameters are checked
//! against the function as the headers declare it: size, alignment, signedness, pointer
//! level, and what the pointers point to (`Prototype`).
//!
//! The shim and this test use the same crate: what is checked here is what the shim is
//! built with.

use fgpu_tests::c_layout::{
    CShape, Checks, Header,
    Header::{Cuda, Nvml},
    Prototype,
};
use fgpu_tests::{c_struct, c_value};

use fgpu_abi::{cuda, nvml};

/// The header whose `nvmlProcessInfo_t` was the 32-byte layout (drivers 535.43 to 535.86).
const NVML_12_2: &str = "nvidia-nvml-dev-cu12==12.2.81";

/// `fgpu_abi::prototypes!`'s list as [`Prototype`]s, each typed as the shim types it.
macro_rules! as_prototypes {
    ($( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => {
        vec![$(
            Prototype {
                header: header(stringify!($lib)),
                name: stringify!($name),
                ret: <$ret as CShape>::shape(),
                params: vec![$((stringify!($arg), <$ty as CShape>::shape())),*],
                differs_in: Vec::new(),
            },
        )*]
    };
}

fn header(lib: &str) -> Header {
    if lib == "Cuda" {
        Cuda
    } else {
        Nvml
    }
}

/// Every prototype the crate declares: the shim's list and the tools'.
fn abi_prototypes() -> Vec<Prototype> {
    #[allow(unused_imports)]
    use cuda::*;
    #[allow(unused_imports)]
    use nvml::*;
    #[allow(unused_imports)]
    use std::ffi::{c_char, c_float, c_int, c_uint, c_void};
    let mut list: Vec<Prototype> = fgpu_abi::prototypes!(as_prototypes);
    list.extend(fgpu_abi::tool_prototypes!(as_prototypes));
    list.into_iter()
        .map(|p| {
            if p.name.ends_with("RunningProcesses_v3") {
                p.differs_in(NVML_12_2, "its nvmlProcessInfo_t is the 32-byte layout drivers 535.43 to 535.86 wrote; the shim passes those drivers buffers of 32-byte entries (hooks/nvml/lists.rs)")
            } else {
                p
            }
        })
        .collect()
}

/// The header whose `CUmemPoolProps` members the shim declares.
const CUDA_13: &str = "nvidia-cuda-runtime==13.5.37";

/// The shim's CUDA and NVML declarations, as one list of checks.
pub fn shim_checks() -> Checks {
    let mut c = Checks::new();

    // cuda.h structs.
    c.push(c_struct!(Cuda, cuda::CUuuid => "CUuuid" { bytes => "bytes" }));
    c.push(c_struct!(Cuda, cuda::CUmemLocation => "CUmemLocation" { kind => "type", id => "id" }));
    c.push(c_struct!(Cuda, cuda::CUmemAllocationProp => "CUmemAllocationProp" {
        kind => "type",
        requested_handle_types => "requestedHandleTypes",
        location => "location",
        win32_handle_meta_data => "win32HandleMetaData",
        compression_type => "allocFlags.compressionType",
        gpu_direct_rdma_capable => "allocFlags.gpuDirectRDMACapable",
        usage => "allocFlags.usage",
        reserved => "allocFlags.reserved",
    }));
    c.push(c_struct!(Cuda, cuda::CudaArrayDescriptor => "CUDA_ARRAY_DESCRIPTOR" {
        width => "Width", height => "Height", format => "Format", num_channels => "NumChannels",
    }));
    c.push(
        c_struct!(Cuda, cuda::CudaArrayDescriptorV1 => "CUDA_ARRAY_DESCRIPTOR_v1" {
            width => "Width", height => "Height", format => "Format", num_channels => "NumChannels",
        })
        .define("__CUDA_API_VERSION_INTERNAL"),
    );
    c.push(c_struct!(Cuda, cuda::CudaArray3dDescriptor => "CUDA_ARRAY3D_DESCRIPTOR" {
        width => "Width", height => "Height", depth => "Depth", format => "Format", num_channels => "NumChannels", flags => "Flags",
    }));
    c.push(
        c_struct!(Cuda, cuda::CudaArray3dDescriptorV1 => "CUDA_ARRAY3D_DESCRIPTOR_v1" {
            width => "Width", height => "Height", depth => "Depth", format => "Format", num_channels => "NumChannels", flags => "Flags",
        })
        .define("__CUDA_API_VERSION_INTERNAL"),
    );
    c.push(c_struct!(Cuda, cuda::CudaArrayMemoryRequirements => "CUDA_ARRAY_MEMORY_REQUIREMENTS" {
        size => "size", alignment => "alignment", reserved => "reserved",
    }));
    c.push(
        c_struct!(Cuda, cuda::CUmemPoolProps => "CUmemPoolProps" {
            alloc_type => "allocType",
            handle_types => "handleTypes",
            location_type => "location.type",
            location_id => "location.id",
            win32_security_attributes => "win32SecurityAttributes",
            max_size => "maxSize",
            usage => "usage",
            gpu_direct_rdma_capable => "gpuDirectRDMACapable",
            reserved => "reserved",
        })
        .fields_only_in(CUDA_13, "CUDA 12 has reserved[54] where CUDA 13 has gpuDirectRDMACapable and reserved[53]"),
    );
    for c_type in ["CUDA_MEM_ALLOC_NODE_PARAMS_v1", "CUDA_MEM_ALLOC_NODE_PARAMS_v2"] {
        c.push(
            c_struct!(Cuda, cuda::CudaMemAllocNodeParams => "" {
                pool_props => "poolProps",
                access_descs => "accessDescs",
                access_desc_count => "accessDescCount",
                bytesize => "bytesize",
                dptr => "dptr",
            })
            .c_type(c_type),
        );
    }
    c.push(c_struct!(Cuda, cuda::CudaGraphInstantiateParams => "CUDA_GRAPH_INSTANTIATE_PARAMS" {
        flags => "flags", upload_stream => "hUploadStream", error_node_out => "hErrNode_out", result_out => "result_out",
    }));

    c.push(c_struct!(Cuda, cuda::CUlaunchConfig => "CUlaunchConfig" {
        grid_dim_x => "gridDimX", grid_dim_y => "gridDimY", grid_dim_z => "gridDimZ",
        block_dim_x => "blockDimX", block_dim_y => "blockDimY", block_dim_z => "blockDimZ",
        shared_mem_bytes => "sharedMemBytes", h_stream => "hStream", attrs => "attrs", num_attrs => "numAttrs",
    }));

    // cuda.h constants.
    for v in [
        c_value!(Cuda, cuda::CUDA_SUCCESS),
        c_value!(Cuda, cuda::CUDA_ERROR_INVALID_VALUE),
        c_value!(Cuda, cuda::CUDA_ERROR_OUT_OF_MEMORY),
        c_value!(Cuda, cuda::CUDA_ERROR_NOT_INITIALIZED),
        c_value!(Cuda, cuda::CUDA_ERROR_NOT_FOUND),
        c_value!(Cuda, cuda::CUDA_ERROR_NOT_READY),
        c_value!(Cuda, cuda::CU_STREAM_CAPTURE_STATUS_NONE),
        c_value!(Cuda, cuda::CU_STREAM_CAPTURE_MODE_RELAXED),
        c_value!(Cuda, cuda::CU_EVENT_DEFAULT),
        c_value!(Cuda, cuda::CU_MEM_LOCATION_TYPE_DEVICE),
        c_value!(Cuda, cuda::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
        c_value!(Cuda, cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        c_value!(Cuda, cuda::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        c_value!(Cuda, cuda::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        c_value!(Cuda, cuda::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
        c_value!(Cuda, cuda::CU_GRAPH_NODE_TYPE_GRAPH),
        c_value!(Cuda, cuda::CU_GRAPH_NODE_TYPE_MEM_ALLOC),
        c_value!(Cuda, cuda::CU_GRAPH_NODE_TYPE_CONDITIONAL),
        c_value!(Cuda, cuda::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
        c_value!(Cuda, cuda::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
        c_value!(Cuda, cuda::CU_AD_FORMAT_UNSIGNED_INT8),
        c_value!(Cuda, cuda::CU_AD_FORMAT_UNSIGNED_INT16),
        c_value!(Cuda, cuda::CU_AD_FORMAT_UNSIGNED_INT32),
        c_value!(Cuda, cuda::CU_AD_FORMAT_SIGNED_INT8),
        c_value!(Cuda, cuda::CU_AD_FORMAT_SIGNED_INT16),
        c_value!(Cuda, cuda::CU_AD_FORMAT_SIGNED_INT32),
        c_value!(Cuda, cuda::CU_AD_FORMAT_HALF),
        c_value!(Cuda, cuda::CU_AD_FORMAT_FLOAT),
    ] {
        c.value(v);
    }

    // nvml.h structs.
    c.push(c_struct!(Nvml, nvml::NvmlMemory => "nvmlMemory_t" { total => "total", free => "free", used => "used" }));
    c.push(c_struct!(Nvml, nvml::NvmlMemoryV2 => "nvmlMemory_v2_t" {
        version => "version", total => "total", reserved => "reserved", free => "free", used => "used",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessInfoV1 => "nvmlProcessInfo_v1_t" { pid => "pid", used_gpu_memory => "usedGpuMemory" }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessInfoV2 => "nvmlProcessInfo_v2_t" {
        pid => "pid", used_gpu_memory => "usedGpuMemory", gpu_instance_id => "gpuInstanceId", compute_instance_id => "computeInstanceId",
    }));
    // What the `_v3` calls wrote on drivers 535.43 to 535.86: nvmlProcessInfo_t of that
    // release's nvml.h (CUDA 12.2), and the same layout r550 named nvmlProcessDetail_v1_t.
    c.push(
        c_struct!(Nvml, nvml::NvmlProcessInfoV3Cc => "nvmlProcessInfo_t" {
            pid => "pid",
            used_gpu_memory => "usedGpuMemory",
            gpu_instance_id => "gpuInstanceId",
            compute_instance_id => "computeInstanceId",
            used_cc_protected_memory => "usedGpuCcProtectedMemory",
        })
        .pin("nvidia-nvml-dev-cu12==12.2.81"),
    );
    c.push(c_struct!(Nvml, nvml::NvmlProcessDetailV1 => "nvmlProcessDetail_v1_t" {
        pid => "pid",
        used_gpu_memory => "usedGpuMemory",
        gpu_instance_id => "gpuInstanceId",
        compute_instance_id => "computeInstanceId",
        used_cc_protected_memory => "usedGpuCcProtectedMemory",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessUtilizationSample => "nvmlProcessUtilizationSample_t" {
        pid => "pid", time_stamp => "timeStamp", sm_util => "smUtil", mem_util => "memUtil", enc_util => "encUtil", dec_util => "decUtil",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessDetailList => "nvmlProcessDetailList_v1_t" {
        version => "version", mode => "mode", num_proc_array_entries => "numProcArrayEntries", proc_array => "procArray",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessUtilizationInfoV1 => "nvmlProcessUtilizationInfo_v1_t" {
        time_stamp => "timeStamp",
        pid => "pid",
        sm_util => "smUtil",
        mem_util => "memUtil",
        enc_util => "encUtil",
        dec_util => "decUtil",
        jpg_util => "jpgUtil",
        ofa_util => "ofaUtil",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlProcessesUtilizationInfo => "nvmlProcessesUtilizationInfo_v1_t" {
        version => "version",
        process_samples_count => "processSamplesCount",
        last_seen_time_stamp => "lastSeenTimeStamp",
        proc_util_array => "procUtilArray",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlEncoderSessionInfo => "nvmlEncoderSessionInfo_t" {
        session_id => "sessionId",
        pid => "pid",
        vgpu_instance => "vgpuInstance",
        codec_type => "codecType",
        h_resolution => "hResolution",
        v_resolution => "vResolution",
        average_fps => "averageFps",
        average_latency => "averageLatency",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlFbcSessionInfo => "nvmlFBCSessionInfo_t" {
        session_id => "sessionId",
        pid => "pid",
        vgpu_instance => "vgpuInstance",
        display_ordinal => "displayOrdinal",
        session_type => "sessionType",
        session_flags => "sessionFlags",
        h_max_resolution => "hMaxResolution",
        v_max_resolution => "vMaxResolution",
        h_resolution => "hResolution",
        v_resolution => "vResolution",
        average_fps => "averageFPS",
        average_latency => "averageLatency",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlAccountingStatsV2 => "nvmlAccountingStats_v2_t" {
        pid => "pid",
        is_running => "isRunning",
        gpu_utilization => "gpuUtilization",
        memory_utilization => "memoryUtilization",
        max_memory_usage => "maxMemoryUsage",
        sample_count => "sampleCount",
        sum_gpu_util => "sumGpuUtil",
        sum_fb_util => "sumFbUtil",
        time => "time",
        start_time => "startTime",
    }));

    c.push(c_struct!(Nvml, nvml::NvmlEventData => "nvmlEventData_t" {
        device => "device",
        event_type => "eventType",
        event_data => "eventData",
        gpu_instance_id => "gpuInstanceId",
        compute_instance_id => "computeInstanceId",
    }));
    // nvml.h's MIG structs (fgpu mig).
    c.push(c_struct!(Nvml, nvml::NvmlGpuInstancePlacement => "nvmlGpuInstancePlacement_t" { start => "start", size => "size" }));
    c.push(c_struct!(Nvml, nvml::NvmlGpuInstanceProfileInfoV2 => "nvmlGpuInstanceProfileInfo_v2_t" {
        version => "version",
        id => "id",
        is_p2p_supported => "isP2pSupported",
        slice_count => "sliceCount",
        instance_count => "instanceCount",
        multiprocessor_count => "multiprocessorCount",
        copy_engine_count => "copyEngineCount",
        decoder_count => "decoderCount",
        encoder_count => "encoderCount",
        jpeg_count => "jpegCount",
        ofa_count => "ofaCount",
        memory_size_mb => "memorySizeMB",
        name => "name",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlGpuInstanceInfo => "nvmlGpuInstanceInfo_t" {
        device => "device",
        id => "id",
        profile_id => "profileId",
        placement => "placement",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlComputeInstanceProfileInfo => "nvmlComputeInstanceProfileInfo_t" {
        id => "id",
        slice_count => "sliceCount",
        instance_count => "instanceCount",
        multiprocessor_count => "multiprocessorCount",
        shared_copy_engine_count => "sharedCopyEngineCount",
        shared_decoder_count => "sharedDecoderCount",
        shared_encoder_count => "sharedEncoderCount",
        shared_jpeg_count => "sharedJpegCount",
        shared_ofa_count => "sharedOfaCount",
    }));
    c.push(c_struct!(Nvml, nvml::NvmlComputeInstanceInfo => "nvmlComputeInstanceInfo_t" {
        device => "device",
        gpu_instance => "gpuInstance",
        id => "id",
        profile_id => "profileId",
        placement => "placement",
    }));

    // nvml.h constants, including the struct version macros.
    for v in [
        c_value!(Nvml, nvml::NVML_SUCCESS),
        c_value!(Nvml, nvml::NVML_ERROR_INVALID_ARGUMENT),
        c_value!(Nvml, nvml::NVML_ERROR_NOT_SUPPORTED),
        c_value!(Nvml, nvml::NVML_ERROR_NO_PERMISSION),
        c_value!(Nvml, nvml::NVML_ERROR_NOT_FOUND),
        c_value!(Nvml, nvml::NVML_ERROR_INSUFFICIENT_SIZE),
        c_value!(Nvml, nvml::NVML_ERROR_FUNCTION_NOT_FOUND),
        c_value!(Nvml, nvml::NVML_ERROR_TIMEOUT),
        c_value!(Nvml, nvml::NVML_ERROR_GPU_IS_LOST),
        c_value!(Nvml, nvml::NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR => "nvmlEventTypeSingleBitEccError"),
        c_value!(Nvml, nvml::NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR => "nvmlEventTypeDoubleBitEccError"),
        c_value!(Nvml, nvml::NVML_EVENT_TYPE_XID_CRITICAL_ERROR => "nvmlEventTypeXidCriticalError"),
        c_value!(Nvml, nvml::NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        c_value!(Nvml, nvml::NVML_ERROR_UNKNOWN),
        c_value!(Nvml, nvml::NVML_MEMORY_V2 => "nvmlMemory_v2"),
        c_value!(Nvml, nvml::NVML_PROCESS_DETAIL_LIST_V1 => "nvmlProcessDetailList_v1"),
        c_value!(Nvml, nvml::NVML_PROCESSES_UTILIZATION_INFO_V1 => "nvmlProcessesUtilizationInfo_v1"),
        c_value!(Nvml, nvml::NVML_PROCESS_MODE_COMPUTE),
        c_value!(Nvml, nvml::NVML_PROCESS_MODE_GRAPHICS),
        c_value!(Nvml, nvml::NVML_PROCESS_MODE_MPS),
        c_value!(Nvml, nvml::NVML_ERROR_IN_USE),
        c_value!(Nvml, nvml::NVML_ERROR_INSUFFICIENT_RESOURCES),
        c_value!(Nvml, nvml::NVML_DEVICE_MIG_ENABLE),
        c_value!(Nvml, nvml::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED),
        c_value!(Nvml, nvml::NVML_GPU_INSTANCE_PROFILE_INFO_V2 => "nvmlGpuInstanceProfileInfo_v2"),
    ] {
        c.value(v);
    }

    for p in abi_prototypes() {
        c.prototype(p);
    }
    c
}

#[test]
fn shim_abi_matches_nvidia_headers() {
    shim_checks().run("shim-abi");
}

/// What nvml.h gives only in prose, so that no C expression can be compared: (constant,
/// where the header says it).
const PROSE_ONLY: &[(&str, &str)] = &[("NVML_NO_INSTANCE", "nvmlProcessInfo_v2_t: gpuInstanceId and computeInstanceId are \"0xFFFFFFFF otherwise\"")];

/// Every `pub const` and `pub struct` of the crate is among the checks above (or listed in
/// [`PROSE_ONLY`]), so nothing is added to the crate unchecked; every prototype is, by
/// construction (the lists themselves are read).
#[test]
fn every_declaration_of_the_abi_crate_is_checked() {
    let checks = shim_checks();
    let checked = checks.names();
    let mut declared = Vec::new();
    for file in ["cuda.rs", "nvml.rs"] {
        let path = fgpu_tests::workspace().join("abi/src").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("pub const ").or_else(|| line.strip_prefix("pub struct ")) else { continue };
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            declared.push((file, name));
        }
    }
    assert!(declared.len() > 60, "the scan found only {} declarations: {declared:?}", declared.len());
    let unchecked: Vec<String> = declared
        .iter()
        .filter(|(_, name)| !checked.contains(&name.as_str()) && !PROSE_ONLY.iter().any(|(n, _)| n == name))
        .map(|(file, name)| format!("{file}: {name}"))
        .collect();
    assert!(unchecked.is_empty(), "declared in abi/src but checked against no header: {unchecked:?}");
    for (name, _) in PROSE_ONLY {
        assert!(declared.iter().any(|(_, n)| n == name), "{name} is no longer declared: drop it from PROSE_ONLY");
    }
}
