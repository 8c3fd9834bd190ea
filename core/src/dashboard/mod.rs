//! The head's HTTP server (the dashboard's back end): `/metrics` in
//! Prometheus text and a JSON API under `/api/`, every route behind the
//! cluster token (`Authorization: Bearer TOKEN`). It reads the cluster
//! from the head over gRPC at each request, as Ray's dashboard reads the
//! GCS, so it holds no state of its own.
//!
//! | route | what |
//! |---|---|
//! | `GET /metrics` | gauges of nodes, resources, actors, placement groups, jobs and object stores |
//! | `GET /api/nodes` | every node incarnation, as `raylet list nodes --format json` |
//! | `GET /api/jobs` | every job |
//! | `GET /api/actors` | every actor |
//! | `GET /api/placement_groups` | every placement group |
//! | `GET /api/objects` | each node's object store and its objects |
//! | `GET /api/tasks?job=ID&limit=N` | the newest recorded task attempts (default 1,000), as `raylet list tasks --format json` |
//! | `GET /api/tasks/summary?job=ID` | attempts per function and state, as `raylet summary tasks --format json` |
//! | `GET /api/timeline?job=ID` | the Chrome trace that `raylet timeline` writes |

mod metrics;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use raylet_proto::JobId;
use raylet_proto::auth::AuthToken;
use raylet_scheduler::status::ClusterStatus;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::job::JobClient;

/// How long a request waits for the head.
const PATIENCE: Duration = Duration::from_secs(2);

/// What the handlers need: where the head is and its token.
#[derive(Clone)]
struct Head {
    address: String,
    token: AuthToken,
}

/// Serves the dashboard on `listener` for the head at `head` until
/// `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    head: String,
    token: AuthToken,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let head = Head { address: head, token };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/nodes", get(nodes))
        .route("/api/jobs", get(jobs))
        .route("/api/actors", get(actors))
        .route("/api/placement_groups", get(placement_groups))
        .route("/api/objects", get(objects))
        .route("/api/tasks", get(tasks))
        .route("/api/tasks/summary", get(task_summary))
        .route("/api/timeline", get(timeline))
        .route_layer(middleware::from_fn_with_state(head.clone(), require_token))
        .with_state(head);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Refuses a request without `Authorization: Bearer <the cluster token>`.
async fn require_token(State(head): State<Head>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes());
    match presented.is_some_and(|value| head.token.admits_bearer(value)) {
        true => next.run(request).await,
        false => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this raylet cluster needs its token: send Authorization: Bearer <token> \
             (the token is in <temp-dir>/session_latest/token)\n",
        )
            .into_response(),
    }
}

/// A failure to reach the head, as a 502 naming it.
fn unreachable(head: &Head, error: impl std::fmt::Display) -> Response {
    let message = format!("asking the raylet head at {}: {error}\n", head.address);
    (StatusCode::BAD_GATEWAY, message).into_response()
}

fn json<T: Serialize, E: std::fmt::Display>(head: &Head, rows: Result<T, E>) -> Response {
    match rows {
        Ok(rows) => Json(rows).into_response(),
        Err(e) => unreachable(head, e),
    }
}

async fn metrics(State(head): State<Head>) -> Response {
    match metrics::render(&head.address, &head.token, PATIENCE).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => unreachable(&head, e),
    }
}

async fn nodes(State(head): State<Head>) -> Response {
    let status = ClusterStatus::fetch(&head.address, &head.token, PATIENCE).await;
    json(&head, status.map(|status| status.nodes))
}

async fn jobs(State(head): State<Head>) -> Response {
    let jobs = async { JobClient::connect(&head.address, &head.token).await?.list().await };
    json(&head, jobs.await)
}

async fn actors(State(head): State<Head>) -> Response {
    json(&head, crate::list_actors(&head.address, &head.token).await)
}

async fn placement_groups(State(head): State<Head>) -> Response {
    json(&head, crate::list_placement_groups(&head.address, &head.token).await)
}

async fn objects(State(head): State<Head>) -> Response {
    json(&head, crate::collect_memory(&head.address, &head.token).await)
}

/// The query of the task routes: `?job=ID&limit=N`.
#[derive(Deserialize)]
struct TaskQuery {
    job: Option<JobId>,
    limit: Option<u32>,
}

/// Rows a task listing returns when the query sets no limit.
const DEFAULT_TASK_ROWS: u32 = 1_000;

async fn tasks(State(head): State<Head>, Query(query): Query<TaskQuery>) -> Response {
    let limit = query.limit.unwrap_or(DEFAULT_TASK_ROWS);
    json(
        &head,
        crate::list_tasks(&head.address, &head.token, query.job, limit).await,
    )
}

async fn task_summary(State(head): State<Head>, Query(query): Query<TaskQuery>) -> Response {
    let listing = crate::list_tasks(&head.address, &head.token, query.job, u32::MAX).await;
    json(&head, listing.map(|listing| crate::summarize_tasks(&listing.tasks)))
}

async fn timeline(State(head): State<Head>, Query(query): Query<TaskQuery>) -> Response {
    json(&head, crate::chrome_trace(&head.address, &head.token, query.job).await)
}
