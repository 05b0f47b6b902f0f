//! libfgpu.so: placeholder
