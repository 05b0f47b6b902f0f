//! cuDeviceGetAttribute values of the simulated device (an H100-like part; the product's
//! compute capability, and the multiprocessors of the GPU or MIG device). Attribute numbers
//! are those of `CUdevice_attribute` in cuda.h.

use fgpu_sim_state::SimState;

/// One past the highest attribute number known (CU_DEVICE_ATTRIBUTE_MAX in CUDA 12.9's cuda.h;
/// CUDA 13 numbers more).
pub(crate) const ATTRIBUTE_MAX: i32 = 144;

/// Attribute `attr` of the device on GPU `phys` with `multiprocessors` (a MIG device has
/// its compute instance's).
pub fn value(state: &SimState, phys: usize, multiprocessors: u32, attr: i32) -> Option<i32> {
    if !(1..ATTRIBUTE_MAX).contains(&attr) {
        return None;
    }
    let pci = state.device_pci(phys);
    Some(match attr {
        1 => 1024,                    // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                // MAX_BLOCK_DIM_X / Y
        4 => 64,                      // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                // MAX_GRID_DIM_X
        6 | 7 => 65535,               // MAX_GRID_DIM_Y / Z
        8 => 49152,                   // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                   // TOTAL_CONSTANT_MEMORY
        10 => 32,                     // WARP_SIZE
        11 => i32::MAX,               // MAX_PITCH
        12 => 65536,                  // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,              // CLOCK_RATE (kHz)
        14 => 512,                    // TEXTURE_ALIGNMENT
        15 => 1,                      // GPU_OVERLAP
        16 => multiprocessors as i32, // MULTIPROCESSOR_COUNT
        17 => 0,                      // KERNEL_EXEC_TIMEOUT
        18 => 0,                      // INTEGRATED
        19 => 1,                      // CAN_MAP_HOST_MEMORY
        20 => 0,                      // COMPUTE_MODE (default)
        21 => 131072,                 // MAXIMUM_TEXTURE1D_WIDTH
        22 => 131072,
        23 => 65536,
        24..=26 => 16384,
        27 | 28 => 32768,
        29 => 2048,
        30 => 512, // SURFACE_ALIGNMENT
        31 => 1,   // CONCURRENT_KERNELS
        32 => 1,   // ECC_ENABLED
        33 => pci.bus as i32,
        34 => pci.device as i32,
        35 => 0,          // TCC_DRIVER
        36 => 2_619_000,  // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,       // GLOBAL_MEMORY_BUS_WIDTH
        38 => 52_428_800, // L2_CACHE_SIZE
        39 => 2048,       // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,          // ASYNC_ENGINE_COUNT
        41 => 1,          // UNIFIED_ADDRESSING
        42 => 32768,
        43 => 2048,
        44 => 0,
        45 | 46 => 32768,
        47 | 48 => 8192,
        49 => 32768,
        50 => pci.domain as i32,
        51 => 32, // TEXTURE_PITCH_ALIGNMENT
        52 | 53 => 32768,
        54 => 2046,
        55 => 32768,
        56 => 131072,
        57 => 65536,
        58 => 16384,
        59 | 60 => 16384,
        61 => 32768,
        62 => 2048,
        63 => 32768,
        64 => 32768,
        65 => 2048,
        66 | 67 => 32768,
        68 => 2046,
        69 => 268_435_456,
        70 => 131072,
        71 => 65000,
        72 => 2_097_120,
        73 => 32768,
        74 => 32768,
        75 => state.product().compute_capability().0 as i32,
        76 => state.product().compute_capability().1 as i32,
        77 => 32768,
        78 => 1,           // STREAM_PRIORITIES_SUPPORTED
        79 | 80 => 1,      // GLOBAL / LOCAL_L1_CACHE_SUPPORTED
        81 => 233_472,     // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,       // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,           // MANAGED_MEMORY
        84 => 0,           // MULTI_GPU_BOARD
        85 => phys as i32, // MULTI_GPU_BOARD_GROUP_ID
        86 => 0,
        87 => 2, // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 => 0, // PAGEABLE_MEMORY_ACCESS
        89 => 1, // CONCURRENT_MANAGED_ACCESS
        90 => 1, // COMPUTE_PREEMPTION_SUPPORTED
        91 => 0,
        92..=94 => 0,
        95 => 1, // COOPERATIVE_LAUNCH
        96 => 1,
        97 => 232_448, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 => 0,
        99 => 1, // HOST_REGISTER_SUPPORTED
        100 | 101 => 0,
        102 => 1, // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1, // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        104 | 105 => 0,
        106 => 32, // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 0,
        108 => 31_457_280, // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 134_213_632,
        110 => 1,    // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        111 => 1024, // RESERVED_SHARED_MEMORY_PER_BLOCK
        112 => 1,    // SPARSE_CUDA_ARRAY_SUPPORTED
        113 => 1,
        114 => 1,
        115 => 1, // MEMORY_POOLS_SUPPORTED
        116 => 1, // GPU_DIRECT_RDMA_SUPPORTED
        117 => 1,
        118 => 100,
        119 => 1, // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
        120 => 1, // CLUSTER_LAUNCH
        121 => 1, // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
        122 | 123 => 1,
        124 => 1, // DMA_BUF_SUPPORTED
        125 => 1, // IPC_EVENT_SUPPORTED
        126 => 4, // MEM_SYNC_DOMAIN_COUNT
        127 => 1, // TENSOR_MAP_ACCESS_SUPPORTED
        128 => 0,
        129 => 1,
        130 => 0,
        131 => -1,
        132 => 0,
        133 => 0,
        134 => -1,
        139 => pci.pci_device_id as i32,
        140 => pci.pci_subsystem_id as i32,
        _ => 0,
    })
}
