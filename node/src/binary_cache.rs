//! Content hashes of worker binaries, computed once per file version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use raylet_proto::{Error, Result};

/// Remembers each binary's hash by path, size and modification time.
#[derive(Default)]
pub(crate) struct BinaryCache {
    hashes: Mutex<HashMap<(PathBuf, u64, SystemTime), String>>,
}

impl BinaryCache {
    pub(crate) fn hash(&self, path: &Path) -> Result<String> {
        let metadata = std::fs::metadata(path).map_err(|e| {
            Error::NotFound(format!(
                "the worker binary {} is not on this node: {e}; run the program on this node, \
                 or submit it as a job",
                path.display()
            ))
        })?;
        let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let key = (path.to_path_buf(), metadata.len(), modified);
        let mut hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hash) = hashes.get(&key) {
            return Ok(hash.clone());
        }
        let hash = raylet_proto::binary_hash::hash_file(path)?;
        hashes.insert(key, hash.clone());
        Ok(hash)
    }
}
