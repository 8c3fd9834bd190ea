//! What training can fail with: one error type for the driver's `fit` and
//! for the train loops that run on the workers.

use std::path::PathBuf;

use crate::collective::CollectiveError;
use crate::mlflow::MlflowError;
#[cfg(feature = "burn")]
use crate::sharding::ShardingError;

/// Why training, or one step of it, failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("invalid training configuration: {0}")]
    InvalidConfig(String),
    /// The train loop is not registered, so workers cannot run it.
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error(transparent)]
    Cluster(#[from] raylet::Error),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[cfg(feature = "burn")]
    #[error(transparent)]
    Sharding(#[from] ShardingError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// The run's object storage refused or failed a call.
    #[error(transparent)]
    Storage(#[from] raylet_storage::StorageError),
    /// MLflow tracking failed, and its callback is strict.
    #[error(transparent)]
    Mlflow(#[from] MlflowError),
    #[error("no dataset named `{name}` was given to the trainer (it has: {known})")]
    UnknownDataset { name: String, known: String },
    #[error(
        "training failed {failures} time(s), more than its max_failures of {max_failures}; the last failure: {last}"
    )]
    TooManyFailures {
        failures: u32,
        max_failures: u32,
        last: String,
    },
    /// The `cuda` backend cannot start: a library or CUDA's headers are
    /// missing.
    #[error("this worker cannot use its GPU: {0}")]
    GpuRuntime(String),
    #[error("{0}")]
    Loop(String),
}

impl TrainError {
    /// An I/O error, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TrainError::Io {
            context: context.into(),
            source,
        }
    }

    /// A checkpoint that could not be written or read.
    pub fn checkpoint(path: impl Into<PathBuf>, message: impl ToString) -> Self {
        TrainError::Checkpoint {
            path: path.into(),
            message: message.to_string(),
        }
    }
}

impl From<String> for TrainError {
    fn from(message: String) -> Self {
        TrainError::Loop(message)
    }
}

impl From<&str> for TrainError {
    fn from(message: &str) -> Self {
        TrainError::Loop(message.to_string())
    }
}
