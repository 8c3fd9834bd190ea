//! Content hashes of worker binaries, computed once per file version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::NodeManagerError;

/// Remembers each binary's hash by path, size and modification time.
#[derive(Default)]
pub(crate) struct BinaryCache {
    hashes: Mutex<HashMap<(PathBuf, u64, SystemTime), String>>,
}

impl BinaryCache {
    pub(crate) fn hash(&self, path: &Path) -> Result<String, NodeManagerError> {
        let metadata = std::fs::metadata(path).map_err(|e| NodeManagerError::BinaryMissing {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let key = (path.to_path_buf(), metadata.len(), modified);
        let mut hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hash) = hashes.get(&key) {
            return Ok(hash.clone());
        }
        let hash = raylet_common::binary_hash::hash_file(path)?;
        hashes.insert(key, hash.clone());
        Ok(hash)
    }
}
