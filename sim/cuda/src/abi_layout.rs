//! The simulated driver's C types and constants against NVIDIA's `cuda.h`: every field's
//! offset, size and alignment, every struct's size and alignment, the value of every
//! named constant, every code of the `cuGetErrorName` table, every `cuDeviceGetAttribute`
//! number whose arm in attributes.rs names its attribute, and the `CUarray_format` arms of
//! `driver::array_bytes`. The
//! mechanism (a C program compiled against the pinned headers of
//! tests/abi/requirements.txt) is in tests/support/c_layout.rs.

use fgpu_tests::c_layout::{Checks, Header::Cuda, Value};
use fgpu_tests::{c_struct, c_value};

/// The layout CUDA 12 gives `CUmemPoolProps`, which the simulator declares; CUDA 13 took
/// `gpuDirectRDMACapable` from the first byte of its `reserved[54]`.
const CUDA_12: &str = "nvidia-cuda-runtime-cu12==12.9.79";
const POOL_PROPS_12: &str = "the simulator declares CUDA 12's reserved[54], of which CUDA 13 made the first byte gpuDirectRDMACapable";

fn checks() -> Checks {
    let mut c = Checks::new();
    c.push(
        c_struct!(Cuda, crate::api::pool::CUmemPoolProps => "CUmemPoolProps" {
            alloc_type => "allocType",
            handle_types => "handleTypes",
            location_type => "location.type",
            location_id => "location.id",
            win32_security_attributes => "win32SecurityAttributes",
            max_size => "maxSize",
            usage => "usage",
            reserved => "reserved",
        })
        .fields_only_in(CUDA_12, POOL_PROPS_12),
    );
    for c_type in ["CUDA_MEM_ALLOC_NODE_PARAMS_v1", "CUDA_MEM_ALLOC_NODE_PARAMS_v2"] {
        c.push(
            c_struct!(Cuda, crate::api::graph::CudaMemAllocNodeParams => "" {
                alloc_type => "poolProps.allocType",
                handle_types => "poolProps.handleTypes",
                location_type => "poolProps.location.type",
                location_id => "poolProps.location.id",
                win32_security_attributes => "poolProps.win32SecurityAttributes",
                max_size => "poolProps.maxSize",
                usage => "poolProps.usage",
                reserved => "poolProps.reserved",
                access_descs => "accessDescs",
                access_desc_count => "accessDescCount",
                bytesize => "bytesize",
                dptr => "dptr",
            })
            .c_type(c_type)
            .fields_only_in(CUDA_12, POOL_PROPS_12),
        );
    }
    c.push(c_struct!(Cuda, crate::api::graph::CudaGraphInstantiateParams => "CUDA_GRAPH_INSTANTIATE_PARAMS" {
        flags => "flags", upload_stream => "hUploadStream", error_node_out => "hErrNode_out", result_out => "result_out",
    }));
    c.push(c_struct!(Cuda, crate::api::vmm::CUmemAllocationProp => "CUmemAllocationProp" {
        alloc_type => "type",
        requested_handle_types => "requestedHandleTypes",
        location_type => "location.type",
        location_id => "location.id",
        win32_handle_meta_data => "win32HandleMetaData",
        compression_type => "allocFlags.compressionType",
        gpu_direct_rdma_capable => "allocFlags.gpuDirectRDMACapable",
        usage => "allocFlags.usage",
        reserved => "allocFlags.reserved",
    }));
    c.push(c_struct!(Cuda, crate::api::vmm::CUmemAccessDesc => "CUmemAccessDesc" {
        location_type => "location.type", location_id => "location.id", flags => "flags",
    }));
    c.push(c_struct!(Cuda, crate::api::array::ArrayDesc => "CUDA_ARRAY_DESCRIPTOR" {
        width => "Width", height => "Height", format => "Format", num_channels => "NumChannels",
    }));
    c.push(
        c_struct!(Cuda, crate::api::array::ArrayDescV1 => "CUDA_ARRAY_DESCRIPTOR_v1" {
            width => "Width", height => "Height", format => "Format", num_channels => "NumChannels",
        })
        .define("__CUDA_API_VERSION_INTERNAL"),
    );
    c.push(c_struct!(Cuda, crate::api::array::Array3DDesc => "CUDA_ARRAY3D_DESCRIPTOR" {
        width => "Width", height => "Height", depth => "Depth", format => "Format", num_channels => "NumChannels", flags => "Flags",
    }));
    c.push(
        c_struct!(Cuda, crate::api::array::Array3DDescV1 => "CUDA_ARRAY3D_DESCRIPTOR_v1" {
            width => "Width", height => "Height", depth => "Depth", format => "Format", num_channels => "NumChannels", flags => "Flags",
        })
        .define("__CUDA_API_VERSION_INTERNAL"),
    );
    c.push(c_struct!(Cuda, crate::api::array::ArrayMemoryRequirements => "CUDA_ARRAY_MEMORY_REQUIREMENTS" {
        size => "size", alignment => "alignment", reserved => "reserved",
    }));

    for v in [
        c_value!(Cuda, crate::errors::CUDA_SUCCESS),
        c_value!(Cuda, crate::errors::CUDA_ERROR_INVALID_VALUE),
        c_value!(Cuda, crate::errors::CUDA_ERROR_OUT_OF_MEMORY),
        c_value!(Cuda, crate::errors::CUDA_ERROR_NOT_INITIALIZED),
        c_value!(Cuda, crate::errors::CUDA_ERROR_NO_DEVICE),
        c_value!(Cuda, crate::errors::CUDA_ERROR_INVALID_DEVICE),
        c_value!(Cuda, crate::errors::CUDA_ERROR_INVALID_CONTEXT),
        c_value!(Cuda, crate::errors::CUDA_ERROR_OPERATING_SYSTEM),
        c_value!(Cuda, crate::errors::CUDA_ERROR_INVALID_HANDLE),
        c_value!(Cuda, crate::errors::CUDA_ERROR_NOT_FOUND),
        c_value!(Cuda, crate::errors::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE),
        c_value!(Cuda, crate::errors::CUDA_ERROR_CONTEXT_IS_DESTROYED),
        c_value!(Cuda, crate::errors::CUDA_ERROR_NOT_PERMITTED),
        c_value!(Cuda, crate::errors::CUDA_ERROR_NOT_SUPPORTED),
        c_value!(Cuda, crate::errors::CUDA_ERROR_UNKNOWN),
        c_value!(Cuda, crate::api::graph_pool::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        c_value!(Cuda, crate::api::graph_pool::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH),
        c_value!(Cuda, crate::api::graph_pool::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
        c_value!(Cuda, crate::api::graph_pool::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH),
        c_value!(Cuda, crate::api::graph::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
        c_value!(Cuda, crate::api::graph_nodes::CU_GRAPH_NODE_TYPE_GRAPH),
        c_value!(Cuda, crate::api::graph_nodes::CU_GRAPH_NODE_TYPE_MEM_ALLOC),
        c_value!(Cuda, crate::api::graph_nodes::CU_GRAPH_NODE_TYPE_MEM_FREE),
        c_value!(Cuda, crate::api::stream::CU_STREAM_LEGACY),
        c_value!(Cuda, crate::api::stream::CU_STREAM_PER_THREAD),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        c_value!(Cuda, crate::api::pool::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        c_value!(Cuda, crate::api::vmm::CU_MEM_LOCATION_TYPE_DEVICE),
        c_value!(Cuda, crate::api::array::ARRAY_NO_BACKING => "CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING"),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_DEFAULT),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_LEGACY_STREAM),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_SUCCESS),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        c_value!(Cuda, crate::api::procaddr::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
        c_value!(Cuda, crate::attributes::ATTRIBUTE_MAX => "CU_DEVICE_ATTRIBUTE_MAX").pin(CUDA_12),
    ] {
        c.value(v);
    }

    // cuGetErrorName's table: each name has the code it is listed with.
    for (code, name, _) in crate::errors::ERRORS {
        let name = name.trim_end_matches('\0');
        c.value(Value::new(Cuda, format!("errors::ERRORS[{name}]"), name, *code as i128));
    }

    // cuDeviceGetAttribute: the arms whose comment names the attribute.
    let arms = named_arms(include_str!("attributes.rs"));
    assert!(arms.len() >= 60, "attributes.rs: only {} named arms found; has its layout changed?", arms.len());
    for (number, name) in arms {
        c.value(Value::new(Cuda, format!("attributes.rs arm {number}"), format!("CU_DEVICE_ATTRIBUTE_{name}"), number as i128));
    }

    // Array element sizes: the CUarray_format arms of driver::array_bytes.
    let source = include_str!("driver/bookkeeping.rs");
    let body = source.split("fn array_bytes").nth(1).expect("driver/bookkeeping.rs: fn array_bytes");
    let arms = named_arms(body.split("0 => return None").next().unwrap());
    assert_eq!(arms.len(), 8, "driver/bookkeeping.rs: the CUarray_format arms of array_bytes have changed shape");
    for (number, name) in arms {
        c.value(Value::new(Cuda, format!("driver/bookkeeping.rs array_bytes arm {number:#x}"), format!("CU_AD_FORMAT_{name}"), number as i128));
    }
    c
}

/// `(number, NAME)` for each match arm written `N => value, // NAME ...`, or with several
/// numbers `N | M => value, // NAME_N, NAME_M`, `// NAME_X / Y` (the second name differs in
/// its last word) or `// GLOBAL / LOCAL_REST` (in its first). Numbers may be hexadecimal.
fn named_arms(source: &str) -> Vec<(i64, String)> {
    let mut arms = Vec::new();
    for line in source.lines() {
        let Some((pattern, rest)) = line.split_once("=>") else { continue };
        let Some((_, comment)) = rest.split_once("//") else { continue };
        let number = |n: &str| {
            let n = n.trim().replace('_', "");
            match n.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).ok(),
                None => n.parse().ok(),
            }
        };
        let Some(numbers) = pattern.split('|').map(number).collect::<Option<Vec<i64>>>() else { continue };
        let word = |s: &str| -> Option<String> {
            let w: String = s.trim().chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
            (!w.is_empty() && w.starts_with(|c: char| c.is_ascii_uppercase())).then_some(w)
        };
        let names: Vec<String> = if numbers.len() == 1 {
            word(comment).into_iter().collect()
        } else if comment.contains(',') {
            comment.split(',').map(word).collect::<Option<Vec<String>>>().unwrap_or_default()
        } else {
            match comment.split_once('/').map(|(a, b)| (word(a), word(b))) {
                Some((Some(a), Some(b))) if a.contains('_') && !b.contains('_') => vec![a.clone(), format!("{}_{b}", a.rsplit_once('_').unwrap().0)],
                Some((Some(a), Some(b))) if !a.contains('_') && b.contains('_') => vec![format!("{a}_{}", b.split_once('_').unwrap().1), b],
                _ => Vec::new(),
            }
        };
        if names.len() == numbers.len() {
            arms.extend(numbers.into_iter().zip(names));
        }
    }
    arms
}

#[test]
fn simulated_cuda_abi_matches_nvidia_headers() {
    checks().run("sim-cuda");
}

#[test]
fn arm_comments_are_read() {
    let arms = named_arms("        2 | 3 => 1024,     // MAX_BLOCK_DIM_X / Y\n        79 | 80 => 1,      // GLOBAL / LOCAL_L1_CACHE_SUPPORTED\n        13 => 1_980_000,   // CLOCK_RATE (kHz)\n        24..=26 => 16384,\n        0x02 | 0x10 => 2, // UNSIGNED_INT16, HALF\n");
    let expected = [
        (2, "MAX_BLOCK_DIM_X"),
        (3, "MAX_BLOCK_DIM_Y"),
        (79, "GLOBAL_L1_CACHE_SUPPORTED"),
        (80, "LOCAL_L1_CACHE_SUPPORTED"),
        (13, "CLOCK_RATE"),
        (2, "UNSIGNED_INT16"),
        (16, "HALF"),
    ];
    assert_eq!(arms, expected.map(|(n, s)| (n, s.to_string())));
}
