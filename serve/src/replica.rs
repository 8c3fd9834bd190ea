//! The replica actor: one built deployment, answering requests.
//!
//! Admission is a semaphore of `max_ongoing_requests` permits: a request
//! that finds none, or that comes while the deployment reports itself full
//! ([`Deployment::fullness`](crate::Deployment::fullness) at 1 or more), is
//! answered [`Outcome::Rejected`] at once, without running user code, and
//! its router tries elsewhere or queues. User code runs on a runtime the
//! replica owns, because the actor's async methods share the worker's
//! single task thread: a slow or CPU-heavy call then never delays
//! admission, rejections or health checks. Every reply carries the count
//! of ongoing requests and the fullness, and a stream's first and last
//! chunks the fullness: routers estimate the replica's load from them.
//! [`Replica::load`] tells the controller the count, with how long the
//! replica has been idle (it stops a draining replica only once that is
//! long enough that no routed request can still be on its way), the
//! deployment's figures, and the requests waiting in this process's
//! routers (a deployment that calls another through a handle queues its
//! requests here while the other has no replica, scaled to zero).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{FutureExt, Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::deployment::ReplicaContext;
use crate::error::ServeError;
use crate::figures::Figure;
use crate::registry::{self, ChunkStream, ErasedDeployment};
use crate::routes::{self, QueueReport, RoutingTable};
use crate::wire::{Outcome, ServeReply, ServeRequest, StreamChunk};

/// What a replica is built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaSpec {
    pub context: ReplicaContext,
    /// The registered class name.
    pub class: String,
    #[serde(with = "serde_bytes")]
    pub init: Vec<u8>,
    pub user_config: Option<serde_bytes::ByteBuf>,
    pub max_ongoing_requests: u32,
    /// Threads of the runtime user code runs on.
    pub threads: usize,
    /// The deployment's version, which the controller reads back after it
    /// restarts.
    pub version: String,
}

/// What a replica reports to the controller.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaLoad {
    pub version: String,
    /// Requests running now.
    pub ongoing: u32,
    /// Milliseconds since a request last arrived or ended.
    pub idle_ms: u64,
    /// Requests answered since the replica started, and how many of them
    /// with an error.
    pub answered: u64,
    pub errors: u64,
    /// The deployment's figures (see [`Deployment::figures`](crate::Deployment::figures)).
    pub figures: Vec<Figure>,
    /// Requests waiting in this process's routers (the handles of its
    /// deployment), by deployment.
    pub queued: Vec<QueueReport>,
}

/// One replica of a deployment.
#[raylet::actor]
pub struct Replica {
    deployment: Arc<dyn ErasedDeployment>,
    admission: Arc<Semaphore>,
    max_ongoing: u32,
    name: String,
    version: String,
    runtime: UserRuntime,
    counts: Arc<Counts>,
}

/// Chunks of a streamed answer buffered between the deployment and the
/// caller.
const STREAM_BUFFER: usize = 4;

/// Hands a deployment's chunks to the caller until either side ends, then
/// gives the admission permit back and, to a caller still there, the
/// fullness without this request.
async fn forward(
    deployment: Arc<dyn ErasedDeployment>,
    mut stream: ChunkStream,
    chunks: tokio::sync::mpsc::Sender<StreamChunk>,
    permit: OwnedSemaphorePermit,
    counts: Arc<Counts>,
) {
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        failed |= chunk.is_failure();
        if chunks.send(chunk).await.is_err() {
            break;
        }
    }
    drop(stream);
    drop(permit);
    counts.touch();
    counts.count(failed);
    let end = StreamChunk::End {
        fullness: deployment.fullness(),
    };
    let _ = chunks.send(end).await;
}

/// What a replica has answered, and when it last saw a request.
struct Counts {
    started: Instant,
    /// Milliseconds after `started`.
    last_activity_ms: AtomicU64,
    answered: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_activity_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn idle_ms(&self) -> u64 {
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_activity_ms.load(Ordering::Relaxed))
    }

    fn count(&self, failed: bool) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[raylet::actor]
impl Replica {
    pub fn new(spec: ReplicaSpec) -> Result<Self, ServeError> {
        let registered = registry::find(&spec.class)?;
        let user_config = spec.user_config.as_deref().map(Vec::as_slice);
        let deployment = (registered.construct)(&spec.init, user_config, &spec.context)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.threads.max(1))
            .thread_name(format!("serve-{}", spec.context.deployment))
            .enable_all()
            .build()
            .map_err(|e| ServeError::ReplicaFailed {
                replica: spec.context.replica.clone(),
                message: format!("starting the runtime for user code: {e}"),
            })?;
        Ok(Replica {
            deployment,
            admission: Arc::new(Semaphore::new(spec.max_ongoing_requests as usize)),
            max_ongoing: spec.max_ongoing_requests,
            name: spec.context.replica,
            version: spec.version,
            runtime: UserRuntime {
                handle: runtime.handle().clone(),
                runtime: Some(runtime),
            },
            counts: Arc::new(Counts {
                started: Instant::now(),
                last_activity_ms: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                errors: AtomicU64::new(0),
            }),
        })
    }

    /// Answers one request, or rejects it at once when full.
    pub async fn handle(&self, request: ServeRequest) -> ServeReply {
        self.counts.touch();
        let Some(permit) = self.admit() else {
            return self.reply(Outcome::Rejected);
        };
        let outcome = self.deployment.clone().call(request.head, Bytes::from(request.body));
        let outcome = self.runtime.run(outcome).await;
        drop(permit);
        self.counts.touch();
        self.counts.count(outcome.is_failure());
        self.reply(outcome)
    }

    /// Streams the answer to one request, or rejects it at once when full.
    /// The deployment's stream runs on the user runtime and is handed over
    /// a small channel, so a slow client holds back the deployment, not
    /// the worker; dropping the caller's end (a client gone) stops it and
    /// frees its place.
    #[raylet::method(streaming)]
    pub async fn handle_stream(&self, request: ServeRequest) -> impl Stream<Item = StreamChunk> + use<> {
        self.counts.touch();
        let (chunks, received) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        match self.admit() {
            None => {
                let _ = chunks.try_send(StreamChunk::Rejected);
            }
            Some(permit) => {
                let deployment = self.deployment.clone();
                let stream = deployment.clone().stream(request.head, Bytes::from(request.body));
                let forwarding = forward(deployment, stream, chunks, permit, self.counts.clone());
                self.runtime.handle.spawn(forwarding);
            }
        }
        futures_util::stream::unfold(received, |mut received| async move {
            received.recv().await.map(|chunk| (chunk, received))
        })
    }

    /// How busy the replica is, with the deployment's figures (asked on
    /// the user runtime, so that a slow answer delays only this report).
    pub async fn load(&self) -> ReplicaLoad {
        let deployment = self.deployment.clone();
        let figures = self.runtime.handle.spawn_blocking(move || deployment.figures());
        ReplicaLoad {
            version: self.version.clone(),
            ongoing: self.ongoing(),
            idle_ms: self.counts.idle_ms(),
            answered: self.counts.answered.load(Ordering::Relaxed),
            errors: self.counts.errors.load(Ordering::Relaxed),
            figures: figures.await.unwrap_or_default(),
            queued: routes::queued(),
        }
    }

    /// Applies a new user config (the deployment's `UserConfig`, encoded)
    /// without restarting.
    pub fn reconfigure(&self, user_config: serde_bytes::ByteBuf) -> Result<(), ServeError> {
        self.deployment
            .reconfigure(&user_config)
            .map_err(|message| ServeError::ReplicaFailed {
                replica: self.name.clone(),
                message: format!("reconfigure: {message}"),
            })
    }

    /// The deployment's health check.
    pub fn check_health(&self) -> Result<(), ServeError> {
        self.deployment
            .check_health()
            .map_err(|message| ServeError::ReplicaFailed {
                replica: self.name.clone(),
                message: format!("health check: {message}"),
            })
    }

    /// Installs the routing table, through which this replica's
    /// [`DeploymentHandle`](crate::DeploymentHandle)s route.
    pub fn install_routes(&self, table: RoutingTable) {
        routes::install(table);
    }
}

impl Replica {
    fn ongoing(&self) -> u32 {
        self.max_ongoing - self.admission.available_permits() as u32
    }

    /// A place for one more request: none while the deployment reports
    /// itself full or `max_ongoing_requests` run.
    fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if self.deployment.fullness().is_some_and(|fullness| fullness >= 1.0) {
            return None;
        }
        self.admission.clone().try_acquire_owned().ok()
    }

    fn reply(&self, outcome: Outcome) -> ServeReply {
        ServeReply {
            ongoing: self.ongoing(),
            fullness: self.deployment.fullness(),
            outcome,
        }
    }
}

/// The runtime user code runs on. A runtime must not be dropped inside
/// another one's async context, where the actor may be dropped: it is shut
/// down in the background instead.
struct UserRuntime {
    handle: Handle,
    runtime: Option<Runtime>,
}

impl UserRuntime {
    /// Runs a deployment's call on this runtime and hands its outcome back
    /// (a panic as a user error). The outcome comes over a channel whose
    /// send wakes the actor's thread, which is then told to stop polling
    /// before it sleeps ([`wake_spinning`](raylet_proto::task_stream::wake_spinning)):
    /// an answer ready within the poll costs the actor no sleep.
    async fn run(&self, call: impl Future<Output = Outcome> + Send + 'static) -> Outcome {
        let (sender, outcome) = tokio::sync::oneshot::channel();
        self.handle.spawn(async move {
            let outcome = AssertUnwindSafe(call).catch_unwind().await;
            let _ = sender.send(outcome.unwrap_or_else(|panic| Outcome::UserError(panic_message(panic))));
            raylet_proto::task_stream::wake_spinning();
        });
        outcome
            .await
            .unwrap_or_else(|_| Outcome::UserError("the call was cancelled".to_string()))
    }
}

impl Drop for UserRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What a panic in user code said.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    format!("panicked: {}", text.unwrap_or_else(|| "(no message)".to_string()))
}
