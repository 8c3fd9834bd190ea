//! A run's directory: `checkpoint_000042/` for every committed checkpoint,
//! `.staging/` for those being written, and `metrics.jsonl` with every
//! report. A checkpoint is committed by renaming its finished directory, so
//! a run never restarts from a half-written one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Checkpoint, CheckpointMetadata, METADATA_FILE};
use crate::{Metrics, TrainError};

const STAGING: &str = ".staging";
const CHECKPOINT_PREFIX: &str = "checkpoint_";
const METRICS_FILE: &str = "metrics.jsonl";

/// The directory of one run (or of one Tune trial).
#[derive(Clone, Debug)]
pub struct RunDirectory {
    root: PathBuf,
}

impl RunDirectory {
    /// The run directory at `root`, made if missing; checkpoints left half
    /// written by an earlier run are removed.
    pub fn create(root: PathBuf) -> Result<Self, TrainError> {
        std::fs::create_dir_all(&root).map_err(|e| TrainError::io(format!("creating {}", root.display()), e))?;
        let staging = root.join(STAGING);
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .map_err(|e| TrainError::io(format!("clearing {}", staging.display()), e))?;
        }
        Ok(RunDirectory { root })
    }

    /// The directory of a run that a worker was told about.
    pub fn open(root: PathBuf) -> Self {
        RunDirectory { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A fresh, empty directory for `rank` to write a checkpoint into.
    pub fn stage(&self, rank: usize) -> Result<Checkpoint, TrainError> {
        static STAGED: AtomicU64 = AtomicU64::new(0);
        let number = STAGED.fetch_add(1, Ordering::Relaxed);
        let path = self
            .root
            .join(STAGING)
            .join(format!("rank{rank}-pid{}-{number}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| TrainError::io(format!("creating {}", path.display()), e))?;
        Ok(Checkpoint::from_directory(path))
    }

    /// Makes `staged` the checkpoint of report `index`: its metadata is
    /// written, then it is renamed into place.
    pub fn commit(&self, staged: &Checkpoint, index: u64, metrics: &Metrics) -> Result<Checkpoint, TrainError> {
        let metadata = CheckpointMetadata {
            index,
            metrics: metrics.clone(),
        };
        staged.write_json(METADATA_FILE, &metadata)?;
        let target = self.root.join(format!("{CHECKPOINT_PREFIX}{index:06}"));
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(|e| TrainError::checkpoint(&target, e))?;
        }
        std::fs::rename(staged.path(), &target).map_err(|e| TrainError::checkpoint(&target, e))?;
        Ok(Checkpoint::from_directory(target))
    }

    /// Every committed checkpoint, oldest first.
    pub fn committed(&self) -> Result<Vec<(Checkpoint, CheckpointMetadata)>, TrainError> {
        let entries =
            std::fs::read_dir(&self.root).map_err(|e| TrainError::io(format!("reading {}", self.root.display()), e))?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let is_checkpoint = entry.file_name().to_string_lossy().starts_with(CHECKPOINT_PREFIX);
            if !is_checkpoint {
                continue;
            }
            let checkpoint = Checkpoint::from_directory(entry.path());
            if let Ok(metadata) = checkpoint.metadata() {
                found.push((checkpoint, metadata));
            }
        }
        found.sort_by_key(|(_, metadata)| metadata.index);
        Ok(found)
    }

    /// `metrics.jsonl`: a line per report.
    pub fn metrics_file(&self) -> PathBuf {
        self.root.join(METRICS_FILE)
    }

    /// Appends one report to `metrics.jsonl`.
    pub fn append_metrics(&self, line: &serde_json::Value) -> Result<(), TrainError> {
        let path = self.metrics_file();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainError::io(format!("opening {}", path.display()), e))?;
        writeln!(file, "{line}").map_err(|e| TrainError::io(format!("writing {}", path.display()), e))
    }
}
