//! Input file sets: a glob, a directory (walked in name order) or a list of
//! paths, each resolved to a sorted, de-duplicated list with sizes, so that
//! a rerun partitions the same files into the same blocks.

use std::path::{Path, PathBuf};

use crate::DataError;

/// Which files a dataset reads.
#[derive(Clone, Debug)]
pub enum FileSet {
    /// Files matching a glob pattern (`data/**/*.pgm`).
    Glob(String),
    /// Every file under a directory, recursively.
    Dir(PathBuf),
    /// These files.
    List(Vec<PathBuf>),
}

impl FileSet {
    pub fn glob(pattern: &str) -> Self {
        FileSet::Glob(pattern.to_string())
    }

    pub fn dir(path: impl Into<PathBuf>) -> Self {
        FileSet::Dir(path.into())
    }

    pub fn list(paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        FileSet::List(paths.into_iter().map(Into::into).collect())
    }

    /// The files, sorted by path, each with its size in bytes.
    pub(crate) fn resolve(&self) -> Result<Vec<(PathBuf, u64)>, DataError> {
        let mut paths = match self {
            FileSet::Glob(pattern) => glob_paths(pattern)?,
            FileSet::Dir(dir) => {
                let mut paths = Vec::new();
                walk(dir, &mut paths)?;
                paths
            }
            FileSet::List(paths) => paths.clone(),
        };
        paths.sort();
        paths.dedup();
        if paths.is_empty() {
            return Err(DataError::InvalidInput(format!("no files in {self:?}")));
        }
        paths
            .into_iter()
            .map(|path| {
                let metadata = std::fs::metadata(&path).map_err(|e| DataError::Read {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                Ok((path, metadata.len()))
            })
            .collect()
    }
}

fn glob_paths(pattern: &str) -> Result<Vec<PathBuf>, DataError> {
    let entries = glob::glob(pattern).map_err(|e| DataError::InvalidInput(format!("glob `{pattern}`: {e}")))?;
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| DataError::Read {
            path: e.path().to_path_buf(),
            message: e.error().to_string(),
        })?;
        if path.is_file() {
            paths.push(path);
        }
    }
    Ok(paths)
}

fn walk(dir: &Path, paths: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::Read {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        if path.is_dir() {
            walk(&path, paths)?;
        } else {
            paths.push(path);
        }
    }
    Ok(())
}
