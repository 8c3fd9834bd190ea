//! Sinks that run in a block's own task: the block's Arrow rows written as
//! one file, `block_NNNNNN.parquet` (or `.csv`, `.jsonl`), to the output storage, so that no
//! row passes through the driver, which records the file in the manifest.
//! A retried block writes the same name again, whole.

use arrow::array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};

use raylet_storage::{Storage, StorageOptions};

/// The file formats written from Arrow rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ArrowFormat {
    /// Snappy-compressed Parquet.
    Parquet,
    /// A header line, then a line per row.
    Csv,
    /// A JSON object per line.
    Jsonl,
}

impl ArrowFormat {
    fn extension(self) -> &'static str {
        match self {
            ArrowFormat::Parquet => "parquet",
            ArrowFormat::Csv => "csv",
            ArrowFormat::Jsonl => "jsonl",
        }
    }

    /// `batches` as a file of this format.
    pub fn encode(self, batches: &[RecordBatch]) -> Result<Vec<u8>, String> {
        let Some(first) = batches.first() else {
            return Ok(Vec::new());
        };
        let error = |e: &dyn std::fmt::Display| format!("encoding {self:?}: {e}");
        match self {
            ArrowFormat::Parquet => parquet_bytes(first, batches).map_err(|e| error(&e)),
            ArrowFormat::Csv => {
                let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(Vec::new());
                for batch in batches {
                    writer.write(batch).map_err(|e| error(&e))?;
                }
                Ok(writer.into_inner())
            }
            ArrowFormat::Jsonl => {
                let mut writer = arrow::json::LineDelimitedWriter::new(Vec::new());
                writer
                    .write_batches(&batches.iter().collect::<Vec<_>>())
                    .map_err(|e| error(&e))?;
                writer.finish().map_err(|e| error(&e))?;
                Ok(writer.into_inner())
            }
        }
    }
}

/// Where and how a run's blocks are written.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TaskSink {
    pub location: String,
    pub storage: StorageOptions,
    pub format: ArrowFormat,
}

impl TaskSink {
    /// Writes block `index`'s rows; returns the names of the files written
    /// (none for a block without rows).
    pub fn write(&self, index: usize, batches: &[RecordBatch]) -> Result<Vec<String>, String> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = self.format.encode(batches)?;
        let name = format!("block_{index:06}.{}", self.format.extension());
        let storage = Storage::open(&self.location, &self.storage).map_err(|e| e.to_string())?;
        storage.write(&name, Bytes::from(bytes)).map_err(|e| e.to_string())?;
        Ok(vec![name])
    }
}

/// The rows as a Snappy-compressed Parquet file. Floating-point columns
/// are written without a dictionary: their values rarely repeat, and
/// building a dictionary of them before giving up on it took a tenth of a
/// write's time.
fn parquet_bytes(first: &RecordBatch, batches: &[RecordBatch]) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    let mut properties = WriterProperties::builder().set_compression(Compression::SNAPPY);
    for field in first.schema().fields() {
        if field.data_type().is_floating() {
            properties = properties.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), false);
        }
    }
    let properties = properties.build();
    let mut writer = ArrowWriter::try_new(Vec::new(), first.schema(), Some(properties))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.into_inner()
}
