//! raylet-serve: online inference on a raylet cluster.
//!
//! A [`Deployment`] is a type whose replicas are actors. Each replica
//! (the non-generic [`Replica`](replica::Replica) actor) finds the type by
//! name in a registry that [`register_deployment!`] fills, builds it once
//! from its `Init`, and answers requests with it. An [`HttpProxy`] actor on
//! every alive node serves HTTP and routes each request, by the longest
//! matching path prefix, to an application's ingress deployment.
//!
//! **Protocol.** A request travels as a [`wire::ServeRequest`] (the raw
//! body, with the HTTP request's [`HttpHead`] when it came through a
//! proxy) on an ordinary actor call; the replica decodes it into the
//! deployment's request type, so a malformed body costs one actor round
//! trip and comes back as a 400. Every [`wire::ServeReply`] carries the
//! replica's number of ongoing requests and, for a deployment that reports
//! one, its fullness, as do a stream's first and last chunks.
//!
//! **HTTP APIs.** A deployment whose request type is [`HttpRequest`] sees
//! every method (`GET` included), the path below its route prefix, the
//! query, and `Content-Type` and `Accept` (never `Authorization`): enough
//! to serve an API of its own, such as OpenAI's. User code that returns an
//! [`HttpError`] (from `call`, or from `stream` before the first chunk) is
//! answered with exactly its status, content type and body, and counted in
//! the metrics under that status; through a [`DeploymentHandle`] the caller
//! gets [`ServeError::Status`], which passes the status on when returned
//! in turn.
//!
//! **Routing and back-pressure.** Proxies and [`DeploymentHandle`]s route
//! through one router per deployment and process: the power of two
//! choices on what each replica last reported. A deployment that knows its
//! real limit reports how full each replica is ([`Deployment::fullness`]:
//! an LLM server's key/value cache tokens reserved and wanted, over its
//! budget, since a replica running 3 long requests can be fuller than one
//! running 10 short ones); routers then send each request to the emptier
//! of two replicas (adding a little for each call sent since the report,
//! so that a burst spreads), and a replica at 1 or more is full. Other
//! deployments go by the router's in-flight calls plus the replica's
//! reported ongoing requests. A replica admits at most
//! `max_ongoing_requests`, none while it reports itself full, and rejects
//! the rest at once; a router holds at most `max_queued_requests`
//! waiting requests (answered when a replica reports room) and refuses
//! more with [`ServeError::BackPressure`] (HTTP 503 with `Retry-After`).
//! Nothing queues without bound.
//!
//! **Streaming.** A deployment with `STREAMING = true` answers HTTP with
//! [`Deployment::stream`]'s chunks as they come (chunked transfer
//! encoding, each chunk written to the client as it comes, as server-sent
//! events need), over a streaming actor call, under the content type
//! [`Deployment::stream_content_type`] chooses for the request
//! (`text/event-stream`, say); a client that goes away cancels the stream
//! and frees its place at the replica. [`DeploymentHandle::stream`] takes
//! a streaming deployment's chunks from Rust, so a deployment can stream
//! another's on; dropping it cancels the call there too.
//!
//! **Costs.** One actor call per request (tens of microseconds on one
//! node) plus HTTP handling in the proxy; user code runs on a runtime the
//! replica owns, so slow requests never delay admission or rejection.
//!
//! **Controller.** One detached [`controller::ServeController`] actor per
//! cluster owns every replica and proxy: it keeps what should run in the
//! head's key-value store, converges on it (starting, health-checking,
//! draining and replacing replicas, rolling out new versions in batches,
//! autoscaling on ongoing plus queued requests), and pushes the routing
//! table to proxies and replicas. [`run`] deploys or updates an
//! application through it; [`status`], [`delete`] and [`shutdown`] do the
//! rest, as do `raylet serve status|deploy|delete` (see [`deploy_file`]).
//! The status shows each deployment's own [`Figure`]s
//! ([`Deployment::figures`]: tokens per second, latency percentiles),
//! summed or averaged over its running replicas.
//!
//! **Scale to zero.** An autoscaling deployment with `min_replicas: 0`
//! stops its last replica after `downscale_delay` without requests. A
//! request that comes then waits in its router's bounded queue (503 when
//! it is full, 504 past the proxy's request timeout); the controller,
//! which polls the proxies' queues every 100 ms while a deployment is at
//! zero and the replicas' (their handles') with their load, starts a
//! replica at once, and the request is answered when it runs. A
//! deployment with a higher minimum that lost every replica holds its
//! requests the same way while the controller replaces them, as Ray
//! Serve's routers do: a client sees a slower answer, not an error.
//! [`ServeError::NoReplicas`] (503) is left for a deployment no replica
//! will come to, its version having failed to start.
//!
//! **Failure.** A replica that dies or fails its health check is replaced.
//! A request it never got goes to another replica; one it was running
//! fails with [`ServeError::ReplicaDied`] (503). A rolling update drains
//! an old replica only after every proxy and replica has stopped routing
//! to it and it has been idle, so no request is dropped. A version whose
//! replicas cannot be built three times in a row fails its deploy and
//! leaves the old version serving; a version that has run never gives up
//! replacing replicas, waiting longer after each failed start
//! ([`status::AppState::Unhealthy`]). A proxy that cannot start (its port
//! is taken) is started again after a back-off, not at once, and is
//! reported in the status. A restarted controller takes its replicas and
//! proxies back by name. A replica that waits for resources is named in
//! the status with what it waits for.
//!
//! **Batching.** A [`Batcher`] gathers the requests of concurrent calls
//! into batches for one async handler, like Ray Serve's `@serve.batch`.
//!
//! ```no_run
//! use raylet_serve::{Application, BoxError, Deployment, DeploymentConfig, Json, ReplicaContext};
//!
//! struct Doubler;
//! raylet_serve::register_deployment!(Doubler);
//!
//! impl Deployment for Doubler {
//!     type Init = ();
//!     type UserConfig = ();
//!     type Request = Json<i64>;
//!     type Response = Json<i64>;
//!     fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
//!         Ok(Doubler)
//!     }
//!     async fn call(&self, Json(x): Json<i64>) -> Result<Json<i64>, BoxError> {
//!         Ok(Json(2 * x))
//!     }
//! }
//!
//! let cluster = raylet::init()?;
//! let app = Application::new("doubler", "/double").deployment(DeploymentConfig::new::<Doubler>("doubler", ())?);
//! let serve = raylet_serve::run(&cluster, app)?;
//! println!("POST http://{}/double", serve.address());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;
mod config;
pub mod controller;
pub mod deploy_file;
mod deployment;
mod error;
mod figures;
mod handle;
mod http_messages;
mod instance;
mod load_estimate;
mod metrics;
mod proxy;
mod registry;
pub mod replica;
mod router;
mod routes;
pub mod status;
pub mod wire;

pub use batch::{BatchError, BatchOptions, Batcher};
/// The raw-bytes request and response body.
pub use bytes::Bytes;
pub use config::{Application, AutoscalingConfig, DeploymentConfig, HttpOptions};
pub use deployment::{Body, BodyError, BoxError, Deployment, Encoding, Json, ReplicaContext};
pub use error::{Result, ServeError};
pub use figures::{Combine, Figure};
pub use handle::DeploymentHandle;
pub use http_messages::{HttpError, HttpHead, HttpRequest};
pub use instance::{ServeInstance, delete, run, run_with, shutdown, status};
pub use proxy::HttpProxy;
pub use router::BodyStream;
pub use status::ServeStatus;

#[doc(hidden)]
pub use registry::__private;
