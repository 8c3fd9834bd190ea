//! Ray's Jobs REST API on the head's HTTP port, so that Ray's own job CLI
//! (`ray job submit --address http://HEAD:PORT --working-dir DIR -- CMD`,
//! `ray job status|logs|stop|delete|list`) and SDK (`JobSubmissionClient`)
//! drive raylet jobs unmodified, with the cluster token as their bearer
//! (`--headers '{"Authorization": "Bearer TOKEN"}'`, or `RAY_JOB_HEADERS`).
//! A Ray job's entrypoint is a shell command: it runs as a raylet job whose
//! driver is [`ENTRYPOINT_SCRIPT`], which hands it to `/bin/sh -c` in the
//! job's directory, where the uploaded working directory is unpacked.
//! [`request`] lists which of Ray's fields raylet honours, refuses and
//! ignores.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/version` | the API and Ray versions Ray's client checks |
//! | `GET`, `PUT /api/packages/gcs/{name}` | whether the head has a working_dir package; upload one |
//! | `POST /api/jobs/` | submit: `{"job_id", "submission_id"}` |
//! | `GET /api/jobs/` | every job, as Ray's `JobDetails` |
//! | `GET /api/jobs/{id}`, `DELETE /api/jobs/{id}` | one job; forget an ended one |
//! | `POST /api/jobs/{id}/stop` | stop a job: `{"stopped"}` says whether it was still going |
//! | `GET /api/jobs/{id}/logs` | `{"logs"}`: the output, at most its last [`MAX_LOGS_BYTES`] (`?tail_bytes=N` for less) |
//! | `GET /api/jobs/{id}/logs/tail` | the output over a WebSocket until the job ends |
//!
//! `{id}` is a submission id or a raylet job id.

mod details;
mod error;
mod packages;
mod request;
mod tail;

pub(crate) use error::RayJobsError;
pub(crate) use packages::Packages;

/// Where working_dir packages are uploaded, under their protocol and name.
pub(crate) const PACKAGES_PATH: &str = "/api/packages/";

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Json;
use axum::routing::{MethodRouter, get, post};
use raylet::{Job, JobClient};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Head;
use details::JobDetails;

/// The version of this API that Ray's client reads: above 0, it follows
/// a job's output over the WebSocket.
const API_VERSION: &str = "4";
/// The Ray version whose job API this is, as Ray's client checks it (at
/// least 2.8 for every field it may send).
const RAY_VERSION: &str = "2.60.0";
/// The driver of a job submitted through this API, in its directory.
pub(crate) const ENTRYPOINT_SCRIPT: &str = ".raylet-ray-entrypoint";
/// What the driver runs: its first argument, by the shell.
const ENTRYPOINT_SCRIPT_TEXT: &str = "#!/bin/sh\n\
    # The entrypoint of a job submitted through Ray's job API, run by the\n\
    # shell in the job's directory, as Ray runs it.\n\
    exec /bin/sh -c \"$1\"\n";
/// The most output `GET /api/jobs/{id}/logs` returns: its end, after a
/// line saying how much was left out.
pub(crate) const MAX_LOGS_BYTES: u64 = 4 << 20;

/// The routes of Ray's job API, with their handlers.
pub(super) fn routes() -> Vec<(&'static str, MethodRouter<Head>)> {
    vec![
        ("/api/version", get(version)),
        (
            "/api/packages/{protocol}/{name}",
            get(packages::exists).put(packages::upload),
        ),
        ("/api/jobs/", get(list).post(submit)),
        ("/api/jobs/{id}", get(job).delete(delete)),
        ("/api/jobs/{id}/stop", post(stop)),
        ("/api/jobs/{id}/logs", get(logs)),
        ("/api/jobs/{id}/logs/tail", get(tail::follow)),
    ]
}

async fn connect(head: &Head) -> Result<JobClient, RayJobsError> {
    JobClient::connect(&head.address, &head.token)
        .await
        .map_err(RayJobsError::Head)
}

/// A failure of the head about the job `id`, as this API tells it.
fn head_error(error: raylet::Error, id: &str) -> RayJobsError {
    match error {
        raylet::Error::Cluster(raylet::ClusterError::NotFound(_)) => RayJobsError::UnknownJob(id.to_string()),
        raylet::Error::Cluster(raylet::ClusterError::AlreadyExists(_)) => RayJobsError::Exists(id.to_string()),
        raylet::Error::Cluster(raylet::ClusterError::FailedPrecondition(message)) => RayJobsError::HeadRefused(message),
        error => RayJobsError::Head(error),
    }
}

async fn version() -> Json<Value> {
    Json(json!({
        "version": API_VERSION,
        "ray_version": RAY_VERSION,
        "ray_commit": concat!("raylet-", env!("CARGO_PKG_VERSION")),
        "session_name": "raylet",
    }))
}

async fn submit(State(head): State<Head>, body: Bytes) -> Result<Json<Value>, RayJobsError> {
    let ray_job = request::read(&body)?;
    let package = match &ray_job.package {
        Some(name) => Some(head.packages.find(name)?.ok_or_else(|| RayJobsError::PackageMissing {
            uri: format!("gcs://{name}"),
        })?),
        None => None,
    };
    let scratch = tempfile::Builder::new()
        .prefix("raylet-ray-job-")
        .tempdir()
        .map_err(RayJobsError::io("making a folder for the job"))?;
    let submission_id = ray_job.submission_id.clone();
    let job = {
        let scratch = scratch.path().to_path_buf();
        let built = tokio::task::spawn_blocking(move || job_of(&ray_job, package.as_deref(), &scratch));
        built
            .await
            .map_err(|e| RayJobsError::io("unpacking the package")(std::io::Error::other(e)))??
    };
    let client = connect(&head).await?;
    client
        .submit_as(request::job_id_of(&submission_id), &job)
        .await
        .map_err(|e| head_error(e, &submission_id))?;
    Ok(Json(json!({
        "job_id": submission_id,
        "submission_id": submission_id,
    })))
}

/// The raylet job of a Ray submission: the entrypoint script, with the
/// package unpacked beside it, both under `scratch`.
fn job_of(
    ray_job: &request::RayJob,
    package: Option<&std::path::Path>,
    scratch: &std::path::Path,
) -> Result<Job, RayJobsError> {
    let script = scratch.join(ENTRYPOINT_SCRIPT);
    std::fs::write(&script, ENTRYPOINT_SCRIPT_TEXT).map_err(RayJobsError::io("writing the entrypoint script"))?;
    let working_dir = scratch.join("working_dir");
    std::fs::create_dir(&working_dir).map_err(RayJobsError::io("making the job's working directory"))?;
    if let Some(package) = package {
        packages::unpack(package, &working_dir)?;
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&working_dir).map_err(RayJobsError::io("listing the working directory"))? {
        files.push(entry.map_err(RayJobsError::io("listing the working directory"))?.path());
    }
    let mut job = Job::new(script)
        .name(ray_job.submission_id.clone())
        .args([ray_job.entrypoint.clone()])
        .files(files);
    for (name, value) in &ray_job.env {
        job = job.env(name.clone(), value.clone());
    }
    for (key, value) in &ray_job.metadata {
        job = job.metadata(key.clone(), value.clone());
    }
    for (name, amount) in &ray_job.resources {
        job = job.resource(name, *amount);
    }
    Ok(job)
}

async fn list(State(head): State<Head>) -> Result<Json<Vec<JobDetails>>, RayJobsError> {
    let jobs = connect(&head).await?.list().await.map_err(RayJobsError::Head)?;
    Ok(Json(jobs.into_iter().map(JobDetails::of).collect()))
}

async fn job(State(head): State<Head>, Path(id): Path<String>) -> Result<Json<JobDetails>, RayJobsError> {
    let client = connect(&head).await?;
    let info = client
        .info(request::job_id_of(&id))
        .await
        .map_err(|e| head_error(e, &id))?;
    Ok(Json(JobDetails::of(info)))
}

async fn stop(State(head): State<Head>, Path(id): Path<String>) -> Result<Json<Value>, RayJobsError> {
    let client = connect(&head).await?;
    let job_id = request::job_id_of(&id);
    let info = client.info(job_id).await.map_err(|e| head_error(e, &id))?;
    if info.status.is_ended() {
        return Ok(Json(json!({"stopped": false})));
    }
    client
        .stop(job_id, raylet::DEFAULT_STOP_GRACE)
        .await
        .map_err(|e| head_error(e, &id))?;
    Ok(Json(json!({"stopped": true})))
}

async fn delete(State(head): State<Head>, Path(id): Path<String>) -> Result<Json<Value>, RayJobsError> {
    let client = connect(&head).await?;
    client
        .delete(request::job_id_of(&id))
        .await
        .map_err(|e| head_error(e, &id))?;
    Ok(Json(json!({"deleted": true})))
}

/// The query of `GET /api/jobs/{id}/logs`: `?tail_bytes=N` for only the
/// output's last N bytes (the dashboard's jobs page asks for 64 KiB).
#[derive(Deserialize)]
struct LogsQuery {
    tail_bytes: Option<u64>,
}

/// Ray's answer to a logs request: exactly this one field.
#[derive(Serialize)]
struct Logs {
    logs: String,
}

async fn logs(
    State(head): State<Head>,
    Path(id): Path<String>,
    Query(query): Query<LogsQuery>,
) -> Result<Json<Logs>, RayJobsError> {
    let client = connect(&head).await?;
    let job_id = request::job_id_of(&id);
    let wanted = query.tail_bytes.unwrap_or(MAX_LOGS_BYTES).min(MAX_LOGS_BYTES);
    let bytes = client
        .tail_logs(job_id, wanted + 1)
        .await
        .map_err(|e| head_error(e, &id))?;
    let kept = &bytes[bytes.len().saturating_sub(wanted as usize)..];
    let mut logs = String::new();
    if bytes.len() as u64 > wanted && query.tail_bytes.is_none() {
        logs.push_str(&format!(
            "[raylet: the output's start is left out, only its last {} MiB follow; `raylet job logs {job_id}` prints it all]\n",
            MAX_LOGS_BYTES >> 20
        ));
    }
    logs.push_str(&String::from_utf8_lossy(kept));
    Ok(Json(Logs { logs }))
}
