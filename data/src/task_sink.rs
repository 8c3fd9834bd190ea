//! Sinks that run in a block's own task: the block's Arrow rows written as
//! one file, `block_NNNNNN.parquet` (or `.csv`, `.jsonl`), to the output storage, so that no
//! row passes through the driver, which records the file in the manifest.
//! A retried block writes the same name again, whole.

use arrow::array::RecordBatch;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use raylet_storage::{Storage, StorageError, StorageOptions};

use crate::rows_error::RowsError;

/// Why a block's rows could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SinkError {
    #[error("encoding {format:?}: {source}")]
    Arrow {
        format: ArrowFormat,
        #[source]
        source: arrow::error::ArrowError,
    },
    #[cfg(feature = "parquet")]
    #[error("encoding Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("encoding CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("encoding CSV: {0}")]
    CsvBuffer(#[source] std::io::Error),
    #[error(transparent)]
    Rows(#[from] RowsError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The file formats written from Arrow rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ArrowFormat {
    /// Snappy-compressed Parquet.
    #[cfg(feature = "parquet")]
    Parquet,
    /// A header line, then a line per row.
    Csv,
    /// A JSON object per line.
    Jsonl,
}

impl ArrowFormat {
    fn extension(self) -> &'static str {
        match self {
            #[cfg(feature = "parquet")]
            ArrowFormat::Parquet => "parquet",
            ArrowFormat::Csv => "csv",
            ArrowFormat::Jsonl => "jsonl",
        }
    }

    /// `batches` as a file of this format.
    pub fn encode(self, batches: &[RecordBatch]) -> Result<Vec<u8>, SinkError> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let error = |source| SinkError::Arrow { format: self, source };
        match self {
            #[cfg(feature = "parquet")]
            ArrowFormat::Parquet => Ok(parquet_bytes(batches)?),
            ArrowFormat::Csv => {
                let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(Vec::new());
                for batch in batches {
                    writer.write(batch).map_err(error)?;
                }
                Ok(writer.into_inner())
            }
            ArrowFormat::Jsonl => {
                let mut writer = arrow::json::LineDelimitedWriter::new(Vec::new());
                writer
                    .write_batches(&batches.iter().collect::<Vec<_>>())
                    .map_err(error)?;
                writer.finish().map_err(error)?;
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
    pub fn write(&self, index: usize, batches: &[RecordBatch]) -> Result<Vec<String>, SinkError> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = self.format.encode(batches)?;
        let name = format!("block_{index:06}.{}", self.format.extension());
        let storage = Storage::open(&self.location, &self.storage)?;
        storage.write(&name, Bytes::from(bytes))?;
        Ok(vec![name])
    }
}

/// The rows of `batches` (at least one, all of the first one's schema) as
/// a Snappy-compressed Parquet file. Floating-point columns are written
/// without a dictionary: their values rarely repeat, and building a
/// dictionary of them before giving up on it took a tenth of a write's
/// time.
#[cfg(feature = "parquet")]
fn parquet_bytes(batches: &[RecordBatch]) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    use parquet::schema::types::ColumnPath;

    let schema = batches[0].schema();
    let mut properties = WriterProperties::builder().set_compression(Compression::SNAPPY);
    for field in schema.fields() {
        if field.data_type().is_floating() {
            properties = properties.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), false);
        }
    }
    let properties = properties.build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(properties))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.into_inner()
}
