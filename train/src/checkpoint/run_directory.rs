//! A run's directory: `checkpoint_000042/` for every committed checkpoint,
//! `.staging/` for those being written, `metrics.jsonl` with every report,
//! and files its owner writes whole (a Tune experiment's state, a trial's
//! `params.json`; a trial's directory is a child of its experiment's). A
//! checkpoint is committed by renaming its finished directory, so a run
//! never restarts from a half-written one. A run in object storage
//! (`s3://bucket/prefix`) keeps this directory as a local copy on each node
//! and mirrors it: a committed checkpoint's files are uploaded, its
//! metadata last, and only a checkpoint whose metadata is there counts;
//! other files are uploaded whole as they are written.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use raylet_storage::{Storage, StorageOptions};
use serde::{Deserialize, Serialize};

use super::{Checkpoint, CheckpointMetadata, METADATA_FILE, Remote};
use crate::{Metrics, TrainError};

const STAGING: &str = ".staging";
const CHECKPOINT_PREFIX: &str = "checkpoint_";

/// The directory of one run (or of one Tune trial).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunDirectory {
    root: PathBuf,
    /// Where the run is mirrored in object storage.
    remote: Option<Remote>,
}

impl RunDirectory {
    /// The file every report is appended to, a JSON object a line.
    pub const METRICS_FILE: &'static str = "metrics.jsonl";

    /// The run directory at `root`, made if missing; checkpoints left half
    /// written by an earlier run are removed.
    pub fn create(root: PathBuf) -> Result<Self, TrainError> {
        let directory = RunDirectory { root, remote: None };
        directory.prepare()?;
        Ok(directory)
    }

    /// The directory of run `name` under `storage_path`: a local directory,
    /// or for an object storage URL (`s3://bucket/prefix`, opened with
    /// `options` over the `AWS_*` variables) a local copy under the
    /// system's temporary directory, mirrored to `storage_path/name`.
    pub fn for_run(storage_path: &Path, name: &str, options: &StorageOptions) -> Result<Self, TrainError> {
        let directory = Self::locate(storage_path, name, options);
        directory.prepare()?;
        Ok(directory)
    }

    /// Where [`RunDirectory::for_run`] keeps run `name`, making nothing (to
    /// look for an earlier run before starting one).
    pub fn locate(storage_path: &Path, name: &str, options: &StorageOptions) -> Self {
        let location = storage_path.to_string_lossy();
        if !raylet_storage::is_url(&location) || location.starts_with("file://") {
            let local = location
                .strip_prefix("file://")
                .map_or(storage_path.to_path_buf(), PathBuf::from);
            return RunDirectory::open(local.join(name));
        }
        let remote = Remote {
            location: format!("{}/{name}", location.trim_end_matches('/')),
            options: options.clone(),
        };
        let copy = xxhash_rust::xxh3::xxh3_64(remote.location.as_bytes());
        let root = std::env::temp_dir().join(format!("raylet-runs/{copy:016x}")).join(name);
        RunDirectory {
            root,
            remote: Some(remote),
        }
    }

    /// Makes the local directory on this node if missing, and removes
    /// checkpoints left half written by an earlier run.
    pub fn prepare(&self) -> Result<(), TrainError> {
        let root = &self.root;
        std::fs::create_dir_all(root).map_err(|e| TrainError::io(format!("creating {}", root.display()), e))?;
        let staging = root.join(STAGING);
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .map_err(|e| TrainError::io(format!("clearing {}", staging.display()), e))?;
        }
        Ok(())
    }

    /// The directory `name` inside this one (a Tune trial's inside its
    /// experiment's), mirrored inside this one's folder in object storage;
    /// made by [`RunDirectory::prepare`].
    pub fn child(&self, name: &str) -> Self {
        RunDirectory {
            root: self.root.join(name),
            remote: self.remote.as_ref().map(|remote| remote.child(name)),
        }
    }

    /// The directory of a run that a worker was told about.
    pub fn open(root: PathBuf) -> Self {
        RunDirectory { root, remote: None }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the directory is kept: its folder in object storage
    /// (`s3://bucket/prefix/name`) for a mirrored run, else its local root.
    pub fn location(&self) -> PathBuf {
        match &self.remote {
            Some(remote) => PathBuf::from(&remote.location),
            None => self.root.clone(),
        }
    }

    /// The options that open its folder in object storage (none for a
    /// local directory).
    pub fn storage_options(&self) -> StorageOptions {
        self.remote
            .as_ref()
            .map(|remote| remote.options.clone())
            .unwrap_or_default()
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
        let checkpoint = self.checkpoint(index);
        let target = checkpoint.path();
        if target.exists() {
            std::fs::remove_dir_all(target).map_err(|e| TrainError::checkpoint(target, e))?;
        }
        std::fs::rename(staged.path(), target).map_err(|e| TrainError::checkpoint(target, e))?;
        if let Some(remote) = &checkpoint.remote {
            checkpoint.upload(remote)?;
        }
        Ok(checkpoint)
    }

    /// The checkpoint committed with report `index` (of a mirrored run: as
    /// object storage has it, copied here when first read).
    pub fn checkpoint(&self, index: u64) -> Checkpoint {
        self.checkpoint_in(&format!("{CHECKPOINT_PREFIX}{index:06}"))
    }

    fn checkpoint_in(&self, folder: &str) -> Checkpoint {
        Checkpoint {
            path: self.root.join(folder),
            remote: self.remote.as_ref().map(|remote| remote.child(folder)),
        }
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
            let checkpoint = self.checkpoint_in(folder);
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
        self.root.join(Self::METRICS_FILE)
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
        if self.remote.is_some() {
            let text = std::fs::read(&path).map_err(|e| TrainError::io(format!("reading {}", path.display()), e))?;
            self.mirror(Self::METRICS_FILE, Bytes::from(text))?;
        }
        Ok(())
    }

    /// Writes file `name` of the directory whole, here and in object
    /// storage: a reader sees the old file (or none) or all of the new one.
    pub fn write_file(&self, name: &str, bytes: impl Into<Bytes>) -> Result<(), TrainError> {
        let bytes = bytes.into();
        Storage::Local(self.root.clone()).write(name, bytes.clone())?;
        self.mirror(name, bytes)
    }

    /// File `name` of the directory, or `None` where there is none (of a
    /// mirrored run: as object storage has it, which this node may not).
    pub fn read_file(&self, name: &str) -> Result<Option<Bytes>, TrainError> {
        let storage = match &self.remote {
            Some(remote) => remote.storage()?,
            None => Storage::Local(self.root.clone()),
        };
        Ok(storage.read_if_present(name)?)
    }

    /// Uploads file `name` of a mirrored run.
    fn mirror(&self, name: &str, bytes: Bytes) -> Result<(), TrainError> {
        match &self.remote {
            Some(remote) => Ok(remote.storage()?.write(name, bytes)?),
            None => Ok(()),
        }
    }
}
