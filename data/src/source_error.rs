//! What can go wrong reading a block's input files in its task: the file
//! cannot be fetched, or is not what its reader expects (not Parquet, a
//! CSV row that does not parse, an image that does not decode, text that
//! is not UTF-8, a column that is not there).

use arrow::error::ArrowError;
#[cfg(feature = "parquet")]
use parquet::errors::ParquetError;

use crate::rows_error::RowsError;

/// A failure reading one input file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error(transparent)]
    Storage(#[from] raylet_storage::StorageError),
    #[cfg(feature = "parquet")]
    #[error("{0}")]
    Open(#[source] std::io::Error),
    #[cfg(feature = "parquet")]
    #[error("not a readable Parquet file: {0}")]
    NotParquet(#[source] ParquetError),
    #[cfg(feature = "parquet")]
    #[error("{0}")]
    Parquet(#[from] ParquetError),
    #[cfg(feature = "parquet")]
    #[error("no column {0}")]
    NoColumn(String),
    #[error(transparent)]
    Rows(#[from] RowsError),
    #[error("read_csv ran without a schema")]
    NoCsvSchema,
    #[error("reading CSV: {0}")]
    Csv(#[source] ArrowError),
    #[error("not UTF-8 text: {0}")]
    NotText(#[from] std::str::Utf8Error),
    #[cfg(feature = "images")]
    #[error("not a decodable image: {0}")]
    Image(#[source] image::ImageError),
    #[cfg(not(feature = "images"))]
    #[error("read_images needs raylet-data's `images` feature")]
    ImagesOff,
}
