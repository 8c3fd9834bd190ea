//! Checkpoints: a directory of files that a run can restart from. Rank 0
//! writes the model (burnpack), the optimizer state and its own progress
//! (epoch, step) into one, and reports it; the run's directory keeps the
//! reported ones, and the run's retention policy decides which stay. A
//! checkpoint of a run in object storage is also there, and is copied into
//! its local directory on a node that reads it without having it.

mod retention;
mod run_directory;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use raylet_storage::{Storage, StorageOptions};

#[cfg(feature = "burn")]
use burn::module::Module;
#[cfg(feature = "burn")]
use burn::optim::ModuleOptimizer;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Metrics, TrainError};

pub(crate) use retention::Retention;
pub use run_directory::RunDirectory;

/// The model's parameters, as a burnpack file.
#[cfg(feature = "burn")]
const MODEL_FILE: &str = "model.bpk";
/// The optimizer's state, as a burnpack file.
#[cfg(feature = "burn")]
const OPTIMIZER_FILE: &str = "optimizer.bpk";
/// The train loop's own progress, as JSON.
const STATE_FILE: &str = "state.json";
/// Which report the checkpoint came with, written when it is committed.
const METADATA_FILE: &str = ".raylet_checkpoint.json";

/// A checkpoint directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    path: PathBuf,
    /// Where the checkpoint is in object storage, for a mirrored run.
    #[serde(default)]
    remote: Option<Remote>,
}

/// A folder in object storage and how to open it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Remote {
    pub location: String,
    pub options: StorageOptions,
}

impl Remote {
    pub(crate) fn storage(&self) -> Result<Storage, TrainError> {
        Storage::open(&self.location, &self.options).map_err(TrainError::from)
    }

    pub(crate) fn child(&self, name: &str) -> Remote {
        Remote {
            location: format!("{}/{name}", self.location),
            options: self.options.clone(),
        }
    }
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
        Checkpoint {
            path: path.into(),
            remote: None,
        }
    }

    /// Where the checkpoint is in object storage (`s3://…`), for a run
    /// kept there.
    pub fn remote_location(&self) -> Option<&str> {
        self.remote.as_ref().map(|remote| remote.location.as_str())
    }

    /// Uploads the checkpoint's files to `remote`, its metadata last: the
    /// mark that the checkpoint there is whole.
    fn upload(&self, remote: &Remote) -> Result<(), TrainError> {
        let storage = remote.storage()?;
        let local = Storage::Local(self.path.clone());
        let mut files = local.list().map_err(|e| TrainError::checkpoint(&self.path, e))?;
        files.sort_by_key(|(name, _)| name == METADATA_FILE);
        for (name, _) in files {
            let bytes = local.read(&name).map_err(|e| TrainError::checkpoint(&self.path, e))?;
            storage
                .write(&name, bytes)
                .map_err(|e| TrainError::checkpoint(&self.path, e))?;
        }
        Ok(())
    }

    /// Makes sure the checkpoint's files are in its local directory: one of
    /// a run in object storage is copied there whole (into a folder beside
    /// it, renamed into place) when missing.
    pub(crate) fn ensure_local(&self) -> Result<(), TrainError> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        if self.path.join(METADATA_FILE).exists() {
            return Ok(());
        }
        let storage = remote.storage()?;
        let copy = self.path.with_extension(format!("download-{}", std::process::id()));
        let local = Storage::Local(copy.clone());
        for (name, _) in storage.list().map_err(|e| TrainError::checkpoint(&self.path, e))? {
            let bytes: Bytes = storage.read(&name).map_err(|e| TrainError::checkpoint(&self.path, e))?;
            local
                .write(&name, bytes)
                .map_err(|e| TrainError::checkpoint(&self.path, e))?;
        }
        if self.path.exists() {
            std::fs::remove_dir_all(&self.path).map_err(|e| TrainError::checkpoint(&self.path, e))?;
        }
        std::fs::rename(&copy, &self.path).map_err(|e| TrainError::checkpoint(&self.path, e))
    }

    /// Deletes the checkpoint, here and in object storage.
    pub(crate) fn remove(&self) -> Result<(), TrainError> {
        if self.path.exists() {
            std::fs::remove_dir_all(&self.path).map_err(|e| TrainError::checkpoint(&self.path, e))?;
        }
        if let Some(remote) = &self.remote {
            let (parent, name) = remote.location.rsplit_once('/').expect("a checkpoint's folder");
            let parent = Storage::open(parent, &remote.options).map_err(|e| TrainError::checkpoint(&self.path, e))?;
            parent
                .delete_folder(name)
                .map_err(|e| TrainError::checkpoint(&self.path, e))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which report the checkpoint came with, and its metrics.
    pub fn metadata(&self) -> Result<CheckpointMetadata, TrainError> {
        self.ensure_local()?;
        self.read_json(METADATA_FILE)
    }

    /// Writes `model`'s parameters.
    #[cfg(feature = "burn")]
    pub fn save_model<M: Module>(&self, model: &M) -> Result<(), TrainError> {
        let path = self.path.join(MODEL_FILE);
        model
            .clone()
            .save_file(&path)
            .map_err(|e| TrainError::checkpoint(path, e))
    }

    /// `model` with the parameters of the checkpoint (their ids included).
    #[cfg(feature = "burn")]
    pub fn load_model<M: Module>(&self, model: M) -> Result<M, TrainError> {
        self.ensure_local()?;
        let path = self.path.join(MODEL_FILE);
        model.try_load_file(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// Writes `optimizer`'s state (momentum, Adam's moments, ...).
    #[cfg(feature = "burn")]
    pub fn save_optimizer(&self, optimizer: &ModuleOptimizer) -> Result<(), TrainError> {
        let path = self.path.join(OPTIMIZER_FILE);
        optimizer.save(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// `optimizer` with the state of the checkpoint.
    #[cfg(feature = "burn")]
    pub fn load_optimizer(&self, optimizer: ModuleOptimizer) -> Result<ModuleOptimizer, TrainError> {
        self.ensure_local()?;
        let path = self.path.join(OPTIMIZER_FILE);
        optimizer.load(&path).map_err(|e| TrainError::checkpoint(path, e))
    }

    /// Writes the train loop's own progress, such as its epoch and step.
    pub fn save_state<S: Serialize>(&self, state: &S) -> Result<(), TrainError> {
        self.write_json(STATE_FILE, state)
    }

    pub fn load_state<S: DeserializeOwned>(&self) -> Result<S, TrainError> {
        self.ensure_local()?;
        self.read_json(STATE_FILE)
    }

    /// Writes a file of the train loop's own beside the model, such as the
    /// tokenizer it was trained with.
    pub fn save_file(&self, name: &str, contents: &[u8]) -> Result<(), TrainError> {
        let path = self.path.join(name);
        std::fs::write(&path, contents).map_err(|e| TrainError::checkpoint(path, e))
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
