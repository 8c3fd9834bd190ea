//! MLflow tracking, as Ray's `MLflowLoggerCallback`: [`MlflowCallback`]
//! records a Train run, or a Tune experiment (raylet-tune implements its
//! callback trait for the same type), on an MLflow tracking server through
//! its REST API (MLflow 2.x and 3.x).
//!
//! What a run becomes: an MLflow run in the experiment named by
//! [`MlflowCallback::experiment_name`] (by default the Train run's or the
//! Tune experiment's name; made if missing), named after the run, with the
//! callback's tags. Its params are the train loop's config (a Tune
//! trial's: its sampled config) flattened into dotted keys, plus the
//! scaling; every report logs each metric at step = the report's index (a
//! trial's `training_iteration`); each checkpoint's files go up as
//! artifacts under `checkpoints/<checkpoint directory>/` when
//! [`MlflowCallback::save_artifact`] is on; the run ends `FINISHED` or
//! `FAILED`. A Tune experiment is a parent run, each trial a child run of
//! it (tag `mlflow.parentRunId`); trials still open when the experiment
//! ends are ended `KILLED`.
//!
//! The calls: `experiments/get-by-name` and `experiments/create`,
//! `runs/create`, `runs/log-batch` (at most 100 params or 1000 metrics a
//! call), `runs/update`, and artifacts through the server's proxy
//! (`PUT /api/2.0/mlflow-artifacts/artifacts/...`), which needs a server
//! that serves artifacts (the default of `mlflow server`; a run's
//! `artifact_uri` is then `mlflow-artifacts:/...`). Each call is one HTTP
//! request on raylet-storage's I/O runtime, so callers stay synchronous,
//! with a connect timeout of 5 s and a whole-call timeout of 60 s; nothing
//! is retried.
//!
//! On failure: tracking must not cost a training run, so by default a
//! failed call is a `tracing` warning naming the server, the call and why,
//! and the run goes on (a run whose `runs/create` failed is not tracked
//! further; a server that dies mid-run costs each later call a warning).
//! [`MlflowCallback::strict`] makes any failure end the run with
//! [`TrainError::Mlflow`](crate::TrainError::Mlflow) instead. A tracking
//! URI that is not an `http(s)://` URL is refused when the callback is
//! made.

mod callback;
mod client;
mod params;

pub use callback::{MlflowCallback, NewRun, RunPlace};
pub use client::{MlflowClient, RunHandle, RunStatus};
pub use params::flatten_params;

use std::path::PathBuf;

/// What MLflow tracking can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    #[error("MLflow tracking URI `{uri}`: {why}")]
    InvalidUri { uri: String, why: String },
    /// A call to the tracking server failed.
    #[error("MLflow at {server}: {call}: {failure}")]
    Call {
        server: String,
        call: String,
        failure: CallFailure,
    },
    #[error("MLflow: reading checkpoint {path} to upload it: {message}")]
    Checkpoint { path: PathBuf, message: String },
}

/// How one call to the tracking server failed.
#[derive(Debug, thiserror::Error)]
pub enum CallFailure {
    #[error("the server could not be reached: {0}")]
    Unreachable(String),
    /// The server answered with an error: its HTTP status, MLflow's error
    /// code (`RESOURCE_DOES_NOT_EXIST`, ...) and message.
    #[error("the server answered {status} {code}: {message}")]
    Refused { status: u16, code: String, message: String },
    #[error("the answer is not what the API says: {0}")]
    BadAnswer(String),
    /// The answer lacks a string the API promises.
    #[error("the answer has no string at {pointer}: {answer}")]
    MissingField { pointer: String, answer: String },
    #[error(
        "the run's artifact_uri `{0}` is not served by the tracking server: start it with artifact serving \
         (the default of `mlflow server`, or `--serve-artifacts`)"
    )]
    ArtifactsNotServed(String),
}

impl MlflowError {
    /// MLflow's error code, for a call the server refused.
    pub fn code(&self) -> Option<&str> {
        match self {
            MlflowError::Call {
                failure: CallFailure::Refused { code, .. },
                ..
            } => Some(code),
            _ => None,
        }
    }
}
