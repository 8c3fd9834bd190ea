//! The head's blob store: the binaries and files of jobs, one file per
//! blob named by its sha256, checked as it arrives, with an index from the
//! build hash that worker binaries go by to the blob of that binary, kept in
//! the head's state store. A blob is kept in this order: its file synced,
//! moved into place, the directory synced, then its index entry committed;
//! only then is its upload answered. A head that died between the move and
//! the commit finds the blob without an entry when it starts again, and
//! indexes it then: an uploader that asks which blobs are missing is told
//! it is there, and does not upload it again.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use raylet_common::binary_hash::hash_file;
use raylet_proto::blob::{BlobWriter, is_sha256};
use raylet_proto::v1::BlobRef;

use super::error::JobError;
use crate::state_store::{StateError, StateStore, Table};

type Result<T, E = JobError> = std::result::Result<T, E>;

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
                .map_err(StateError::corrupt("a binary index entry"))?;
            by_build.insert(String::from_utf8_lossy(&key).into_owned(), sha256);
        }
        index_unindexed(dir, &mut by_build, &store)?;
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
        std::fs::create_dir_all(&self.dir).map_err(JobError::io("creating the blob directory", &self.dir))?;
        Ok(BlobWriter::create(&self.dir, blob, self.max_blob_bytes).map(Some)?)
    }

    /// Checks and keeps a received blob; returns once the blob and its
    /// index entry are on disk.
    pub async fn keep(&self, writer: BlobWriter, sha256: &str) -> Result<()> {
        let build_hash = writer.finish(0o644)?;
        sync_dir(&self.dir)?;
        self.store
            .put(Table::Binaries, build_hash.as_bytes(), &sha256.to_string())
            .await?;
        let mut index = self.by_build.lock().unwrap_or_else(|p| p.into_inner());
        index.insert(build_hash, sha256.to_string());
        Ok(())
    }
}

/// Adds to the index the blobs in `dir` it lacks: those a head that died
/// before their entry was committed left.
fn index_unindexed(dir: &Path, by_build: &mut HashMap<String, String>, store: &StateStore) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let indexed: HashSet<String> = by_build.values().cloned().collect();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_sha256(&name) || indexed.contains(&name) {
            continue;
        }
        let build_hash = hash_file(&entry.path())?;
        tracing::info!(blob = %name, %build_hash, "indexing a blob whose upload the head did not answer");
        // Written behind: if it is lost, the next start indexes the blob again.
        drop(store.put(Table::Binaries, build_hash.as_bytes(), &name));
        by_build.insert(build_hash, name);
    }
    Ok(())
}

/// Makes the names in `dir` durable: a blob moved into place is found after
/// a crash of the machine too.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(JobError::io("syncing the blob directory", dir))
}

#[cfg(test)]
mod tests {
    use raylet_proto::blob::blob_of_file;

    use super::*;
    use crate::state_store::tests::{TestDisk, reopen};

    /// Uploads `data` into `blobs` as the upload service does.
    async fn upload(blobs: &BlobStore, scratch: &Path, data: &[u8]) -> Result<(String, String)> {
        let source = scratch.join("source");
        std::fs::write(&source, data).unwrap();
        let blob = blob_of_file(&source).unwrap();
        let mut writer = blobs.receive(blob.clone())?.expect("a new blob");
        writer.write(data)?;
        blobs.keep(writer, &blob.sha256).await?;
        Ok((blob.sha256, hash_file(&source).unwrap()))
    }

    #[tokio::test]
    async fn a_kept_binary_is_found_by_its_build_hash_after_a_restart() {
        let (dir, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let state = dir.path().join("state");
        let store = StateStore::open(&state).unwrap();
        let blobs = BlobStore::recover(&dir.path().join("blobs"), 1 << 20, store.clone()).unwrap();
        let (sha256, build_hash) = upload(&blobs, scratch.path(), b"a binary").await.unwrap();
        drop((blobs, store));
        let blobs = BlobStore::recover(&dir.path().join("blobs"), 1 << 20, reopen(&state).await).unwrap();
        assert_eq!(blobs.by_build_hash(&build_hash), Some(sha256));
    }

    #[tokio::test]
    async fn a_blob_whose_entry_was_never_committed_is_indexed_at_the_next_start() {
        let (dir, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let blobs_dir = dir.path().join("blobs");
        let (store, disk) = TestDisk::store();
        let blobs = BlobStore::recover(&blobs_dir, 1 << 20, store).unwrap();
        disk.fail();
        let refused = upload(&blobs, scratch.path(), b"a binary").await.unwrap_err();
        assert!(refused.to_string().contains("could not be written"), "{refused}");
        let build_hash = hash_file(&scratch.path().join("source")).unwrap();
        assert_eq!(blobs.by_build_hash(&build_hash), None, "a failed upload is not indexed");

        let store = StateStore::open(&dir.path().join("state")).unwrap();
        let blobs = BlobStore::recover(&blobs_dir, 1 << 20, store.clone()).unwrap();
        let sha256 = blobs.by_build_hash(&build_hash).expect("indexed at the start");
        assert!(blobs.path(&sha256).is_some());
        store.flush().await.unwrap();
        assert_eq!(
            store.load(Table::Binaries).unwrap().len(),
            1,
            "and the entry is written"
        );
    }
}
