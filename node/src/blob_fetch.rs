//! Blobs this node fetched from the head, the binaries and files of jobs:
//! kept by sha256 under the node's work directory, each checked against
//! its sha256 and size as it arrives, fetched once however many ask.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::blob::{BlobWriter, check_ref};
use raylet_proto::v1::fetch_blob_request::By;
use raylet_proto::v1::job_service_client::JobServiceClient;
use raylet_proto::v1::{BlobRef, FetchBlobRequest};
use raylet_proto::{Error, Result};

/// How long the head may take to answer a connection.
const HEAD_PATIENCE: Duration = Duration::from_secs(5);

/// The node's cache of blobs from the head.
pub(crate) struct BlobFetch {
    dir: PathBuf,
    head_address: String,
    token: AuthToken,
    /// One fetch at a time: a second asker finds the blob in place. Holds
    /// the sha256 of each binary fetched by its build hash.
    fetching: tokio::sync::Mutex<HashMap<String, String>>,
}

impl BlobFetch {
    pub(crate) fn new(dir: PathBuf, head_address: String, token: AuthToken) -> Self {
        BlobFetch {
            dir,
            head_address,
            token,
            fetching: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The local path of `blob`, fetched from the head unless cached.
    pub(crate) async fn get(&self, blob: &BlobRef) -> Result<PathBuf> {
        check_ref(blob)?;
        let path = self.dir.join(&blob.sha256);
        let _fetching = self.fetching.lock().await;
        if path.is_file() {
            return Ok(path);
        }
        self.fetch(By::Sha256(blob.sha256.clone())).await.map(|(path, _)| path)
    }

    /// The local path of the binary whose build hash is `build_hash`,
    /// fetched from the head unless cached: the head has it when it came
    /// with a job.
    pub(crate) async fn get_binary(&self, build_hash: &str) -> Result<PathBuf> {
        let mut by_build = self.fetching.lock().await;
        if let Some(sha256) = by_build.get(build_hash) {
            let path = self.dir.join(sha256);
            if path.is_file() {
                return Ok(path);
            }
        }
        let (path, sha256) = self.fetch(By::BuildHash(build_hash.to_string())).await?;
        by_build.insert(build_hash.to_string(), sha256);
        Ok(path)
    }

    /// Fetches a blob into the cache; returns its path and sha256.
    async fn fetch(&self, by: By) -> Result<(PathBuf, String)> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::Internal(format!("creating {}: {e}", self.dir.display())))?;
        let channel = raylet_proto::channel::connect(&self.head_address, &self.token, HEAD_PATIENCE).await?;
        let request = FetchBlobRequest { by: Some(by) };
        let mut chunks = JobServiceClient::new(channel)
            .max_decoding_message_size(raylet_proto::server::MAX_DATA_MESSAGE)
            .fetch_blob(request)
            .await?
            .into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Error::Unavailable("the head sent no chunk of the blob".into()))?;
        let blob = first
            .blob
            .ok_or_else(|| Error::Internal("the head's first chunk names no blob".into()))?;
        let mut writer = BlobWriter::create(&self.dir, blob.clone(), u64::MAX)?;
        writer.write(&first.data)?;
        while let Some(chunk) = chunks.message().await? {
            writer.write(&chunk.data)?;
        }
        writer.finish(0o755)?;
        Ok((self.dir.join(&blob.sha256), blob.sha256))
    }
}
