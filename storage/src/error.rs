//! What can go wrong with a storage, each error naming its file or location.

use std::path::PathBuf;

/// An error of a storage call.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file could not be read.
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Object storage refused or failed a call (a bucket that does not
    /// exist, bad credentials, an unreachable endpoint).
    #[error("{location}: {message}")]
    Remote { location: String, message: String },
    /// A location that names no storage this build knows.
    #[error("{0}")]
    InvalidLocation(String),
}

impl StorageError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StorageError::Io {
            context: context.into(),
            source,
        }
    }
}
