//! The head's HTTP server: the dashboard's pages under `/ui/`, `/metrics`
//! in Prometheus text and a JSON API under `/api/`, every route but the
//! login page behind the cluster token (`Authorization: Bearer TOKEN`, or
//! the cookie that `/login` sets). It reads the cluster from the head over
//! gRPC at each request, as Ray's dashboard reads the GCS; it keeps only
//! the last ten minutes of node samples for the overview's charts.
//!
//! | route | what |
//! |---|---|
//! | `GET /healthz` | `ok`: the only route without the token, for load balancers; it tells nothing else |
//! | `GET /login`, `POST /login` | the login form; a right token sets the cookie |
//! | `GET /ui/`, `/ui/{jobs,actors,tasks,placement-groups,objects,train,serve}` | the pages |
//! | `GET /metrics` | gauges of nodes, resources, actors, placement groups, jobs and object stores |
//! | `GET /api/cluster_history` | each alive node's CPU, memory and GPU use every 2 s over 10 min |
//! | `GET /api/nodes` | every node incarnation, as `raylet list nodes --format json` |
//! | `GET /api/jobs` | every job |
//! | `GET /api/actors` | every actor |
//! | `GET /api/placement_groups` | every placement group |
//! | `GET /api/objects` | each node's object store and its objects |
//! | `GET /api/tasks?job=ID&limit=N` | the newest recorded task attempts (default 1,000), as `raylet list tasks --format json` |
//! | `GET /api/tasks/summary?job=ID` | attempts per function and state, as `raylet summary tasks --format json` |
//! | `GET /api/timeline?job=ID` | the Chrome trace that `raylet timeline` writes |
//! | `GET /api/train` | Train runs as they publish themselves: status, workers and each report's metrics |
//! | `GET /api/tune` | Tune experiments: status, metric and each trial's config, status and results |
//! | `GET /api/serve` | the Serve controller's status (applications, deployments, replicas, autoscaling, proxies), or `null` without Serve |
//! | `GET /api/prometheus_targets` | the head's `/metrics` and every alive node's, in Prometheus's HTTP service discovery format |
//! | `/api/version`, `/api/packages/...`, `/api/jobs/...` | Ray's Jobs REST API, for Ray's job CLI and SDK (see [`ray_jobs`]) |
//!
//! A joining node serves only `/metrics`, its own process's metrics, from
//! [`serve_node_metrics`]; a program's embedded cluster serves the
//! dashboard when the program asks, through [`LocalDashboard`].
//!
//! This crate is apart from `raylet` so that a user's program, which every
//! worker runs again, links no HTTP server unless it asks for one.

mod assets;
mod auth;
mod history;
mod local;
mod metrics;
mod ray_jobs;

pub use local::LocalDashboard;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Json, Redirect, Response};
use axum::routing::{MethodRouter, get};
use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_common::http_listener::{self, HttpBounds, UploadRoute};
use raylet_proto::JobId;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use raylet::JobClient;

/// How long a request waits for the head.
const PATIENCE: Duration = Duration::from_secs(2);
/// The largest login form: a token is at most 256 characters.
const LOGIN_BODY_BYTES: usize = 4 << 10;
/// The largest body a working_dir package upload may announce; the route
/// itself refuses one over 60 MiB, saying why (`ray_jobs::packages`).
const MAX_UPLOAD_BYTES: u64 = 1 << 30;

/// What the handlers need: where the head is, its token, and the samples
/// of the overview's charts.
#[derive(Clone)]
struct Head {
    address: String,
    /// Where this server serves, for the head's own Prometheus target.
    dashboard: String,
    token: AuthToken,
    history: history::History,
    /// The working_dir packages uploaded through Ray's job API.
    packages: ray_jobs::Packages,
}

/// Every route of the head's HTTP server but [`PUBLIC_PATHS`], with its
/// handler. The token check wraps the whole server, not these routes, so a
/// route served from anywhere needs the token unless its path is public;
/// the auth test walks this list (through [`route_paths`]) and asks paths
/// that no route serves.
fn guarded_routes() -> Vec<(&'static str, MethodRouter<Head>)> {
    vec![
        ("/", get(|| async { Redirect::to("/ui/") })),
        ("/ui/", get(assets::page)),
        ("/ui/{page}", get(assets::page)),
        ("/ui/assets/app.js", get(assets::script)),
        ("/ui/assets/app.css", get(assets::style)),
        ("/metrics", get(metrics)),
        ("/api/cluster_history", get(cluster_history)),
        ("/api/nodes", get(nodes)),
        ("/api/jobs", get(jobs)),
        ("/api/actors", get(actors)),
        ("/api/placement_groups", get(placement_groups)),
        ("/api/objects", get(objects)),
        ("/api/tasks", get(tasks)),
        ("/api/tasks/summary", get(task_summary)),
        ("/api/timeline", get(timeline)),
        ("/api/train", get(train_runs)),
        ("/api/tune", get(tune_experiments)),
        ("/api/serve", get(serve_status)),
        ("/api/prometheus_targets", get(prometheus_targets)),
    ]
    .into_iter()
    .chain(ray_jobs::routes())
    .collect()
}

/// The paths of every route of the head's HTTP server that needs the
/// token (all but [`PUBLIC_PATHS`]), as axum spells them (`{id}` for a
/// parameter).
pub fn route_paths() -> Vec<&'static str> {
    guarded_routes().into_iter().map(|(path, _)| path).collect()
}

/// The only paths the head's HTTP server answers without the token: the
/// health check and the login form. Every other request, to a route or
/// not, is refused before it is routed.
pub const PUBLIC_PATHS: [&str; 2] = ["/healthz", "/login"];

/// The routes of a joining node's HTTP server, all behind the token.
pub const NODE_ROUTES: [&str; 1] = ["/metrics"];

/// Serves the dashboard on `listener` for the head at `head` until
/// `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    head: String,
    token: AuthToken,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let head = Head {
        address: head,
        dashboard: listener.local_addr()?.to_string(),
        token,
        history: Default::default(),
        packages: ray_jobs::Packages::new()?,
    };
    let sampler = tokio::spawn(history::keep_sampling(
        head.address.clone(),
        head.token.clone(),
        head.history.clone(),
    ));
    let app = guarded_routes()
        .into_iter()
        .fold(Router::new(), |router, (path, route)| router.route(path, route))
        .route(PUBLIC_PATHS[0], get(|| async { "ok\n" }))
        .route(
            PUBLIC_PATHS[1],
            get(auth::login_page)
                .post(auth::log_in)
                .layer(DefaultBodyLimit::max(LOGIN_BODY_BYTES)),
        )
        .layer(middleware::from_fn_with_state(head.clone(), auth::require_token))
        .with_state(head);
    let bounds = HttpBounds {
        upload_route: Some(UploadRoute {
            method: "PUT",
            path_prefix: ray_jobs::PACKAGES_PATH,
            max_body_bytes: MAX_UPLOAD_BYTES,
        }),
        ..HttpBounds::default()
    };
    let served = http_listener::serve_with(listener, app, bounds, shutdown).await;
    sampler.abort();
    served
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

async fn cluster_history(State(head): State<Head>) -> Response {
    let samples: Vec<history::Sample> = head
        .history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    Json(samples).into_response()
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
    json(&head, raylet::list_actors(&head.address, &head.token).await)
}

async fn placement_groups(State(head): State<Head>) -> Response {
    json(&head, raylet::list_placement_groups(&head.address, &head.token).await)
}

async fn objects(State(head): State<Head>) -> Response {
    json(&head, raylet::collect_memory(&head.address, &head.token).await)
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
        raylet_state::list_tasks(&head.address, &head.token, query.job, limit).await,
    )
}

async fn task_summary(State(head): State<Head>, Query(query): Query<TaskQuery>) -> Response {
    let listing = raylet_state::list_tasks(&head.address, &head.token, query.job, u32::MAX).await;
    json(
        &head,
        listing.map(|listing| raylet_state::summarize_tasks(&listing.tasks)),
    )
}

async fn timeline(State(head): State<Head>, Query(query): Query<TaskQuery>) -> Response {
    json(
        &head,
        raylet_state::chrome_trace(&head.address, &head.token, query.job).await,
    )
}

async fn train_runs(State(head): State<Head>) -> Response {
    json(
        &head,
        raylet::dashboard_entries(&head.address, &head.token, "train").await,
    )
}

async fn tune_experiments(State(head): State<Head>) -> Response {
    json(
        &head,
        raylet::dashboard_entries(&head.address, &head.token, "tune").await,
    )
}

/// The status the Serve controller published last, as `raylet serve
/// status --format json` prints it; `null` when Serve never ran.
async fn serve_status(State(head): State<Head>) -> Response {
    let entries = raylet::dashboard_entries(&head.address, &head.token, "serve").await;
    json(&head, entries.map(|entries| entries.into_iter().next()))
}

/// The head's `/metrics` (this server's) and every alive node's, as
/// Prometheus's `http_sd_configs` reads them (with `__scheme__` https in a
/// TLS cluster). The head's target has the label `component="head"`, the
/// nodes' `component="node"`.
async fn prometheus_targets(State(head): State<Head>) -> Response {
    let status = ClusterStatus::fetch(&head.address, &head.token, PATIENCE).await;
    let scheme = match raylet_common::tls::current() {
        Ok(Some(_)) => "https",
        _ => "http",
    };
    let targets = status.map(|status| {
        let head_labels = serde_json::json!({"component": "head", "__scheme__": scheme});
        let own = serde_json::json!({"targets": [head.dashboard], "labels": head_labels});
        let alive = status.alive().filter_map(|node| {
            let address = node.metrics_address.clone()?;
            let labels = serde_json::json!({
                "component": "node",
                "node_id": node.node_id.to_string(),
                "hostname": node.hostname,
                "is_head_node": node.is_head_node.to_string(),
                "__scheme__": scheme,
            });
            Some(serde_json::json!({"targets": [address], "labels": labels}))
        });
        std::iter::once(own).chain(alive).collect::<Vec<_>>()
    });
    json(&head, targets)
}

/// Serves a node's `/metrics` (its process's registry: leases,
/// object store disk traffic, RPC latencies) on `listener`, behind the
/// cluster token, until `shutdown` resolves.
pub async fn serve_node_metrics(
    listener: TcpListener,
    token: AuthToken,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let text = || async {
        let text = raylet_common::metrics::encode_text();
        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
    };
    let app = Router::new()
        .route(NODE_ROUTES[0], get(text))
        .layer(middleware::from_fn_with_state(token, auth::require_bearer));
    http_listener::serve(listener, app, shutdown).await
}
