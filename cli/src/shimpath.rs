//! Finding `libfgpu.so`: the search lives in the fgpu-cdi crate, which fgpu-kubelet-plugin
//! shares.

pub use fgpu_cdi::shimpath::*;
