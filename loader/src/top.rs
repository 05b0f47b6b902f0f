//! stub
pub fn top(_: &crate::cli::TopArgs) -> i32 { eprintln!("fgpu: not implemented yet"); 1 }
