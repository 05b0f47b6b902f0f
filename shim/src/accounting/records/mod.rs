//! What the process has counted in the ledger, one record per kind of memory. Each owns
//! its lock and keeps its fields private; the flows that reserve, call the driver and
//! settle (`accounting/*.rs`) go through their methods.

pub mod allocs;
pub mod arrays;
pub mod contexts;
pub mod counted_pool;
pub mod graph_book;
pub mod pools;
pub mod untracked;
pub mod vmm_handles;
