//! Checkpoints: a directory of files that a run can restart from. Rank 0
//! writes the model (burnpack), the optimizer state and its own progress
//! (epoch, step) into one, and reports it; the run's directory keeps the
//! reported ones, and the run's retention policy decides which stay.

mod retention;
mod run_directory;

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Metrics, TrainError};

pub(crate) use retention::Retention;
pub use run_directory::RunDirectory;

/// The model's parameters, as a burnpack file.
const MODEL_FILE: &str = "model.bpk";
/// The optimizer's state, as a burnpack file.
const OPTIMIZER_FILE: &str = "optimizer.bpk";
/// The train loop's own progress, as JSON.
const STATE_FILE: &str = "state.json";
/// Which report the checkpoint came with, written when it is committed.
const METADATA_FILE: &str = ".raylet_checkpoint.json";

/// A checkpoint directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    path: PathBuf,
}

/// What the run recorded with a committed checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The report it came with: 0 for the first report of the run.
    pub index: u64,
    pub metrics: Metrics,
}

impl Checkpoint {
    /// The checkpoint in `path`.
    pub fn from_directory(path: impl Into<PathBuf>) -> Self {
        Checkpoint { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which report the checkpoint came with, and its metrics.
    pub fn metadata(&self) -> Result<CheckpointMetadata, TrainError> {
        self.read_json(METADATA_FILE)
    }

    /// Writes `model`'s parameters.
    pub fn save_model<M: Module>(&self, model: &M) -> Result<(), TrainError> {
        let path = self.path.join(MODEL_FILE);
        model
            .clone()
            .save_file(&path)
            .map_err(|e| TrainError::checkpoint(path, e))
    }

    /// `model` with the parameters of the checkpoint (their ids included).
    pub fn load_model<M: Module>(&self, model: M) -> Result<M, TrainError> {
        let path = self.path.join(MODEL_FILE);
        model.try_load_file(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// Writes `optimizer`'s state (momentum, Adam's moments, ...).
    pub fn save_optimizer(&self, optimizer: &ModuleOptimizer) -> Result<(), TrainError> {
        let path = self.path.join(OPTIMIZER_FILE);
        optimizer.save(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// `optimizer` with the state of the checkpoint.
    pub fn load_optimizer(&self, optimizer: ModuleOptimizer) -> Result<ModuleOptimizer, TrainError> {
        let path = self.path.join(OPTIMIZER_FILE);
        optimizer.load(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// Writes the train loop's own progress, such as its epoch and step.
    pub fn save_state<S: Serialize>(&self, state: &S) -> Result<(), TrainError> {
        self.write_json(STATE_FILE, state)
    }

    pub fn load_state<S: DeserializeOwned>(&self) -> Result<S, TrainError> {
        self.read_json(STATE_FILE)
    }

    fn write_json<T: Serialize>(&self, file: &str, value: &T) -> Result<(), TrainError> {
        let path = self.path.join(file);
        let json = serde_json::to_vec_pretty(value).map_err(|e| TrainError::checkpoint(&path, e))?;
        std::fs::write(&path, json).map_err(|e| TrainError::checkpoint(path, e))
    }

    fn read_json<T: DeserializeOwned>(&self, file: &str) -> Result<T, TrainError> {
        let path = self.path.join(file);
        let json = std::fs::read(&path).map_err(|e| TrainError::checkpoint(&path, e))?;
        serde_json::from_slice(&json).map_err(|e| TrainError::checkpoint(path, e))
    }
}
