//! Talks to the head's job service: uploads what the head lacks (by
//! sha256, in chunks), submits, follows, lists and stops jobs, and reads
//! their output. The CLI uses it as is; [`crate::JobHandle`] wraps it.
//! Following a job (`wait`, `follow_logs`) outlasts a restart of the head:
//! a broken stream is opened again, the output from where it was.

use std::path::Path;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::JobId;
use raylet_proto::blob::{blob_of_file, send_chunks};
use raylet_proto::channel::AuthedChannel;
use raylet_proto::server::MAX_DATA_MESSAGE;
use raylet_proto::v1::job_service_client::JobServiceClient;
use raylet_proto::v1::{
    BlobRef, DeleteJobRequest, JobFile, JobLogChunk, JobSpec, ListJobsRequest, MissingBlobsRequest, ReadJobLogsRequest,
    StopJobRequest, SubmitJobRequest, WatchJobRequest,
};

use super::{Job, JobInfo};
use crate::Result;
use crate::links::head_retry::HeadLost;

/// How long the head may take to answer a connection.
const HEAD_PATIENCE: Duration = Duration::from_secs(5);

/// A connection to the job service of the head at an address.
#[derive(Clone)]
pub struct JobClient {
    client: JobServiceClient<AuthedChannel>,
}

/// A submitted job's id and how many bytes its submission uploaded.
#[derive(Clone, Copy, Debug)]
pub struct Submitted {
    pub id: JobId,
    pub uploaded_bytes: u64,
}

impl JobClient {
    pub async fn connect(head: &str, token: &AuthToken) -> Result<Self> {
        let channel = raylet_proto::channel::connect(head, token, HEAD_PATIENCE).await?;
        let client = JobServiceClient::new(channel)
            .max_decoding_message_size(MAX_DATA_MESSAGE)
            .max_encoding_message_size(MAX_DATA_MESSAGE);
        Ok(JobClient { client })
    }

    /// Uploads the job's binary and files that the head lacks, then submits it.
    pub async fn submit(&self, job: &Job) -> Result<Submitted> {
        self.submit_as(JobId::random(), job).await
    }

    /// [`JobClient::submit`] under the id `id`; the head refuses an id it
    /// knows (`AlreadyExists`).
    pub async fn submit_as(&self, id: JobId, job: &Job) -> Result<Submitted> {
        let shipped = job.shipped_files()?;
        let paths: Vec<&Path> = std::iter::once(job.binary.as_path())
            .chain(shipped.iter().map(|(path, _)| path.as_path()))
            .collect();
        let blobs = hash_all(&paths).await?;
        let uploaded_bytes = self.upload_missing(&paths, &blobs).await?;
        let files = shipped
            .iter()
            .zip(&blobs[1..])
            .map(|((path, relative), blob)| JobFile {
                path: relative.clone(),
                blob: Some(blob.clone()),
                executable: is_executable(path),
            })
            .collect();
        let spec = JobSpec {
            binary: Some(blobs[0].clone()),
            files,
            ..job.spec()?
        };
        let request = SubmitJobRequest {
            job_id: id.as_bytes().to_vec(),
            spec: Some(spec),
        };
        self.client.clone().submit_job(request).await?;
        Ok(Submitted { id, uploaded_bytes })
    }

    /// Uploads the blobs the head lacks; returns the bytes sent.
    async fn upload_missing(&self, paths: &[&Path], blobs: &[BlobRef]) -> Result<u64> {
        let names = blobs.iter().map(|b| b.sha256.clone()).collect();
        let missing = self
            .client
            .clone()
            .missing_blobs(MissingBlobsRequest { sha256: names })
            .await?
            .into_inner()
            .sha256;
        let mut uploaded = 0;
        for (path, blob) in paths.iter().zip(blobs) {
            if missing.contains(&blob.sha256) {
                uploaded += self.upload(path, &blob.sha256, blob.size).await?;
            }
        }
        Ok(uploaded)
    }

    /// Sends the file at `path` as the blob it claims to be, in chunks;
    /// returns the bytes the head stored (0 when it had the blob).
    pub async fn upload(&self, path: &Path, sha256: &str, size: u64) -> Result<u64> {
        let file = tokio::fs::File::open(path).await?;
        let blob = BlobRef {
            sha256: sha256.to_string(),
            size,
        };
        let (chunks, outbound) = tokio::sync::mpsc::channel(4);
        let reader = tokio::spawn(async move { send_chunks(file, blob, &chunks, |chunk| chunk).await });
        let stream = tokio_stream::wrappers::ReceiverStream::new(outbound);
        let stored = self.client.clone().upload_blob(stream).await;
        reader
            .await
            .map_err(|e| raylet_proto::Error::Internal(e.to_string()))??;
        Ok(stored?.into_inner().bytes_stored)
    }

    /// The job's record now.
    pub async fn info(&self, id: JobId) -> Result<JobInfo> {
        let mut records = self.watch(id).await?;
        let record = records
            .message()
            .await?
            .ok_or_else(|| raylet_proto::Error::Unavailable("the head sent no record".into()))?;
        JobInfo::from_record(record)
    }

    /// The job's record now, then at each change until it ends.
    async fn watch(&self, id: JobId) -> Result<tonic::Streaming<raylet_proto::v1::JobRecord>> {
        let request = WatchJobRequest {
            job_id: id.as_bytes().to_vec(),
        };
        Ok(self.client.clone().watch_job(request).await?.into_inner())
    }

    /// The job's record once it has ended; waits out a restart of the head.
    pub async fn wait(&self, id: JobId) -> Result<JobInfo> {
        let mut head_lost = HeadLost::default();
        loop {
            let mut records = match self.watch(id).await {
                Ok(records) => records,
                Err(error) => {
                    head_lost.wait_or_fail(error).await?;
                    continue;
                }
            };
            let mut last = None;
            while let Ok(Some(record)) = records.message().await {
                head_lost = HeadLost::default();
                last = Some(record);
            }
            if let Some(info) = last.map(JobInfo::from_record).transpose()?
                && info.status.is_ended()
            {
                return Ok(info);
            }
            let broken = raylet_proto::Error::Unavailable(format!("the head stopped following job {id}"));
            head_lost.wait_or_fail(broken.into()).await?;
        }
    }

    pub async fn list(&self) -> Result<Vec<JobInfo>> {
        let jobs = self
            .client
            .clone()
            .list_jobs(ListJobsRequest {})
            .await?
            .into_inner()
            .jobs;
        jobs.into_iter().map(JobInfo::from_record).collect()
    }

    /// Stops the job: SIGTERM to its driver, then SIGKILL after `grace`.
    pub async fn stop(&self, id: JobId, grace: Duration) -> Result<JobInfo> {
        let request = StopJobRequest {
            job_id: id.as_bytes().to_vec(),
            grace_ms: grace.as_millis() as u64,
        };
        JobInfo::from_record(self.client.clone().stop_job(request).await?.into_inner())
    }

    /// Forgets an ended job: the head drops its record and output. A job
    /// that has not ended is refused (`FailedPrecondition`).
    pub async fn delete(&self, id: JobId) -> Result<()> {
        let request = DeleteJobRequest {
            job_id: id.as_bytes().to_vec(),
        };
        self.client.clone().delete_job(request).await?;
        Ok(())
    }

    /// The job's output from `offset`; with `follow`, until the job ends.
    pub async fn read_logs(&self, id: JobId, offset: u64, follow: bool) -> Result<JobOutput> {
        let request = ReadJobLogsRequest {
            job_id: id.as_bytes().to_vec(),
            offset,
            follow,
            tail_bytes: 0,
        };
        let chunks = self.client.clone().read_job_logs(request).await?.into_inner();
        Ok(JobOutput { chunks })
    }

    /// The last `bytes` bytes (at most) of the job's output so far. The
    /// head reads only those from its disk, however long the output is.
    pub async fn tail_logs(&self, id: JobId, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let request = ReadJobLogsRequest {
            job_id: id.as_bytes().to_vec(),
            offset: 0,
            follow: false,
            tail_bytes: bytes,
        };
        let mut chunks = JobOutput {
            chunks: self.client.clone().read_job_logs(request).await?.into_inner(),
        };
        let mut output = Vec::new();
        while let Some(chunk) = chunks.next().await? {
            output.extend_from_slice(&chunk);
        }
        Ok(output)
    }

    /// Sends the job's output from the start until it ends to `sender`,
    /// opening the stream again from where it was when it breaks (the head
    /// may restart meanwhile). Returns once the job ended, an error was
    /// sent, or the receiver is gone.
    pub async fn follow(&self, id: JobId, sender: tokio::sync::mpsc::Sender<Result<Vec<u8>>>) {
        let (mut offset, mut head_lost) = (0u64, HeadLost::default());
        loop {
            let mut output = match self.read_logs(id, offset, true).await {
                Ok(output) => output,
                Err(error) => match head_lost.wait_or_fail(error).await {
                    Ok(()) => continue,
                    Err(error) => {
                        let _ = sender.send(Err(error)).await;
                        return;
                    }
                },
            };
            loop {
                match output.next().await {
                    Ok(Some(chunk)) => {
                        head_lost = HeadLost::default();
                        offset += chunk.len() as u64;
                        if sender.send(Ok(chunk)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
        }
    }

    /// The job's whole output so far.
    pub async fn logs(&self, id: JobId) -> Result<Vec<u8>> {
        let mut chunks = self.read_logs(id, 0, false).await?;
        let mut output = Vec::new();
        while let Some(chunk) = chunks.next().await? {
            output.extend_from_slice(&chunk);
        }
        Ok(output)
    }
}

/// A job's output as it arrives.
pub struct JobOutput {
    chunks: tonic::Streaming<JobLogChunk>,
}

impl JobOutput {
    /// The next piece of output; `None` once there is no more.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>> {
        Ok(self.chunks.message().await?.map(|chunk| chunk.data.to_vec()))
    }
}

/// The sha256 of every file, computed off the async threads.
async fn hash_all(paths: &[&Path]) -> Result<Vec<BlobRef>> {
    let owned: Vec<std::path::PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let hashed = tokio::task::spawn_blocking(move || owned.iter().map(|p| blob_of_file(p)).collect());
    let blobs: raylet_proto::Result<Vec<BlobRef>> =
        hashed.await.map_err(|e| raylet_proto::Error::Internal(e.to_string()))?;
    Ok(blobs?)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}
