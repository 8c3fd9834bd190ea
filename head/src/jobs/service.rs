//! The gRPC face of the head's jobs: blobs in and out, submit, watch, list,
//! stop and read the output.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::JobId;
use raylet_proto::blob::{CHUNK_BYTES, is_sha256, receive_chunks, send_chunks};
use raylet_proto::v1::fetch_blob_request::By;
use raylet_proto::v1::job_service_server::JobService;
use raylet_proto::v1::{
    BlobChunk, BlobRef, DeleteJobReply, DeleteJobRequest, FetchBlobRequest, JobLogChunk, JobRecord, ListJobsReply,
    ListJobsRequest, MissingBlobsReply, MissingBlobsRequest, ReadJobLogsRequest, StopJobRequest, SubmitJobRequest,
    UploadBlobReply, WatchJobRequest,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::error::JobError;
use super::manager::JobManager;
use super::table::is_ended;

/// The most names one `MissingBlobs` call may ask about.
const MAX_NAMES: usize = 100_000;
/// The longest grace period a stop may ask for.
const MAX_GRACE: Duration = Duration::from_secs(3600);

type ReplyStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Serves [`JobService`] over the head's job manager.
pub(crate) struct JobServiceImpl {
    pub(crate) jobs: Arc<JobManager>,
    /// Turns true when the head stops: following streams end then.
    pub(crate) stopping: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl JobService for JobServiceImpl {
    type FetchBlobStream = ReplyStream<BlobChunk>;
    type WatchJobStream = ReplyStream<JobRecord>;
    type ReadJobLogsStream = ReplyStream<JobLogChunk>;

    async fn missing_blobs(
        &self,
        request: Request<MissingBlobsRequest>,
    ) -> Result<Response<MissingBlobsReply>, Status> {
        let names = request.into_inner().sha256;
        if names.len() > MAX_NAMES {
            let too_many = JobError::TooManyBlobNames {
                count: names.len(),
                limit: MAX_NAMES,
            };
            return Err(too_many.into());
        }
        if let Some(bad) = names.iter().find(|name| !is_sha256(name)) {
            return Err(JobError::NotSha256 { name: bad.clone() }.into());
        }
        Ok(Response::new(MissingBlobsReply {
            sha256: self.jobs.blobs.missing(&names),
        }))
    }

    async fn upload_blob(&self, request: Request<Streaming<BlobChunk>>) -> Result<Response<UploadBlobReply>, Status> {
        let blobs = &self.jobs.blobs;
        let receive = |blob: &BlobRef| blobs.receive(blob.clone()).map_err(raylet_proto::Error::from);
        let (blob, writer) = receive_chunks(request.into_inner(), receive).await?;
        let Some(writer) = writer else {
            return Ok(Response::new(UploadBlobReply { bytes_stored: 0 }));
        };
        blobs.keep(writer, &blob.sha256).await?;
        Ok(Response::new(UploadBlobReply {
            bytes_stored: blob.size,
        }))
    }

    async fn fetch_blob(&self, request: Request<FetchBlobRequest>) -> Result<Response<Self::FetchBlobStream>, Status> {
        let sha256 = match request.into_inner().by {
            Some(By::Sha256(sha256)) => sha256,
            Some(By::BuildHash(build_hash)) => match self.jobs.blobs.by_build_hash(&build_hash) {
                Some(sha256) => sha256,
                None => return Err(JobError::UnknownBuildHash { build_hash }.into()),
            },
            None => return Err(JobError::NoBlobNamed.into()),
        };
        let Some(path) = self.jobs.blobs.path(&sha256) else {
            return Err(JobError::UnknownBlob { sha256 }.into());
        };
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(JobError::io("opening", &path))?;
        let size = file.metadata().await.map_err(JobError::io("reading", &path))?.len();
        let (chunks, receiver) = mpsc::channel(4);
        tokio::spawn(async move {
            let sent = send_chunks(file, BlobRef { sha256, size }, &chunks, Ok).await;
            if let Err(error) = sent {
                let _ = chunks.send(Err(JobError::io("sending", path)(error).into())).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn submit_job(&self, request: Request<SubmitJobRequest>) -> Result<Response<JobRecord>, Status> {
        let request = request.into_inner();
        let id = JobId::from_wire(&request.job_id)?;
        let spec = request.spec.ok_or(JobError::NoSpec)?;
        Ok(Response::new(self.jobs.submit(id, spec).await?))
    }

    async fn watch_job(&self, request: Request<WatchJobRequest>) -> Result<Response<Self::WatchJobStream>, Status> {
        let id = JobId::from_wire(&request.into_inner().job_id)?;
        let mut watcher = self.jobs.table.watch(id)?;
        let mut stopping = self.stopping.clone();
        let (records, receiver) = mpsc::channel(8);
        tokio::spawn(async move {
            loop {
                let record = watcher.borrow_and_update().clone();
                let ended = is_ended(record.status());
                if records.send(Ok(record)).await.is_err() || ended {
                    return;
                }
                tokio::select! {
                    changed = watcher.changed() => if changed.is_err() { return },
                    _ = stopping.wait_for(|stopping| *stopping) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn list_jobs(&self, _request: Request<ListJobsRequest>) -> Result<Response<ListJobsReply>, Status> {
        Ok(Response::new(ListJobsReply {
            jobs: self.jobs.table.list(),
        }))
    }

    async fn stop_job(&self, request: Request<StopJobRequest>) -> Result<Response<JobRecord>, Status> {
        let request = request.into_inner();
        let id = JobId::from_wire(&request.job_id)?;
        let grace = Duration::from_millis(request.grace_ms).min(MAX_GRACE);
        Ok(Response::new(self.jobs.stop(id, grace).await?))
    }

    async fn delete_job(&self, request: Request<DeleteJobRequest>) -> Result<Response<DeleteJobReply>, Status> {
        let id = JobId::from_wire(&request.into_inner().job_id)?;
        self.jobs.delete(id).await?;
        Ok(Response::new(DeleteJobReply {}))
    }

    async fn read_job_logs(
        &self,
        request: Request<ReadJobLogsRequest>,
    ) -> Result<Response<Self::ReadJobLogsStream>, Status> {
        let request = request.into_inner();
        let id = JobId::from_wire(&request.job_id)?;
        let jobs = self.jobs.clone();
        let mut written = jobs.table.watch_output(id)?;
        let mut record = jobs.table.watch(id)?;
        let mut stopping = self.stopping.clone();
        let (chunks, receiver) = mpsc::channel(4);
        let mut offset = request.offset;
        if request.tail_bytes > 0 {
            offset = offset.max(written.borrow().saturating_sub(request.tail_bytes));
        }
        tokio::spawn(async move {
            loop {
                let ended = is_ended(record.borrow_and_update().status());
                let available = *written.borrow_and_update();
                if offset < available {
                    let data = match jobs.table.read_output(id, offset, CHUNK_BYTES) {
                        Ok(data) => data,
                        Err(error) => {
                            let _ = chunks.send(Err(error.into())).await;
                            return;
                        }
                    };
                    let chunk = JobLogChunk {
                        offset,
                        data: data.clone().into(),
                    };
                    offset += data.len() as u64;
                    if data.is_empty() || chunks.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                    continue;
                }
                if !request.follow || ended {
                    return;
                }
                tokio::select! {
                    _ = written.changed() => {}
                    _ = record.changed() => {}
                    _ = stopping.wait_for(|stopping| *stopping) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}
