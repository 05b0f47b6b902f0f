//! The exported entry points of the simulated driver, one module per family. They share
//! the C boundary (`boundary.rs`), the process's driver state (`driver/`) and the error
//! codes (`errors.rs`); `procaddr.rs` hands them out by name, as cuGetProcAddress does.

pub(crate) mod array;
pub(crate) mod capture;
pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod device;
pub(crate) mod error_strings;
pub(crate) mod graph;
pub(crate) mod graph_nodes;
pub(crate) mod graph_pool;
pub(crate) mod launch;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod pool;
pub(crate) mod procaddr;
pub(crate) mod stream;
pub(crate) mod vmm;
