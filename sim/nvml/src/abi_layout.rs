//! The simulated NVML's C types and constants against NVIDIA's `nvml.h`: every field's
//! offset, size and alignment, every struct's size and alignment, the value of every named
//! constant and struct version, and the temperature thresholds whose arms in api/sensors.rs name
//! them. The mechanism (a C program compiled against the pinned headers of
//! tests/abi/requirements.txt) is in tests/support/c_layout.rs.
//!
//! Not checked, for want of a header: `NvmlPciInfoLegacy` (the 52-byte `nvmlPciInfo_t`
//! of NVML before its v3, which no pinned nvml.h still declares) and `NO_INSTANCE`
//! (nvml.h states 0xFFFFFFFF in a comment of `nvmlProcessInfo_v2_t`, with no name).

use fgpu_tests::c_layout::{Checks, Header::Nvml, Value};
use fgpu_tests::{c_struct, c_value};

fn checks() -> Checks {
    let mut c = Checks::new();
    c.push(c_struct!(Nvml, crate::api::memory::NvmlMemory => "nvmlMemory_t" { total => "total", free => "free", used => "used" }));
    c.push(c_struct!(Nvml, crate::api::memory::NvmlMemoryV2 => "nvmlMemory_v2_t" {
        version => "version", total => "total", reserved => "reserved", free => "free", used => "used",
    }));
    c.push(c_struct!(Nvml, crate::api::memory::NvmlBar1Memory => "nvmlBAR1Memory_t" { total => "bar1Total", free => "bar1Free", used => "bar1Used" }));
    c.push(c_struct!(Nvml, crate::api::processes::ProcessInfoV1 => "nvmlProcessInfo_v1_t" { pid => "pid", used_gpu_memory => "usedGpuMemory" }));
    c.push(c_struct!(Nvml, crate::api::processes::ProcessInfoV2 => "nvmlProcessInfo_v2_t" {
        pid => "pid", used_gpu_memory => "usedGpuMemory", gpu_instance_id => "gpuInstanceId", compute_instance_id => "computeInstanceId",
    }));
    c.push(c_struct!(Nvml, crate::api::pci::NvmlPciInfo => "nvmlPciInfo_t" {
        bus_id_legacy => "busIdLegacy",
        domain => "domain",
        bus => "bus",
        device => "device",
        pci_device_id => "pciDeviceId",
        pci_sub_system_id => "pciSubSystemId",
        bus_id => "busId",
    }));
    c.push(c_struct!(Nvml, crate::api::sensors::NvmlUtilization => "nvmlUtilization_t" { gpu => "gpu", memory => "memory" }));
    c.push(c_struct!(Nvml, crate::api::accounting::NvmlAccountingStats => "nvmlAccountingStats_t" {
        gpu_utilization => "gpuUtilization",
        memory_utilization => "memoryUtilization",
        max_memory_usage => "maxMemoryUsage",
        time => "time",
        start_time => "startTime",
        is_running => "isRunning",
        reserved => "reserved",
    }));
    c.push(c_struct!(Nvml, crate::api::events::NvmlEventData => "nvmlEventData_t" {
        device => "device", event_type => "eventType", event_data => "eventData", gpu_instance_id => "gpuInstanceId",
        compute_instance_id => "computeInstanceId",
    }));
    c.push(c_struct!(Nvml, crate::api::sensors::NvmlFbcStats => "nvmlFBCStats_t" {
        sessions_count => "sessionsCount", average_fps => "averageFPS", average_latency => "averageLatency",
    }));

    // Multi-Instance GPU management (api/mig.rs, api/mig_device.rs).
    use crate::api::mig::*;
    c.push(c_struct!(Nvml, GpuInstancePlacement => "nvmlGpuInstancePlacement_t" { start => "start", size => "size" }));
    c.push(c_struct!(Nvml, ComputeInstancePlacement => "nvmlComputeInstancePlacement_t" { start => "start", size => "size" }));
    c.push(c_struct!(Nvml, GpuInstanceProfileInfo => "nvmlGpuInstanceProfileInfo_t" {
        id => "id", is_p2p_supported => "isP2pSupported", slice_count => "sliceCount", instance_count => "instanceCount",
        multiprocessor_count => "multiprocessorCount", copy_engine_count => "copyEngineCount", decoder_count => "decoderCount",
        encoder_count => "encoderCount", jpeg_count => "jpegCount", ofa_count => "ofaCount", memory_size_mb => "memorySizeMB",
    }));
    c.push(c_struct!(Nvml, GpuInstanceProfileInfoV2 => "nvmlGpuInstanceProfileInfo_v2_t" {
        version => "version", id => "id", is_p2p_supported => "isP2pSupported", slice_count => "sliceCount", instance_count => "instanceCount",
        multiprocessor_count => "multiprocessorCount", copy_engine_count => "copyEngineCount", decoder_count => "decoderCount",
        encoder_count => "encoderCount", jpeg_count => "jpegCount", ofa_count => "ofaCount", memory_size_mb => "memorySizeMB", name => "name",
    }));
    c.push(c_struct!(Nvml, GpuInstanceProfileInfoV3 => "nvmlGpuInstanceProfileInfo_v3_t" {
        version => "version", id => "id", slice_count => "sliceCount", instance_count => "instanceCount",
        multiprocessor_count => "multiprocessorCount", copy_engine_count => "copyEngineCount", decoder_count => "decoderCount",
        encoder_count => "encoderCount", jpeg_count => "jpegCount", ofa_count => "ofaCount", memory_size_mb => "memorySizeMB", name => "name",
        capabilities => "capabilities",
    }));
    c.push(c_struct!(Nvml, GpuInstanceInfo => "nvmlGpuInstanceInfo_t" { device => "device", id => "id", profile_id => "profileId", placement => "placement" }));
    c.push(c_struct!(Nvml, ComputeInstanceProfileInfo => "nvmlComputeInstanceProfileInfo_t" {
        id => "id", slice_count => "sliceCount", instance_count => "instanceCount", multiprocessor_count => "multiprocessorCount",
        shared_copy_engine_count => "sharedCopyEngineCount", shared_decoder_count => "sharedDecoderCount",
        shared_encoder_count => "sharedEncoderCount", shared_jpeg_count => "sharedJpegCount", shared_ofa_count => "sharedOfaCount",
    }));
    c.push(c_struct!(Nvml, ComputeInstanceProfileInfoV2 => "nvmlComputeInstanceProfileInfo_v2_t" {
        version => "version", id => "id", slice_count => "sliceCount", instance_count => "instanceCount", multiprocessor_count => "multiprocessorCount",
        shared_copy_engine_count => "sharedCopyEngineCount", shared_decoder_count => "sharedDecoderCount",
        shared_encoder_count => "sharedEncoderCount", shared_jpeg_count => "sharedJpegCount", shared_ofa_count => "sharedOfaCount", name => "name",
    }));
    c.push(c_struct!(Nvml, ComputeInstanceProfileInfoV3 => "nvmlComputeInstanceProfileInfo_v3_t" {
        version => "version", id => "id", slice_count => "sliceCount", instance_count => "instanceCount", multiprocessor_count => "multiprocessorCount",
        shared_copy_engine_count => "sharedCopyEngineCount", shared_decoder_count => "sharedDecoderCount",
        shared_encoder_count => "sharedEncoderCount", shared_jpeg_count => "sharedJpegCount", shared_ofa_count => "sharedOfaCount", name => "name",
        capabilities => "capabilities",
    }));
    c.push(c_struct!(Nvml, ComputeInstanceInfo => "nvmlComputeInstanceInfo_t" {
        device => "device", gpu_instance => "gpuInstance", id => "id", profile_id => "profileId", placement => "placement",
    }));
    c.push(c_struct!(Nvml, crate::api::mig_device::DeviceAttributes => "nvmlDeviceAttributes_t" {
        multiprocessor_count => "multiprocessorCount", shared_copy_engine_count => "sharedCopyEngineCount",
        shared_decoder_count => "sharedDecoderCount", shared_encoder_count => "sharedEncoderCount", shared_jpeg_count => "sharedJpegCount",
        shared_ofa_count => "sharedOfaCount", gpu_instance_slice_count => "gpuInstanceSliceCount",
        compute_instance_slice_count => "computeInstanceSliceCount", memory_size_mb => "memorySizeMB",
    }));
    use fgpu_sim_state::mig as m;
    for v in [
        c_value!(Nvml, GI_PROFILE_INFO_V2 => "nvmlGpuInstanceProfileInfo_v2"),
        c_value!(Nvml, GI_PROFILE_INFO_V3 => "nvmlGpuInstanceProfileInfo_v3"),
        c_value!(Nvml, CI_PROFILE_INFO_V2 => "nvmlComputeInstanceProfileInfo_v2"),
        c_value!(Nvml, CI_PROFILE_INFO_V3 => "nvmlComputeInstanceProfileInfo_v3"),
        c_value!(Nvml, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED),
        c_value!(Nvml, m::GI_PROFILE_1_SLICE => "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_2_SLICE => "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_3_SLICE => "NVML_GPU_INSTANCE_PROFILE_3_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_4_SLICE => "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_7_SLICE => "NVML_GPU_INSTANCE_PROFILE_7_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_8_SLICE => "NVML_GPU_INSTANCE_PROFILE_8_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_6_SLICE => "NVML_GPU_INSTANCE_PROFILE_6_SLICE"),
        c_value!(Nvml, m::GI_PROFILE_1_SLICE_REV1 => "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"),
        c_value!(Nvml, m::GI_PROFILE_2_SLICE_REV1 => "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1"),
        c_value!(Nvml, m::GI_PROFILE_1_SLICE_REV2 => "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"),
        // The profile indices of the last CUDA 12 release; 12.2 had fewer, CUDA 13 more.
        c_value!(Nvml, m::GI_PROFILE_COUNT => "NVML_GPU_INSTANCE_PROFILE_COUNT").pin("nvidia-nvml-dev-cu12==12.9.79"),
        c_value!(Nvml, m::CI_PROFILE_1_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_2_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_3_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_4_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_7_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_8_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_6_SLICE => "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE"),
        c_value!(Nvml, m::CI_PROFILE_1_SLICE_REV1 => "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1"),
        c_value!(Nvml, m::CI_PROFILE_COUNT => "NVML_COMPUTE_INSTANCE_PROFILE_COUNT").pin("nvidia-nvml-dev-cu12==12.9.79"),
        c_value!(Nvml, m::ARCH_AMPERE => "NVML_DEVICE_ARCH_AMPERE"),
        c_value!(Nvml, m::ARCH_HOPPER => "NVML_DEVICE_ARCH_HOPPER"),
        c_value!(Nvml, crate::boundary::NVML_ERROR_NO_PERMISSION),
        c_value!(Nvml, crate::boundary::NVML_ERROR_RESET_REQUIRED),
        c_value!(Nvml, crate::boundary::NVML_ERROR_IN_USE),
        c_value!(Nvml, crate::boundary::NVML_ERROR_INSUFFICIENT_RESOURCES),
    ] {
        c.value(v);
    }

    for v in [
        c_value!(Nvml, crate::boundary::NVML_SUCCESS),
        c_value!(Nvml, crate::boundary::NVML_ERROR_UNINITIALIZED),
        c_value!(Nvml, crate::boundary::NVML_ERROR_INVALID_ARGUMENT),
        c_value!(Nvml, crate::boundary::NVML_ERROR_NOT_SUPPORTED),
        c_value!(Nvml, crate::boundary::NVML_ERROR_NOT_FOUND),
        c_value!(Nvml, crate::boundary::NVML_ERROR_INSUFFICIENT_SIZE),
        c_value!(Nvml, crate::boundary::NVML_ERROR_DRIVER_NOT_LOADED),
        c_value!(Nvml, crate::api::events::NVML_ERROR_TIMEOUT),
        c_value!(Nvml, crate::boundary::NVML_ERROR_GPU_IS_LOST),
        c_value!(Nvml, crate::boundary::NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        c_value!(Nvml, crate::boundary::NVML_ERROR_UNKNOWN),
        c_value!(Nvml, crate::api::memory::NVML_MEMORY_V2 => "nvmlMemory_v2"),
    ] {
        c.value(v);
    }

    // Event types (api/events.rs, fgpu_sim_state::events).
    use fgpu_sim_state::events as e;
    for v in [
        c_value!(Nvml, e::EVENT_SINGLE_BIT_ECC => "nvmlEventTypeSingleBitEccError"),
        c_value!(Nvml, e::EVENT_DOUBLE_BIT_ECC => "nvmlEventTypeDoubleBitEccError"),
        c_value!(Nvml, e::EVENT_PSTATE => "nvmlEventTypePState"),
        c_value!(Nvml, e::EVENT_XID_CRITICAL => "nvmlEventTypeXidCriticalError"),
        c_value!(Nvml, e::EVENT_CLOCK => "nvmlEventTypeClock"),
        c_value!(Nvml, e::EVENT_POWER_SOURCE_CHANGE => "nvmlEventTypePowerSourceChange"),
        c_value!(Nvml, e::EVENT_MIG_CONFIG_CHANGE => "nvmlEventMigConfigChange"),
        // CUDA 12.2's nvml.h had fewer types.
        c_value!(Nvml, e::EVENT_ALL => "nvmlEventTypeAll").pin("nvidia-nvml-dev-cu12==12.9.79"),
    ] {
        c.value(v);
    }

    // nvmlDeviceGetTemperatureThreshold: `N => value, // NAME` arms.
    let source = include_str!("api/sensors.rs");
    let body = source.split("fn nvmlDeviceGetTemperatureThreshold").nth(1).expect("api/sensors.rs: nvmlDeviceGetTemperatureThreshold");
    let body = body.split("_ =>").next().unwrap();
    let mut thresholds = 0;
    for line in body.lines() {
        let Some((number, rest)) = line.split_once("=>") else { continue };
        let (Ok(number), Some((_, name))) = (number.trim().parse::<i64>(), rest.split_once("//")) else { continue };
        c.value(Value::new(
            Nvml,
            format!("api/sensors.rs temperature threshold arm {number}"),
            format!("NVML_TEMPERATURE_THRESHOLD_{}", name.trim()),
            number as i128,
        ));
        thresholds += 1;
    }
    assert_eq!(thresholds, 4, "api/sensors.rs: the temperature threshold arms have changed shape");
    c
}

#[test]
fn simulated_nvml_abi_matches_nvidia_headers() {
    checks().run("sim-nvml");
}
