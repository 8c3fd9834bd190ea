//! Jobs: a program built on one machine run as a driver on the cluster,
//! with `raylet job submit` or [`Cluster::submit`]. Its binary and files are
//! uploaded to the head once (content-addressed by sha256; what the head
//! has is not sent again), a node manager fetches them and runs the
//! driver, and the head keeps the job's status and output.

mod client;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::v1::{self, JobRecord, JobSpec};
use raylet_proto::{JobId, NodeId};
use serde::Serialize;

pub use client::{JobClient, JobOutput, Submitted};

use crate::core_worker::CoreWorker;
use crate::submitter::resources::Resources;
use crate::{Cluster, Error, Result};

/// How long a driver has to exit after SIGTERM before SIGKILL, by default.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);

/// A program to run on the cluster: a binary that links raylet, with its
/// arguments, environment, files and the resources its driver holds.
#[derive(Clone, Debug)]
pub struct Job {
    binary: PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    files: Vec<PathBuf>,
    resources: Resources,
    name: String,
    metadata: BTreeMap<String, String>,
}

impl Job {
    /// A job that runs the binary at `binary`, e.g. `target/release/my_job`.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Job {
            binary: binary.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            files: Vec::new(),
            resources: Resources::default(),
            name: String::new(),
            metadata: BTreeMap::new(),
        }
    }

    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Files or directories shipped with the job: each lands in the
    /// driver's working directory under its own name (a directory with
    /// everything in it).
    pub fn files<P: Into<PathBuf>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.files.extend(paths.into_iter().map(Into::into));
        self
    }

    /// CPUs the driver holds on its node [default: none].
    pub fn num_cpus(self, amount: f64) -> Self {
        self.resource(raylet_proto::resources::CPU, amount)
    }

    /// GPUs the driver holds on its node [default: none].
    pub fn num_gpus(self, amount: f64) -> Self {
        self.resource(raylet_proto::resources::GPU, amount)
    }

    /// Any resource the driver holds, by name.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources = self.resources.with(name, amount);
        self
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The spec without blobs: the client adds them once hashed.
    fn spec(&self) -> Result<JobSpec> {
        let binary_name = self
            .binary
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| invalid(format!("{} does not name a binary file", self.binary.display())))?;
        Ok(JobSpec {
            name: self.name.clone(),
            binary: None,
            binary_name: binary_name.to_string(),
            args: self.args.clone(),
            env: self.env.clone().into_iter().collect(),
            files: Vec::new(),
            resources: Some(self.resources.to_set()?.to_proto()),
            metadata: self.metadata.clone().into_iter().collect(),
        })
    }

    /// Every file to ship, with its path relative to the working directory.
    fn shipped_files(&self) -> Result<Vec<(PathBuf, String)>> {
        let mut shipped = Vec::new();
        for path in &self.files {
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .ok_or_else(|| invalid(format!("{} has no file name to ship it under", path.display())))?;
            collect_files(path, name, &mut shipped)?;
        }
        Ok(shipped)
    }
}

fn invalid(message: String) -> Error {
    raylet_proto::Error::InvalidArgument(message).into()
}

/// Adds `path` (a file, or a directory walked whole) as `relative`.
fn collect_files(path: &Path, relative: &str, shipped: &mut Vec<(PathBuf, String)>) -> Result<()> {
    let metadata =
        std::fs::metadata(path).map_err(|e| invalid(format!("{} cannot be shipped: {e}", path.display())))?;
    if metadata.is_file() {
        shipped.push((path.to_path_buf(), relative.to_string()));
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| invalid(format!("{} has a name that is not UTF-8", entry.path().display())))?;
        collect_files(&entry.path(), &format!("{relative}/{name}"), shipped)?;
    }
    Ok(())
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Waiting for a node with room for the driver.
    Pending,
    Running,
    /// The driver exited with status 0.
    Succeeded,
    Failed,
    /// Stopped on request.
    Stopped,
}

impl JobStatus {
    fn from_proto(status: v1::JobStatus) -> Result<Self> {
        Ok(match status {
            v1::JobStatus::Pending => JobStatus::Pending,
            v1::JobStatus::Running => JobStatus::Running,
            v1::JobStatus::Succeeded => JobStatus::Succeeded,
            v1::JobStatus::Failed => JobStatus::Failed,
            v1::JobStatus::Stopped => JobStatus::Stopped,
            v1::JobStatus::Unspecified => return Err(invalid("the head sent a job without a status".into())),
        })
    }

    /// Whether the job has ended for good.
    pub fn is_ended(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Stopped)
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Stopped => "STOPPED",
        })
    }
}

/// What the head knows of a job.
#[derive(Clone, Debug, Serialize)]
pub struct JobInfo {
    pub id: JobId,
    pub name: String,
    pub status: JobStatus,
    /// What happened, in words.
    pub message: String,
    /// The binary's name and its arguments.
    pub entrypoint: Vec<String>,
    /// Once the driver exited: its exit code, or the signal that ended it.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The last lines the driver wrote to stderr.
    pub stderr_tail: String,
    /// The node that runs or ran the driver.
    pub node: Option<NodeId>,
    pub metadata: BTreeMap<String, String>,
    pub submitted_unix_ms: u64,
    pub ended_unix_ms: Option<u64>,
    /// Bytes of output so far.
    pub log_bytes: u64,
}

impl JobInfo {
    pub(crate) fn from_record(record: JobRecord) -> Result<Self> {
        let status = JobStatus::from_proto(record.status())?;
        let spec = record.spec.unwrap_or_default();
        let node = (!record.node_id.is_empty())
            .then(|| NodeId::from_wire(&record.node_id))
            .transpose()?;
        Ok(JobInfo {
            id: JobId::from_wire(&record.job_id)?,
            name: spec.name,
            status,
            message: record.message,
            entrypoint: std::iter::once(spec.binary_name).chain(spec.args).collect(),
            exit_code: record.exit_code,
            signal: record.signal,
            stderr_tail: record.stderr_tail,
            node,
            metadata: spec.metadata.into_iter().collect(),
            submitted_unix_ms: record.submitted_unix_ms,
            ended_unix_ms: (record.ended_unix_ms > 0).then_some(record.ended_unix_ms),
            log_bytes: record.log_bytes,
        })
    }
}

/// A submitted job: follow it, read its output, stop it.
#[derive(Clone)]
pub struct JobHandle {
    id: JobId,
    uploaded_bytes: u64,
    client: JobClient,
    core: Arc<CoreWorker>,
}

impl JobHandle {
    pub fn id(&self) -> JobId {
        self.id
    }

    /// Bytes the submission uploaded: 0 when the head had every blob.
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded_bytes
    }

    fn run<T, F>(&self, call: impl FnOnce(JobClient, JobId) -> F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.core.block_on(call(self.client.clone(), self.id))
    }

    /// The job's status now.
    pub fn status(&self) -> Result<JobInfo> {
        self.run(|client, id| async move { client.info(id).await })
    }

    /// Waits until the job ends, waiting out a restart of the head.
    pub fn wait(&self) -> Result<JobInfo> {
        self.run(|client, id| async move { client.wait(id).await })
    }

    /// The job's whole output so far, stdout and stderr as they came.
    pub fn logs(&self) -> Result<String> {
        let output = self.run(|client, id| async move { client.logs(id).await })?;
        Ok(String::from_utf8_lossy(&output).into_owned())
    }

    /// The last `lines` lines of the job's output so far.
    pub fn logs_tail(&self, lines: usize) -> Result<String> {
        let logs = self.logs()?;
        let all: Vec<&str> = logs.lines().collect();
        Ok(all[all.len().saturating_sub(lines)..].join("\n"))
    }

    /// The job's output as it comes, until the job ends; a restart of the
    /// head meanwhile is waited out and the output goes on where it was.
    pub fn follow_logs(&self) -> impl Iterator<Item = Result<Vec<u8>>> + use<> {
        let (sender, mut receiver) = tokio::sync::mpsc::channel(16);
        let (client, id) = (self.client.clone(), self.id);
        self.core
            .ctx()
            .runtime
            .spawn(async move { client.follow(id, sender).await });
        std::iter::from_fn(move || receiver.blocking_recv())
    }

    /// Stops the job: SIGTERM to its driver, SIGKILL after [`DEFAULT_STOP_GRACE`].
    pub fn stop(&self) -> Result<JobInfo> {
        self.stop_with_grace(DEFAULT_STOP_GRACE)
    }

    /// Stops the job, giving its driver `grace` to exit after SIGTERM.
    pub fn stop_with_grace(&self, grace: Duration) -> Result<JobInfo> {
        self.run(move |client, id| async move { client.stop(id, grace).await })
    }
}

impl Cluster {
    /// Uploads what the head lacks of the job's binary and files and
    /// starts the job; returns at once.
    pub fn submit(&self, job: Job) -> Result<JobHandle> {
        let core = self.core().clone();
        let (head, token) = (core.ctx().head_address.clone(), core.ctx().token.clone());
        let (client, submitted) = core.block_on(async move {
            let client = JobClient::connect(&head, &token).await?;
            let submitted = client.submit(&job).await?;
            Ok::<_, Error>((client, submitted))
        })?;
        Ok(JobHandle {
            id: submitted.id,
            uploaded_bytes: submitted.uploaded_bytes,
            client,
            core,
        })
    }

    /// Every job of the cluster, oldest first.
    pub fn jobs(&self) -> Result<Vec<JobInfo>> {
        let core = self.core().clone();
        let (head, token) = (core.ctx().head_address.clone(), core.ctx().token.clone());
        core.block_on(async move { JobClient::connect(&head, &token).await?.list().await })
    }

    /// A handle to the job `id`, submitted by anyone.
    pub fn job(&self, id: JobId) -> Result<JobHandle> {
        let core = self.core().clone();
        let (head, token) = (core.ctx().head_address.clone(), core.ctx().token.clone());
        let client = core.block_on(async move { JobClient::connect(&head, &token).await })?;
        Ok(JobHandle {
            id,
            uploaded_bytes: 0,
            client,
            core,
        })
    }
}
