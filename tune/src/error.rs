//! What a search can fail with: one error type for the driver's `fit`,
//! for searchers and schedulers, and for trainables on the workers.

use std::path::PathBuf;

use raylet_storage::StorageError;
use raylet_train::TrainError;
use raylet_train::mlflow::MlflowError;

/// Why a search, or one trial of it, failed.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error("invalid tune configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid search space: {0}")]
    InvalidSearchSpace(String),
    /// The trainable is not registered, so trial workers cannot run it.
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error(transparent)]
    Cluster(#[from] raylet::Error),
    /// Training failed (a storage failure of Train's is [`TuneError::Storage`]).
    #[error(transparent)]
    Train(TrainError),
    /// The experiment's storage refused or failed a call: an unknown
    /// scheme, a missing bucket, bad credentials, an unreachable endpoint.
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("experiment {path}: {message}")]
    Experiment { path: PathBuf, message: String },
    /// What `report` returns once the scheduler stopped or paused the trial:
    /// the trainable should return.
    #[error("the scheduler stopped this trial")]
    TrialStopped,
    #[error("{0}")]
    Trainable(String),
}

impl TuneError {
    /// An I/O error, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TuneError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<TrainError> for TuneError {
    fn from(error: TrainError) -> Self {
        match error {
            TrainError::Storage(error) => TuneError::Storage(error),
            error => TuneError::Train(error),
        }
    }
}

impl From<MlflowError> for TuneError {
    fn from(error: MlflowError) -> Self {
        TuneError::Train(error.into())
    }
}
