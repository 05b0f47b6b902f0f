//! The simulated products and their MIG profiles, as NVIDIA publishes them.
//!
//! Sources, per figure:
//! - which profiles each product has, their names, fractions of memory and SMs, engines
//!   (NVDEC, JPEG, OFA, copy engines) and instance counts: the MIG user guide, "Supported
//!   MIG Profiles" (tables "GPU Instance Profiles on A100", "... on H100", "... on H200");
//!   the A100 table is given for A100-SXM4-40GB with the 80GB names stated beside it;
//! - profile IDs (19, 20, 15, 14, 9, 5, 0), placements (`{0..6}:1`, `{0,2,4,6}:2`,
//!   `{0,2,4}:2`, `{0,4}:4`, `{0}:4`, `{0}:8`) and compute instance profile IDs: the
//!   guide's `nvidia-smi mig -lgip`, `-lgipp`, `-cgi ... -C` and `-lcip` examples;
//! - memory sizes (MiB) and SM counts the guide's tables give as fractions only: the
//!   rows `nvidia-smi mig -lgip` prints on those products with current drivers (A100 80GB:
//!   9.50, 19.50, 39.25, 79.00 GiB, 14/28/42/56/98 SMs; H100 80GB HBM3: 9.75, 19.62,
//!   39.50, 79.25 GiB, 16/26/32/60/64/132 SMs; H200: 16.00, 32.50, 140.00 GiB, 16/32/60/64/132
//!   SMs), and `nvidia-smi`'s MIG device table (a 3g.40gb is 40192 MiB on A100 80GB and
//!   40448 MiB on H100);
//! - not published anywhere we could read, so chosen here and listed in docs/simulator.md:
//!   the H200's 4-slice memory (71552 MiB, as 2 x 4-slice + 256 = 8-slice like the H100's)
//!   and 1g.35gb SM count (26, as the H100's 1g.20gb), and the SM counts of compute
//!   instances smaller than their GPU instance on Hopper (16 per compute slice).
//! - product names, memory (MiB), SM counts and PCI device IDs: what `nvidia-smi` prints
//!   for "NVIDIA A100-SXM4-80GB" (81920 MiB, 10DE:20B2), "NVIDIA H100 80GB HBM3"
//!   (81559 MiB, 10DE:2330) and "NVIDIA H200" (143771 MiB, 10DE:2335).

/// `NVML_GPU_INSTANCE_PROFILE_*` (nvml.h): the profile indices.
pub const GI_PROFILE_1_SLICE: u32 = 0x0;
pub const GI_PROFILE_2_SLICE: u32 = 0x1;
pub const GI_PROFILE_3_SLICE: u32 = 0x2;
pub const GI_PROFILE_4_SLICE: u32 = 0x3;
pub const GI_PROFILE_7_SLICE: u32 = 0x4;
pub const GI_PROFILE_8_SLICE: u32 = 0x5;
pub const GI_PROFILE_6_SLICE: u32 = 0x6;
pub const GI_PROFILE_1_SLICE_REV1: u32 = 0x7;
pub const GI_PROFILE_2_SLICE_REV1: u32 = 0x8;
pub const GI_PROFILE_1_SLICE_REV2: u32 = 0x9;
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of CUDA 12.9's nvml.h (r575: indices 0xA to 0x10 are
/// graphics and media variants, which these products do not have).
pub const GI_PROFILE_COUNT: u32 = 0x11;

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` (nvml.h). On these products a compute instance
/// profile's ID equals its index (the guide's `-lcip`: 1c is ID 0, 2c ID 1, 3c ID 2).
pub const CI_PROFILE_1_SLICE: u32 = 0x0;
pub const CI_PROFILE_2_SLICE: u32 = 0x1;
pub const CI_PROFILE_3_SLICE: u32 = 0x2;
pub const CI_PROFILE_4_SLICE: u32 = 0x3;
pub const CI_PROFILE_7_SLICE: u32 = 0x4;
pub const CI_PROFILE_8_SLICE: u32 = 0x5;
pub const CI_PROFILE_6_SLICE: u32 = 0x6;
pub const CI_PROFILE_1_SLICE_REV1: u32 = 0x7;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of CUDA 12.9's nvml.h.
pub const CI_PROFILE_COUNT: u32 = 0x8;

/// Memory slices of a GPU in MIG mode (the placement axis of GPU instances).
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of a GPU in MIG mode.
pub const COMPUTE_SLICES: u32 = 7;

/// Which GPU the simulator presents (`FGPU_SIM_PRODUCT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// "NVIDIA Simulated GPU": Hopper-like, any memory size, no MIG.
    Generic,
    /// NVIDIA A100-SXM4-80GB (Ampere, GA100).
    A100_80GB,
    /// NVIDIA H100 80GB HBM3 (Hopper, GH100, SXM5).
    H100_80GB,
    /// NVIDIA H200 141GB HBM3e (Hopper, GH100, SXM5).
    H200_141GB,
}

/// `NVML_DEVICE_ARCH_AMPERE`, `NVML_DEVICE_ARCH_HOPPER` (nvml.h).
pub const ARCH_AMPERE: u32 = 7;
pub const ARCH_HOPPER: u32 = 9;

/// One GPU instance profile of a product: what `nvmlDeviceGetGpuInstanceProfileInfo(V)`
/// answers for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`.
    pub index: u32,
    /// The profile ID (`nvidia-smi mig -lgip`'s ID column).
    pub id: u32,
    /// Name without the "MIG " prefix, e.g. `3g.40gb`.
    pub name: &'static str,
    /// Compute slices (the `Ng` of the name; `sliceCount`).
    pub slices: u32,
    /// Memory slices it occupies (the size of its placements).
    pub memory_slices: u32,
    /// Most instances at once (`instanceCount`).
    pub count: u32,
    pub sms: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub memory_mib: u64,
}

impl GiProfile {
    /// Start slices of its placements, in memory slices (`nvidia-smi mig -lgipp`).
    pub fn placement_starts(&self) -> &'static [u32] {
        match self.memory_slices {
            8 => &[0],
            4 if self.slices == 4 => &[0],
            4 => &[0, 4],
            2 if self.slices == 2 => &[0, 2, 4],
            2 => &[0, 2, 4, 6],
            _ => &[0, 1, 2, 3, 4, 5, 6],
        }
    }

    /// Its memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

#[allow(clippy::too_many_arguments)]
const fn gi(
    index: u32,
    id: u32,
    name: &'static str,
    slices: u32,
    memory_slices: u32,
    count: u32,
    sms: u32,
    ce: u32,
    dec: u32,
    jpg: u32,
    ofa: u32,
    mib: u64,
) -> GiProfile {
    GiProfile { index, id, name, slices, memory_slices, count, sms, copy_engines: ce, decoders: dec, encoders: 0, jpegs: jpg, ofas: ofa, memory_mib: mib }
}

/// A100-SXM4-80GB. Engines per the guide's A100 table (1g: 0 NVDEC; +me: 1 NVDEC, 1 JPEG,
/// 1 OFA; 1g.20gb and 2g: 1 NVDEC; 3g and 4g: 2 NVDECs; 7g: 5 NVDECs, 1 JPEG, 1 OFA; copy
/// engines 1, 1, 1, 2, 3, 4, 7).
const A100_80GB: [GiProfile; 7] = [
    gi(GI_PROFILE_1_SLICE, 19, "1g.10gb", 1, 1, 7, 14, 1, 0, 0, 0, 9728),
    gi(GI_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 1, 14, 1, 1, 1, 1, 9728),
    gi(GI_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 4, 14, 1, 1, 0, 0, 19968),
    gi(GI_PROFILE_2_SLICE, 14, "2g.20gb", 2, 2, 3, 28, 2, 1, 0, 0, 19968),
    gi(GI_PROFILE_3_SLICE, 9, "3g.40gb", 3, 4, 2, 42, 3, 2, 0, 0, 40192),
    gi(GI_PROFILE_4_SLICE, 5, "4g.40gb", 4, 4, 1, 56, 4, 2, 0, 0, 40192),
    gi(GI_PROFILE_7_SLICE, 0, "7g.80gb", 7, 8, 1, 98, 7, 5, 1, 1, 80896),
];

/// H100 80GB. Engines per the guide's H100 table (N NVDECs and N JPEGs for an Ng profile,
/// 7 for 7g; OFA on +me and 7g only; copy engines 1, 1, 1, 2, 3, 4, 8).
const H100_80GB: [GiProfile; 7] = [
    gi(GI_PROFILE_1_SLICE, 19, "1g.10gb", 1, 1, 7, 16, 1, 1, 1, 0, 9984),
    gi(GI_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 1, 16, 1, 1, 1, 1, 9984),
    gi(GI_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 4, 26, 1, 1, 1, 0, 20096),
    gi(GI_PROFILE_2_SLICE, 14, "2g.20gb", 2, 2, 3, 32, 2, 2, 2, 0, 20096),
    gi(GI_PROFILE_3_SLICE, 9, "3g.40gb", 3, 4, 2, 60, 3, 3, 3, 0, 40448),
    gi(GI_PROFILE_4_SLICE, 5, "4g.40gb", 4, 4, 1, 64, 4, 4, 4, 0, 40448),
    gi(GI_PROFILE_7_SLICE, 0, "7g.80gb", 7, 8, 1, 132, 8, 7, 7, 1, 81152),
];

/// H200 141GB: the guide's H200 table (engines as the H100's).
const H200_141GB: [GiProfile; 7] = [
    gi(GI_PROFILE_1_SLICE, 19, "1g.18gb", 1, 1, 7, 16, 1, 1, 1, 0, 16384),
    gi(GI_PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, 1, 16, 1, 1, 1, 1, 16384),
    gi(GI_PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 2, 4, 26, 1, 1, 1, 0, 33280),
    gi(GI_PROFILE_2_SLICE, 14, "2g.35gb", 2, 2, 3, 32, 2, 2, 2, 0, 33280),
    gi(GI_PROFILE_3_SLICE, 9, "3g.71gb", 3, 4, 2, 60, 3, 3, 3, 0, 71552),
    gi(GI_PROFILE_4_SLICE, 5, "4g.71gb", 4, 4, 1, 64, 4, 4, 4, 0, 71552),
    gi(GI_PROFILE_7_SLICE, 0, "7g.141gb", 7, 8, 1, 132, 8, 7, 7, 1, 143360),
];

/// One compute instance profile inside a GPU instance of a given profile: what
/// `nvmlGpuInstanceGetComputeInstanceProfileInfo(V)` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiProfile {
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*`, also its ID.
    pub index: u32,
    /// Compute slices.
    pub slices: u32,
    /// Most instances at once in the GPU instance.
    pub count: u32,
    pub sms: u32,
    /// `MIG 1c.3g.40gb`'s name without "MIG ": `1c.3g.40gb`, or the GPU instance's name for
    /// the profile that takes the whole GPU instance.
    pub name: String,
    /// Start slices of its placements, in the GPU instance's compute slices.
    pub starts: Vec<u32>,
}

impl Product {
    /// Every product, in the order `FGPU_SIM_PRODUCT` lists them.
    pub const ALL: [Product; 4] = [Product::Generic, Product::A100_80GB, Product::H100_80GB, Product::H200_141GB];

    /// The name `FGPU_SIM_PRODUCT` takes.
    pub fn key(self) -> &'static str {
        match self {
            Product::Generic => "generic",
            Product::A100_80GB => "a100-80gb",
            Product::H100_80GB => "h100-80gb",
            Product::H200_141GB => "h200-141gb",
        }
    }

    pub fn parse(v: &str) -> Option<Product> {
        Product::ALL.into_iter().find(|p| p.key().eq_ignore_ascii_case(v.trim()))
    }

    pub(crate) fn code(self) -> u32 {
        match self {
            Product::Generic => 0,
            Product::A100_80GB => 1,
            Product::H100_80GB => 2,
            Product::H200_141GB => 3,
        }
    }

    pub(crate) fn from_code(code: u32) -> Product {
        match code {
            1 => Product::A100_80GB,
            2 => Product::H100_80GB,
            3 => Product::H200_141GB,
            _ => Product::Generic,
        }
    }

    /// The board's name (`nvmlDeviceGetName`, `cuDeviceGetName`).
    pub fn name(self) -> &'static str {
        match self {
            Product::Generic => "NVIDIA Simulated GPU",
            Product::A100_80GB => "NVIDIA A100-SXM4-80GB",
            Product::H100_80GB => "NVIDIA H100 80GB HBM3",
            Product::H200_141GB => "NVIDIA H200",
        }
    }

    /// Its memory, bytes (`None`: `FGPU_SIM_MEMORY` decides).
    pub fn memory(self) -> Option<u64> {
        match self {
            Product::Generic => None,
            Product::A100_80GB => Some(81920 << 20),
            Product::H100_80GB => Some(81559 << 20),
            Product::H200_141GB => Some(143771 << 20),
        }
    }

    /// Multiprocessors of the whole GPU.
    pub fn sms(self) -> u32 {
        match self {
            Product::A100_80GB => 108,
            _ => 132,
        }
    }

    /// CUDA compute capability.
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Product::A100_80GB => (8, 0),
            _ => (9, 0),
        }
    }

    /// `NVML_DEVICE_ARCH_*`.
    pub fn architecture(self) -> u32 {
        match self {
            Product::A100_80GB => ARCH_AMPERE,
            _ => ARCH_HOPPER,
        }
    }

    /// PCI `(device << 16) | vendor` and `(subsystem << 16) | subsystem vendor`.
    pub fn pci_ids(self) -> (u32, u32) {
        match self {
            Product::Generic | Product::H100_80GB => (0x2330_10DE, 0x16C1_10DE),
            Product::A100_80GB => (0x20B2_10DE, 0x1463_10DE),
            Product::H200_141GB => (0x2335_10DE, 0x18BF_10DE),
        }
    }

    /// Whether the product supports MIG at all.
    pub fn has_mig(self) -> bool {
        self != Product::Generic
    }

    /// Whether a change of MIG mode needs a GPU reset (Ampere); Hopper and later change it
    /// without one (the guide, "Enable MIG Mode").
    pub fn mig_needs_reset(self) -> bool {
        self == Product::A100_80GB
    }

    /// The GPU instance profiles, in the order `nvidia-smi mig -lgip` lists them.
    pub fn gi_profiles(self) -> &'static [GiProfile] {
        match self {
            Product::Generic => &[],
            Product::A100_80GB => &A100_80GB,
            Product::H100_80GB => &H100_80GB,
            Product::H200_141GB => &H200_141GB,
        }
    }

    /// The GPU instance profile of index `index` (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub fn gi_profile(self, index: u32) -> Option<&'static GiProfile> {
        self.gi_profiles().iter().find(|p| p.index == index)
    }

    /// The GPU instance profile with ID `id`.
    pub fn gi_profile_by_id(self, id: u32) -> Option<&'static GiProfile> {
        self.gi_profiles().iter().find(|p| p.id == id)
    }

    /// SMs of one compute slice (a compute instance smaller than its GPU instance).
    fn sms_per_slice(self) -> u32 {
        match self {
            Product::A100_80GB => 14,
            _ => 16,
        }
    }

    /// The compute instance profiles of a GPU instance of profile `gi`, by index. A GPU
    /// instance of N compute slices offers 1c, 2c, 3c, 4c and 7c up to N, except 3c in a
    /// 4-slice one (the guide's `-lcip` of a 4g.40gb lists 1c, 2c and 4g); the profile as
    /// large as the GPU instance is named after it and has all its SMs.
    pub fn ci_profiles(self, gi: &GiProfile) -> Vec<CiProfile> {
        let n = gi.slices;
        let mut out = Vec::new();
        for (index, k) in [(CI_PROFILE_1_SLICE, 1), (CI_PROFILE_2_SLICE, 2), (CI_PROFILE_3_SLICE, 3), (CI_PROFILE_4_SLICE, 4), (CI_PROFILE_7_SLICE, 7)] {
            if k > n || (k == 3 && n == 4) {
                continue;
            }
            // Starts aligned on the profile's block: 1c anywhere, 2c on even slices, 3c and 4c
            // on 0 or 4; never past the GPU instance's slices.
            let align = match k {
                1 => 1,
                2 => 2,
                _ => 4,
            };
            let starts: Vec<u32> = (0..n).step_by(align as usize).filter(|s| s + k <= n).collect();
            let whole = k == n;
            out.push(CiProfile {
                index,
                slices: k,
                count: starts.len() as u32,
                sms: if whole { gi.sms } else { k * self.sms_per_slice() },
                name: if whole { gi.name.to_string() } else { format!("{k}c.{}", gi.name) },
                starts,
            });
        }
        out
    }
}
