//! stub
pub fn doctor(_: &crate::cli::DoctorArgs) -> i32 { eprintln!("fgpu: not implemented yet"); 1 }
pub fn driver_probe_main() -> i32 { eprintln!("fgpu: not implemented yet"); 1 }
