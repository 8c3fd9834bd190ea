//! A run's directory: `checkpoint_000042/` for every committed checkpoint,
//! `.staging/` for those being written, and `metrics.jsonl` with every
//! report. A checkpoint is committed by renaming its finished directory, so
//! a run never restarts from a half-written one. A run in object storage
//! (`s3://bucket/prefix`) keeps this directory as a local copy on each node
//! and mirrors it: a committed checkpoint's files are uploaded, its
//! metadata last, and only a checkpoint whose metadata is there counts.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use raylet_storage::StorageOptions;
use serde::{Deserialize, Serialize};

use super::{Checkpoint, CheckpointMetadata, METADATA_FILE, Remote};
use crate::{Metrics, TrainError};

const STAGING: &str = ".staging";
const CHECKPOINT_PREFIX: &str = "checkpoint_";
const METRICS_FILE: &str = "metrics.jsonl";

/// The directory of one run (or of one Tune trial).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunDirectory {
    root: PathBuf,
    /// Where the run is mirrored in object storage.
    remote: Option<Remote>,
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
        Ok(RunDirectory { root, remote: None })
    }

    /// The directory of run `name` under `storage_path`: a local directory,
    /// or for an object storage URL (`s3://bucket/prefix`, opened with
    /// `options` over the `AWS_*` variables) a local copy under the
    /// system's temporary directory, mirrored to `storage_path/name`.
    pub fn for_run(storage_path: &Path, name: &str, options: &StorageOptions) -> Result<Self, TrainError> {
        let location = storage_path.to_string_lossy();
        if !raylet_storage::is_url(&location) || location.starts_with("file://") {
            let local = location
                .strip_prefix("file://")
                .map_or(storage_path.to_path_buf(), PathBuf::from);
            return Self::create(local.join(name));
        }
        let remote = Remote {
            location: format!("{}/{name}", location.trim_end_matches('/')),
            options: options.clone(),
        };
        let copy = xxhash_rust::xxh3::xxh3_64(remote.location.as_bytes());
        let root = std::env::temp_dir().join(format!("raylet-runs/{copy:016x}")).join(name);
        let mut directory = Self::create(root)?;
        directory.remote = Some(remote);
        Ok(directory)
    }

    /// The directory of a run that a worker was told about.
    pub fn open(root: PathBuf) -> Self {
        RunDirectory { root, remote: None }
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
        let mut checkpoint = Checkpoint::from_directory(target);
        if let Some(remote) = &self.remote {
            let remote = remote.child(&format!("{CHECKPOINT_PREFIX}{index:06}"));
            checkpoint.upload(&remote)?;
            checkpoint.remote = Some(remote);
        }
        Ok(checkpoint)
    }

    /// Every committed checkpoint, oldest first (of a mirrored run: those
    /// whose metadata is in object storage, copied here when first read).
    pub fn committed(&self) -> Result<Vec<(Checkpoint, CheckpointMetadata)>, TrainError> {
        if let Some(remote) = &self.remote {
            return self.committed_remotely(remote);
        }
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

    fn committed_remotely(&self, remote: &Remote) -> Result<Vec<(Checkpoint, CheckpointMetadata)>, TrainError> {
        let mut found = Vec::new();
        for (name, _) in remote.storage()?.list().map_err(TrainError::from)? {
            let Some((folder, file)) = name.split_once('/') else {
                continue;
            };
            if !folder.starts_with(CHECKPOINT_PREFIX) || file != METADATA_FILE {
                continue;
            }
            let checkpoint = Checkpoint {
                path: self.root.join(folder),
                remote: Some(remote.child(folder)),
            };
            found.push((checkpoint.metadata()?, checkpoint));
        }
        found.sort_by_key(|(metadata, _)| metadata.index);
        Ok(found
            .into_iter()
            .map(|(metadata, checkpoint)| (checkpoint, metadata))
            .collect())
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
        writeln!(file, "{line}").map_err(|e| TrainError::io(format!("writing {}", path.display()), e))?;
        if let Some(remote) = &self.remote {
            let text = std::fs::read(&path).map_err(|e| TrainError::io(format!("reading {}", path.display()), e))?;
            let storage = remote.storage()?;
            storage
                .write(METRICS_FILE, Bytes::from(text))
                .map_err(TrainError::from)?;
        }
        Ok(())
    }
}
