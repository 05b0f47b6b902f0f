//! fgpu-core: placeholder
