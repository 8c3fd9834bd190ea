//! The head's blob store: the binaries and files of jobs, one file per
//! blob named by its sha256, checked as it arrives, with an index from the
//! build hash that worker binaries go by to the blob of that binary, kept in
//! the head's state store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use raylet_proto::blob::{BlobWriter, is_sha256};
use raylet_proto::v1::BlobRef;
use raylet_proto::{Error, Result};

use crate::head::state_store::{StateStore, Table};

/// Blobs on the head's disk.
pub struct BlobStore {
    dir: PathBuf,
    /// The largest blob accepted, in bytes.
    max_blob_bytes: u64,
    /// Build hash (XXH3) to sha256, for the binaries received.
    by_build: Mutex<HashMap<String, String>>,
    store: StateStore,
}

impl BlobStore {
    /// The store in `dir` (made when the first blob arrives), with the
    /// index that `store` holds.
    pub fn recover(dir: &Path, max_blob_bytes: u64, store: StateStore) -> Result<Self> {
        let mut by_build = HashMap::new();
        for (key, value) in store.load(Table::Binaries)? {
            let sha256 = <String as prost::Message>::decode(value.as_slice())
                .map_err(|e| Error::Internal(format!("a stored binary index entry is corrupt: {e}")))?;
            by_build.insert(String::from_utf8_lossy(&key).into_owned(), sha256);
        }
        Ok(BlobStore {
            dir: dir.to_path_buf(),
            max_blob_bytes,
            by_build: Mutex::new(by_build),
            store,
        })
    }

    /// Where the blob `sha256` lives, if the store has it.
    pub fn path(&self, sha256: &str) -> Option<PathBuf> {
        let path = self.dir.join(sha256);
        (is_sha256(sha256) && path.is_file()).then_some(path)
    }

    /// The names among `sha256s` that the store lacks.
    pub fn missing(&self, sha256s: &[String]) -> Vec<String> {
        sha256s.iter().filter(|s| self.path(s).is_none()).cloned().collect()
    }

    /// The sha256 of the binary whose build hash is `build_hash`.
    pub fn by_build_hash(&self, build_hash: &str) -> Option<String> {
        let index = self.by_build.lock().unwrap_or_else(|p| p.into_inner());
        index.get(build_hash).cloned()
    }

    /// Starts receiving the blob `blob`; `None` when the store has it.
    pub fn receive(&self, blob: BlobRef) -> Result<Option<BlobWriter>> {
        if self.path(&blob.sha256).is_some() {
            return Ok(None);
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::Internal(format!("creating the blob directory {}: {e}", self.dir.display())))?;
        BlobWriter::create(&self.dir, blob, self.max_blob_bytes).map(Some)
    }

    /// Checks and keeps a received blob.
    pub fn keep(&self, writer: BlobWriter, sha256: &str) -> Result<()> {
        let build_hash = writer.finish(0o644)?;
        self.store
            .put(Table::Binaries, build_hash.as_bytes(), &sha256.to_string());
        let mut index = self.by_build.lock().unwrap_or_else(|p| p.into_inner());
        index.insert(build_hash, sha256.to_string());
        Ok(())
    }
}
