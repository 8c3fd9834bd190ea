//! The error type of the raylet crate.

use std::path::PathBuf;

/// An error from raylet's user API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster answered with an error, or could not be reached.
    #[error(transparent)]
    Cluster(#[from] raylet_proto::Error),
    /// The session directory is missing, unreadable or corrupt.
    #[error("{} {message}", path.display())]
    Session { path: PathBuf, message: String },
}

/// Result with the raylet [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn session(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Session {
            path: path.into(),
            message: message.into(),
        }
    }
}
