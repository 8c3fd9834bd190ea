//! raylet-tune: parallel hyperparameter search on a raylet cluster.
//!
//! - [`search`]: search spaces, and the searchers that draw trials from
//!   them (grid and random, TPE, or your own [`search::Searcher`]).
//! - [`schedulers`]: what happens to a trial after each result (FIFO,
//!   ASHA, HyperBand, median stopping, PBT, or your own).
//! - [`Tuner`] runs a registered trainable function once per trial, each
//!   in an actor with its own resources, and returns a [`ResultGrid`].
//! - [`stopper`]: rules that end trials or the experiment.
//! - [`Callback`]s are told of the experiment's and its trials' progress;
//!   [`MlflowCallback`] tracks the experiment on an MLflow server, each
//!   trial a child run of the experiment's run.
//! - [`digits`] (feature `digits`): a trainable for raylet-models' digits
//!   MLP, for examples and benchmarks.

mod callback;
mod checkpoint_transfer;
mod config;
mod context;
#[cfg(feature = "digits")]
pub mod digits;
mod error;
mod mlflow;
mod result_grid;
mod runner;
pub mod schedulers;
pub mod search;
pub mod stopper;
mod trainable;
mod trial;
mod trial_event;
mod tuner;

pub use callback::{Callback, ExperimentStart};
pub use checkpoint_transfer::PackedCheckpoint;
pub use config::TrialConfig;
pub use context::TrialContext;
pub use error::TuneError;
pub use raylet_storage::StorageOptions;
pub use raylet_train::mlflow::MlflowCallback;
pub use raylet_train::{Checkpoint, Metrics, ScoreMode as Mode};
pub use result_grid::{ResultGrid, TrialResult};
pub use trainable::{TrainableFn, TrainableResult};
pub use trial::{TrialStatus, TrialView};
pub use tuner::{RunConfig, TrialResources, TuneConfig, Tuner};

#[doc(hidden)]
pub use trainable::__private;
