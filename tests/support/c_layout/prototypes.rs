//! C prototypes checked against the headers: the ABI shape of each parameter and return
//! type ([`Shape`], [`CShape`]), the Rust declaration of a function ([`Prototype`]), and the
//! C++ program that prints what the headers declare.

use super::headers::{Header, HeaderSet};
use std::fmt::Write as _;

/// What one parameter or return type is, as the C ABI sees it: its size, alignment and
/// signedness, how many pointers deep it is, and what lies under the last pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub size: usize,
    pub align: usize,
    pub signed: bool,
    /// 0 for a value, 1 for `T *`, 2 for `T **`.
    pub level: u32,
    /// The type under every pointer (the type itself at level 0).
    pub base: Base,
}

/// The type under every pointer of a [`Shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// `void`; in a Rust declaration, `c_void`: a pointer the shim never reads, which may
    /// stand for any C pointee.
    Void,
    /// A C type declared but not defined (`struct CUctx_st`): an opaque handle.
    Opaque,
    Int {
        size: usize,
        signed: bool,
    },
    Float {
        size: usize,
    },
    Struct {
        size: usize,
        align: usize,
    },
}

impl Shape {
    /// A value of the base type itself.
    pub fn value(base: Base, size: usize, align: usize) -> Shape {
        let signed = matches!(base, Base::Int { signed: true, .. } | Base::Float { .. });
        Shape { size, align, signed, level: 0, base }
    }

    /// A pointer to `self`.
    pub fn pointer(self) -> Shape {
        Shape { size: std::mem::size_of::<*const u8>(), align: std::mem::align_of::<*const u8>(), signed: false, level: self.level + 1, base: self.base }
    }

    /// Whether the Rust declaration `self` stands for the C type `c`: size, alignment,
    /// signedness and pointer level alike, and the same base under the pointers (a Rust
    /// `c_void` there stands for any).
    pub fn stands_for(&self, c: &Shape) -> bool {
        let same_value = (self.size, self.align, self.signed, self.level) == (c.size, c.align, c.signed, c.level);
        same_value && (self.base == c.base || (self.level > 0 && self.base == Base::Void))
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let base = match self.base {
            Base::Void => "void".to_string(),
            Base::Opaque => "opaque".to_string(),
            Base::Int { size, signed } => format!("{}int{}", if signed { "" } else { "u" }, size * 8),
            Base::Float { size } => format!("float{}", size * 8),
            Base::Struct { size, align } => format!("struct(size {size}, align {align})"),
        };
        write!(f, "{base}{} (size {}, align {}{})", "*".repeat(self.level as usize), self.size, self.align, if self.signed { ", signed" } else { "" })
    }
}

/// The [`Shape`] of a Rust type used in a C prototype.
pub trait CShape {
    fn shape() -> Shape;
}

macro_rules! int_shapes {
    ($($t:ty),*) => { $(
        impl CShape for $t {
            fn shape() -> Shape {
                let size = std::mem::size_of::<$t>();
                Shape::value(Base::Int { size, signed: <$t>::MIN != 0 }, size, std::mem::align_of::<$t>())
            }
        }
    )* };
}
int_shapes!(u8, i8, u16, i16, u32, i32, u64, i64, usize, isize);

impl CShape for f32 {
    fn shape() -> Shape {
        Shape::value(Base::Float { size: 4 }, 4, std::mem::align_of::<f32>())
    }
}

impl CShape for f64 {
    fn shape() -> Shape {
        Shape::value(Base::Float { size: 8 }, 8, std::mem::align_of::<f64>())
    }
}

impl CShape for std::ffi::c_void {
    fn shape() -> Shape {
        Shape { size: 0, align: 0, signed: false, level: 0, base: Base::Void }
    }
}

impl<T: CShape> CShape for *mut T {
    fn shape() -> Shape {
        T::shape().pointer()
    }
}

impl<T: CShape> CShape for *const T {
    fn shape() -> Shape {
        T::shape().pointer()
    }
}

/// `c_struct_shape!(path::Type, ...)`: [`CShape`] for `#[repr(C)]` structs (their members
/// are checked by [`c_struct!`]).
#[macro_export]
macro_rules! c_struct_shape {
    ($($t:ty),* $(,)?) => { $(
        impl $crate::c_layout::prototypes::CShape for $t {
            fn shape() -> $crate::c_layout::prototypes::Shape {
                let (size, align) = (std::mem::size_of::<$t>(), std::mem::align_of::<$t>());
                $crate::c_layout::prototypes::Shape::value($crate::c_layout::prototypes::Base::Struct { size, align }, size, align)
            }
        }
    )* };
}

// The structs of `fgpu-abi` that its prototypes point to (implemented here, beside the
// trait: the layout test is a crate of its own, and the structs are another's).
c_struct_shape!(
    fgpu_abi::cuda::CUuuid,
    fgpu_abi::cuda::CUmemAllocationProp,
    fgpu_abi::cuda::CudaArrayDescriptor,
    fgpu_abi::cuda::CudaArrayDescriptorV1,
    fgpu_abi::cuda::CudaArray3dDescriptor,
    fgpu_abi::cuda::CudaArray3dDescriptorV1,
    fgpu_abi::cuda::CudaArrayMemoryRequirements,
    fgpu_abi::cuda::CudaMemAllocNodeParams,
    fgpu_abi::cuda::CudaGraphInstantiateParams,
    fgpu_abi::cuda::CUlaunchConfig,
    fgpu_abi::nvml::NvmlMemory,
    fgpu_abi::nvml::NvmlMemoryV2,
    fgpu_abi::nvml::NvmlProcessInfoV1,
    fgpu_abi::nvml::NvmlProcessInfoV2,
    fgpu_abi::nvml::NvmlProcessUtilizationSample,
    fgpu_abi::nvml::NvmlProcessDetailList,
    fgpu_abi::nvml::NvmlProcessesUtilizationInfo,
    fgpu_abi::nvml::NvmlEncoderSessionInfo,
    fgpu_abi::nvml::NvmlFbcSessionInfo,
    fgpu_abi::nvml::NvmlAccountingStatsV2,
    fgpu_abi::nvml::NvmlEventData,
    fgpu_abi::nvml::NvmlGpuInstancePlacement,
    fgpu_abi::nvml::NvmlGpuInstanceProfileInfoV2,
    fgpu_abi::nvml::NvmlGpuInstanceInfo,
    fgpu_abi::nvml::NvmlComputeInstanceProfileInfo,
    fgpu_abi::nvml::NvmlComputeInstanceInfo,
);

/// A C function as a Rust declaration types it, to be checked against the headers.
#[derive(Clone, Debug)]
pub struct Prototype {
    pub header: Header,
    pub name: &'static str,
    pub ret: Shape,
    /// (parameter name, its shape).
    pub params: Vec<(&'static str, Shape)>,
    /// (header pin, why): headers whose prototype is known to differ, and why that is right.
    pub differs_in: Vec<(&'static str, &'static str)>,
}

impl Prototype {
    /// Accepts a difference from the pinned header `pin` (`name==version`), for `reason`;
    /// the check still fails if that header agrees (the exception would be stale).
    pub fn differs_in(mut self, pin: &'static str, reason: &'static str) -> Self {
        self.differs_in.push((pin, reason));
        self
    }
}

/// `size align signed level kind base_size base_align base_signed`, as the probe prints it.
pub(super) fn parse_shape(field: &str) -> Option<Shape> {
    let w: Vec<&str> = field.split_whitespace().collect();
    let n = |i: usize| w.get(i).and_then(|x| x.parse::<usize>().ok());
    let (size, align, signed, level) = (n(0)?, n(1)?, n(2)? != 0, n(3)? as u32);
    let (bsize, balign, bsigned) = (n(5)?, n(6)?, n(7)? != 0);
    let base = match *w.get(4)? {
        "void" => Base::Void,
        "opaque" => Base::Opaque,
        "int" => Base::Int { size: bsize, signed: bsigned },
        "float" => Base::Float { size: bsize },
        "struct" => Base::Struct { size: bsize, align: balign },
        _ => return None,
    };
    Some(Shape { size, align, signed, level, base })
}

/// The C++ program that prints one line per function: its name, then `|` and the shape of
/// its return type and of each parameter, read from the function's type (never called, so
/// nothing is linked). `__CUDA_API_VERSION_INTERNAL` declares cuda.h's every variant
/// (`_v2`, `_ptsz` and the legacy ones under their own names, as the driver exports them);
/// `NVML_NO_UNVERSIONED_FUNC_DEFS` keeps nvml.h's unversioned names as they are.
pub(super) fn prototype_program<'a>(set: &HeaderSet, names: impl Iterator<Item = &'a str>) -> String {
    let mut c = String::from("// Generated by tests/support/c_layout.rs: one line per function.\n");
    c.push_str(match set.header {
        Header::Cuda => "#define __CUDA_API_VERSION_INTERNAL\n",
        Header::Nvml => "#define NVML_NO_UNVERSIONED_FUNC_DEFS\n",
    });
    writeln!(c, "#include <cstdio>\n#include <type_traits>\n#include <{}>\n", set.header.file()).unwrap();
    c.push_str(
        r#"template <class T, class = void> struct complete : std::false_type {};
template <class T> struct complete<T, decltype(void(sizeof(T)))> : std::true_type {};
template <class T, bool = std::is_enum<T>::value> struct underlying { typedef T type; };
template <class T> struct underlying<T, true> { typedef typename std::underlying_type<T>::type type; };
template <class T> struct signedness { static const int value = std::is_signed<typename underlying<T>::type>::value; };
template <class T> void base(int level) {
    typedef typename std::remove_cv<T>::type B;
    if constexpr (std::is_pointer<B>::value) base<typename std::remove_pointer<B>::type>(level + 1);
    else if constexpr (std::is_void<B>::value) printf(" %d void 0 0 0", level);
    else if constexpr (!complete<B>::value) printf(" %d opaque 0 0 0", level);
    else {
        typedef typename underlying<B>::type U;
        const char *kind = std::is_floating_point<U>::value ? "float" : std::is_integral<U>::value ? "int" : "struct";
        printf(" %d %s %zu %zu %d", level, kind, sizeof(B), alignof(B), signedness<B>::value);
    }
}
template <class T> void shape() {
    printf(" |");
    if constexpr (std::is_void<T>::value) printf(" 0 0 0 0 void 0 0 0");
    else { printf(" %zu %zu %d", sizeof(T), alignof(T), signedness<T>::value); base<T>(0); }
}
template <class R, class... A> void prototype(const char *name, R (*)(A...)) {
    printf("%s", name);
    shape<R>();
    (shape<A>(), ...);
    printf("\n");
}
#define PROTOTYPE(f) prototype(#f, (decltype(&f))nullptr)

int main() {
"#,
    );
    for name in names {
        writeln!(c, "    PROTOTYPE({name});").unwrap();
    }
    c.push_str("    return 0;\n}\n");
    c
}
