//! raylet-data: streaming batch processing over file sets and items on a
//! raylet cluster. A [`Dataset`] is a lazy plan: a source (files read whole
//! or by line, or items), then transforms (`map`, `flat_map`, `filter`,
//! `map_batches`) whose functions are registered so that workers can find
//! them, and at most one model stage (`map_batches_with`) run by a pool of
//! actors that load the model once. Each block of inputs runs through all
//! transforms in one task (or one actor call); a
//! bounded number of blocks is in flight at once; sinks write one file per
//! block atomically with a manifest, so every input's rows appear exactly
//! once and a rerun skips the blocks already written.
//!
//! ```no_run
//! use raylet_data::{Dataset, FileBytes, FileSet, register_map};
//!
//! /// A file's length in characters. A function may fail with any error
//! /// type that displays: here a file that is not UTF-8 fails the run with
//! /// a `DataError::Row` naming the function, the file and this message.
//! fn characters(file: FileBytes) -> Result<(String, usize), std::str::Utf8Error> {
//!     let text = std::str::from_utf8(&file.bytes)?;
//!     Ok((file.path, text.chars().count()))
//! }
//! register_map!(characters);
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! raylet::init()?;
//! let summary = Dataset::read_binary(FileSet::glob("notes/*.txt")).map(characters).write_jsonl("lengths")?;
//! println!("{} rows in {} files", summary.rows, summary.files.len());
//! # Ok(())
//! # }
//! ```

mod actor_pool;
mod batching;
mod block;
mod block_output;
mod block_rows;
mod columnar;
mod csv_source;
mod dataset;
#[cfg(feature = "parquet")]
mod delta_source;
#[cfg(feature = "digits")]
pub mod digits;
mod encoded_rows;
mod equal_split;
mod error;
mod exchange;
mod exchange_phase;
mod execution;
mod files;
mod image_source;
mod macros;
mod manifest;
mod model;
mod model_registry;
#[cfg(feature = "parquet")]
mod parquet_source;
mod plan;
#[cfg(feature = "parquet")]
mod predicate;
mod progress;
mod registry;
mod row;
mod rows_error;
mod sink;
mod source_error;
mod stage;
mod streaming_split;
mod task;
mod task_sink;

pub use actor_pool::ActorPoolStrategy;
pub use arrow;
pub use arrow::array::RecordBatch;
pub use batching::{ArrowBatchIter, BatchIter};
pub use block::{BlockSizing, FileBytes, TextLine};
pub use columnar::Arrow;
pub use csv_source::CsvOptions;
pub use dataset::{Dataset, GroupedDataset};
pub use error::DataError;
pub use exchange::Aggregation;
pub use execution::StageMemory;
pub use files::FileSet;
pub use image_source::{Image, ImageMode, ImageOptions};
pub use model::{BatchModel, LoadError, ModelError};
#[cfg(feature = "parquet")]
pub use parquet_source::ParquetOptions;
#[cfg(feature = "parquet")]
pub use predicate::{Comparison, Predicate, Value};
pub use raylet_storage::StorageOptions;
pub use row::Row;
pub use rows_error::RowsError;
pub use sink::WriteSummary;
pub use stage::{OnError, RowError, StageKind};
pub use streaming_split::{DataShard, ShardBatches, SplitError, StreamingSplit};

#[doc(hidden)]
pub use macros::__private;
