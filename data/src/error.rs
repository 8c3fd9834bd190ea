//! What can go wrong in a dataset's run, each error naming what it is about.

use std::path::PathBuf;

/// An error of a dataset: building its plan, reading its inputs, running
/// its functions, or writing its outputs.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A function or model given to a transform was not registered, so
    /// workers cannot find it.
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// An input file could not be read.
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    /// A function failed on a row; `input` names the row's input file
    /// (or item index).
    #[error("{function} failed on {input}: {message}")]
    Row {
        function: String,
        input: String,
        message: String,
    },
    /// Object storage refused or failed a call (a bucket that does not
    /// exist, bad credentials, an unreachable endpoint).
    #[error("{location}: {message}")]
    Storage { location: String, message: String },
    /// An input is not what its reader expects (a corrupt Parquet file, an
    /// image that does not decode, a column that is not there).
    #[error("{input}: {message}")]
    Format { input: String, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// An output directory holds a manifest of another dataset's blocks.
    #[error("{0}")]
    Manifest(String),
    /// A block's task failed in the cluster (its worker died on every
    /// attempt, or it could not be placed).
    #[error("block {block} ({inputs}): {source}")]
    Task {
        block: usize,
        inputs: String,
        #[source]
        source: raylet::Error,
    },
    /// A block's rows could not be decoded, joined or reordered.
    #[error("a block's rows: {0}")]
    Rows(#[from] crate::RowsError),
    #[error(transparent)]
    Cluster(#[from] raylet::Error),
}

impl DataError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DataError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<raylet_storage::StorageError> for DataError {
    fn from(error: raylet_storage::StorageError) -> Self {
        use raylet_storage::StorageError;
        match error {
            StorageError::Read { path, message } => DataError::Read { path, message },
            StorageError::Io { context, source } => DataError::Io { context, source },
            StorageError::Remote { location, message } => DataError::Storage { location, message },
            StorageError::InvalidLocation(message) => DataError::InvalidInput(message),
        }
    }
}
