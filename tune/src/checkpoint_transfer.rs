//! Moving a checkpoint between trials through the object store (PBT's
//! exploit): the driver packs the donor's checkpoint directory into one
//! object, and the receiving trial's actor unpacks it into its own
//! directory as a committed checkpoint.

use std::path::{Path, PathBuf};

use raylet_train::{Checkpoint, Metrics, RunDirectory};
use serde::{Deserialize, Serialize};

use crate::TuneError;

/// A checkpoint directory's files.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PackedCheckpoint {
    files: Vec<PackedFile>,
}

/// One file of a packed checkpoint: its path in the checkpoint, and its bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct PackedFile {
    relative: String,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
}

impl PackedCheckpoint {
    /// Reads every file under `checkpoint`.
    pub fn pack(checkpoint: &Checkpoint) -> Result<Self, TuneError> {
        let mut packed = PackedCheckpoint::default();
        pack_directory(checkpoint.path(), checkpoint.path(), &mut packed.files)?;
        packed.files.sort_by(|a, b| a.relative.cmp(&b.relative));
        Ok(packed)
    }

    /// Writes the files into a staged checkpoint of `directory` and commits
    /// it as the checkpoint of report `iteration`.
    pub fn unpack(&self, directory: &RunDirectory, iteration: u64, metrics: &Metrics) -> Result<Checkpoint, TuneError> {
        let staged = directory.stage(0)?;
        for PackedFile { relative, bytes } in &self.files {
            let path = safe_join(staged.path(), relative)?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| TuneError::io(format!("creating {}", parent.display()), e))?;
            }
            std::fs::write(&path, bytes).map_err(|e| TuneError::io(format!("writing {}", path.display()), e))?;
        }
        Ok(directory.commit(&staged, iteration, metrics)?)
    }
}

fn pack_directory(root: &Path, directory: &Path, files: &mut Vec<PackedFile>) -> Result<(), TuneError> {
    let entries =
        std::fs::read_dir(directory).map_err(|e| TuneError::io(format!("reading {}", directory.display()), e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| TuneError::io(format!("reading {}", directory.display()), e))?
            .path();
        if path.is_dir() {
            pack_directory(root, &path, files)?;
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| TuneError::io(format!("reading {}", path.display()), e))?;
        let relative = path
            .strip_prefix(root)
            .expect("walked from root")
            .to_string_lossy()
            .into_owned();
        files.push(PackedFile { relative, bytes });
    }
    Ok(())
}

/// `relative` under `root`, refusing paths that would leave it.
fn safe_join(root: &Path, relative: &str) -> Result<PathBuf, TuneError> {
    let path = Path::new(relative);
    let normal = path.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    match normal {
        true => Ok(root.join(path)),
        false => Err(TuneError::Trainable(format!(
            "a packed checkpoint holds `{relative}`, which is not a plain relative path"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_unpacks_byte_for_byte_into_another_trial() {
        let temp = tempfile::tempdir().unwrap();
        let donor = RunDirectory::create(temp.path().join("donor")).unwrap();
        let staged = donor.stage(0).unwrap();
        std::fs::write(staged.path().join("state.json"), b"{\"step\": 7}").unwrap();
        std::fs::create_dir(staged.path().join("nested")).unwrap();
        std::fs::write(staged.path().join("nested/weights.bin"), [1u8, 2, 3]).unwrap();
        let committed = donor.commit(&staged, 7, &Metrics::new()).unwrap();

        let packed = PackedCheckpoint::pack(&committed).unwrap();
        let receiver = RunDirectory::create(temp.path().join("receiver")).unwrap();
        let copy = packed.unpack(&receiver, 7, &Metrics::new().with("score", 1.0)).unwrap();
        assert_eq!(copy.path(), temp.path().join("receiver/checkpoint_000007"));
        assert_eq!(
            std::fs::read(copy.path().join("nested/weights.bin")).unwrap(),
            [1, 2, 3]
        );
        assert_eq!(copy.metadata().unwrap().metrics.get("score"), Some(1.0));
    }

    #[test]
    fn paths_that_leave_the_checkpoint_are_refused() {
        let temp = tempfile::tempdir().unwrap();
        let packed = PackedCheckpoint {
            files: vec![PackedFile {
                relative: "../escape".into(),
                bytes: vec![0],
            }],
        };
        let receiver = RunDirectory::create(temp.path().to_path_buf()).unwrap();
        let error = packed.unpack(&receiver, 1, &Metrics::new()).unwrap_err().to_string();
        assert!(error.contains("not a plain relative path"), "{error}");
    }
}
