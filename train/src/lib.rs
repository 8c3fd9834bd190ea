//! raylet-train: data-parallel training on a raylet cluster.
//!
//! - [`Trainer`] runs a [`TrainLoop`] on a gang of worker actors placed
//!   all at once, streams their reports, keeps checkpoints, and restarts
//!   the workers from the latest one when one fails.
//! - [`collective`] is how the workers exchange gradients and parameters:
//!   ranks meet through the cluster's key-value store, then talk over
//!   direct TCP.
//! - [`model_sync`] keeps burn model replicas in step over a group, and
//!   [`schedule`] has the learning-rate scaling and early stopping that
//!   data parallelism calls for.
//! - [`TensorRef`] stores a tensor on any device as a cluster object, read
//!   back onto the getter's device.
//! - [`sharding`] trains with ZeRO's stages: each rank keeps only its share
//!   of the optimizer state, gradients and parameters.
//! - [`TrainCallback`]s are told of a run's start, reports, checkpoints
//!   and end; [`mlflow`] has one that tracks runs on an MLflow server.
//! - [`digits`] (feature `digits`) has a train loop for the digits data
//!   set and model of raylet-models.
//!
//! The burn parts (model and optimizer checkpoints, `TrainContext::device`,
//! `TensorRef`, tensor collectives, `model_sync`, `sharding`) are the
//! default feature `burn`; raylet-tune uses the crate without them.

mod callback;
mod checkpoint;
pub mod collective;
mod config;
mod context;
mod cuda_runtime;
#[cfg(feature = "digits")]
pub mod digits;
mod error;
mod metrics;
pub mod mlflow;
#[cfg(feature = "burn")]
pub mod model_sync;
pub mod schedule;
#[cfg(feature = "burn")]
pub mod sharding;
mod telemetry;
#[cfg(feature = "burn")]
mod tensor_objects;
#[cfg(feature = "testing")]
pub mod testing;
mod train_loop;
mod trainer;
mod worker;
mod worker_event;

pub use callback::{RunStart, TrainCallback};
pub use checkpoint::{Checkpoint, CheckpointMetadata, RunDirectory};
pub use config::{
    BatchScaling, CheckpointConfig, ElasticScaling, FailureConfig, Placement, RunConfig, ScalingConfig, ScoreMode,
    WorkerResources, default_storage_path,
};
pub use context::TrainContext;
#[cfg(feature = "burn")]
pub use context::cpu_device;
pub use cuda_runtime::check_cuda_runtime;
pub use error::TrainError;
pub use metrics::Metrics;
#[cfg(feature = "burn")]
pub use tensor_objects::TensorRef;
pub use train_loop::{TrainLoop, config_json};
pub use trainer::{Report, TrainResult, Trainer};

#[doc(hidden)]
pub use train_loop::__private;
