//! stub
pub fn exporter(_: &crate::cli::ExporterArgs) -> i32 { eprintln!("fgpu: not implemented yet"); 1 }
