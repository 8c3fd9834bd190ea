//! raylet-data's integration tests, one binary (each test still runs in a
//! process of its own under nextest): Datasets on real clusters, formats,
//! Parquet on a real S3-compatible server, Delta Lake tables, shuffles,
//! actor pools, bounded memory, node failure and training from Parquet.

mod common;

mod actor_pool;
mod all_to_all;
mod bounded_memory;
mod dataset;
mod delta;
mod formats;
mod node_failure;
mod parquet;
#[cfg(feature = "digits")]
mod train_from_parquet;
mod train_shards;
