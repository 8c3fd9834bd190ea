//! Routing one deployment's requests to its replicas: the power of two
//! choices, as Ray Serve does, by what each replica reports of its load.
//!
//! **Load estimate.** For a deployment that reports its fullness
//! ([`Deployment::fullness`](crate::Deployment::fullness): an LLM server's
//! key/value cache reserved and wanted, over its budget), what the replica
//! last reported (with every reply, and at the start and end of every
//! stream), plus a little for each call this router sent it since. For
//! one that does not, or whose report is older than
//! [`REPORT_TTL`](crate::load_estimate::REPORT_TTL): the calls this router
//! has in flight there plus the others the replica last reported (its
//! reply's `ongoing` minus ours), over `max_ongoing_requests`. See
//! [`load_estimate`](crate::load_estimate).
//!
//! **Choosing.** Sample two replicas and take the less loaded one that has
//! room: below `max_ongoing_requests` always, and below a reported
//! fullness of 1; if neither has, take the least loaded with room of all.
//! If none has room, the request waits in a bounded queue
//! (`max_queued_requests`) until a call of this router ends (or a stream's
//! end reports room) or [`RECHECK`] passes; a full queue refuses it at
//! once with [`ServeError::BackPressure`].
//!
//! **No replica.** A deployment with no replica (scaled to zero, or every
//! replica lost and being replaced) holds its requests in the same bounded
//! queue until one runs, as Ray Serve's routers do: the controller sees
//! the queue and starts a replica, and the proxy's request timeout bounds
//! the wait. Only a deployment that no replica will come to (its version
//! failed to start) fails at once with [`ServeError::NoReplicas`].
//!
//! **Stale estimates.** A replica that rejects (it was full through other
//! routers, or by its fullness) counts as full for
//! [`REJECTED_PAUSE`](crate::load_estimate::REJECTED_PAUSE) and until its
//! report expires; the request is routed again. A full replica's report
//! expiring is what makes this router try it again when no stream's end
//! said it has room: a request it cannot take costs one rejection.
//!
//! **Failure.** A call that fails because the replica is gone drops the
//! replica from this router. If the replica never got the call
//! (`TaskErrorKind::ActorDiedBeforeSend`), the request is routed again to
//! another replica; if it may have run, it fails with
//! [`ServeError::ReplicaDied`] and is not resent.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use rand::seq::index::sample;
use raylet::{ObjectRefStream, TaskError, TaskErrorKind};
use tokio::sync::Notify;

use crate::deployment::Encoding;
use crate::error::{Result, ServeError};
use crate::http_messages::{HttpError, HttpHead};
use crate::load_estimate::{LoadEstimate, least_loaded};
use crate::replica::ReplicaHandle;
use crate::routes::DeploymentRoutes;
use crate::wire::{Outcome, ServeReply, ServeRequest, StreamChunk};

#[cfg(test)]
mod tests;

/// A streamed answer's body, chunk by chunk: an error ends it.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;

/// A streamed answer whose first chunk came.
pub(crate) struct OpenedStream {
    /// What [`Deployment::stream_content_type`](crate::Deployment::stream_content_type) said.
    pub content_type: String,
    pub chunks: BodyStream,
}

/// How often a waiting request looks again without being woken (a wake-up
/// can be missed between looking and waiting, or go to a waiter that left).
const RECHECK: Duration = Duration::from_millis(50);

/// The router of one deployment in this process.
pub(crate) struct Router {
    app: String,
    deployment: String,
    class: String,
    state: Mutex<State>,
    freed: Notify,
}

struct State {
    replicas: Vec<Slot>,
    max_ongoing: u32,
    max_queued: u32,
    /// Whether requests wait while there is no replica.
    awaits_replicas: bool,
    waiting: u32,
}

impl State {
    /// The estimate of replica `name`'s load, while this router routes to
    /// it.
    fn load_of(&mut self, name: &str) -> Option<&mut LoadEstimate> {
        let slot = self.replicas.iter_mut().find(|slot| slot.name == name)?;
        Some(&mut slot.load)
    }
}

struct Slot {
    name: String,
    handle: ReplicaHandle,
    load: LoadEstimate,
}

impl Slot {
    fn new(name: &str, handle: &ReplicaHandle) -> Self {
        Slot {
            name: name.to_string(),
            handle: handle.clone(),
            load: LoadEstimate::default(),
        }
    }
}

/// What choosing a replica gave.
enum Choice {
    Replica(InFlight),
    /// Every replica is full, or there is none yet: wait.
    Wait,
    /// There is no replica and none will come.
    NoReplicas,
}

impl Router {
    pub(crate) fn new(routes: &DeploymentRoutes) -> Self {
        let state = State {
            replicas: routes
                .replicas
                .iter()
                .map(|(name, handle)| Slot::new(name, handle))
                .collect(),
            max_ongoing: routes.max_ongoing_requests,
            max_queued: routes.max_queued_requests,
            awaits_replicas: routes.awaits_replicas,
            waiting: 0,
        };
        Router {
            app: routes.app.clone(),
            deployment: routes.deployment.clone(),
            class: routes.class.clone(),
            state: Mutex::new(state),
            freed: Notify::new(),
        }
    }

    /// The registered class of the deployment.
    pub(crate) fn class(&self) -> &str {
        &self.class
    }

    /// The application and deployment it routes for.
    pub(crate) fn names(&self) -> (&str, &str) {
        (&self.app, &self.deployment)
    }

    /// Requests waiting for a replica with room.
    pub(crate) fn waiting(&self) -> u32 {
        self.lock().waiting
    }

    /// Routes to the replicas of `routes` from now on, keeping the
    /// estimates of those it already knew.
    pub(crate) fn set_replicas(&self, routes: &DeploymentRoutes) {
        let mut state = self.lock();
        let mut old = std::mem::take(&mut state.replicas);
        state.replicas = routes
            .replicas
            .iter()
            .map(|(name, handle)| match old.iter().position(|slot| &slot.name == name) {
                Some(index) => old.swap_remove(index),
                None => Slot::new(name, handle),
            })
            .collect();
        state.max_ongoing = routes.max_ongoing_requests;
        state.max_queued = routes.max_queued_requests;
        state.awaits_replicas = routes.awaits_replicas;
        drop(state);
        self.freed.notify_waiters();
    }

    /// Sends one request body (with its HTTP head, from the proxy) to a
    /// replica and returns the response body.
    pub(crate) async fn call(self: &Arc<Self>, body: &[u8], head: Option<&HttpHead>) -> Result<(Vec<u8>, Encoding)> {
        self.route(|call| self.send(call, request(body, head))).await
    }

    /// Sends one request body to a replica that streams its answer; returns
    /// its content type and the chunks as they come, from the first one on.
    pub(crate) async fn call_stream(self: &Arc<Self>, body: &[u8], head: Option<&HttpHead>) -> Result<OpenedStream> {
        self.route(|call| self.open_stream(call, request(body, head))).await
    }

    /// Finds a replica with room for each attempt of `send` (which gives
    /// `None` when the replica rejected or never got the request), waiting
    /// in the bounded queue while every replica is full or there is none.
    async fn route<T, Attempt>(self: &Arc<Self>, send: impl Fn(InFlight) -> Attempt) -> Result<T>
    where
        Attempt: Future<Output = Result<Option<T>>>,
    {
        let mut queued: Option<Queued<'_>> = None;
        loop {
            match self.choose() {
                Choice::Replica(call) => match send(call).await? {
                    Some(answer) => return Ok(answer),
                    None => continue,
                },
                Choice::Wait if queued.is_none() => queued = Some(self.enqueue()?),
                Choice::Wait => {
                    let _ = tokio::time::timeout(RECHECK, self.freed.notified()).await;
                }
                Choice::NoReplicas => {
                    return Err(ServeError::NoReplicas {
                        deployment: self.deployment.clone(),
                    });
                }
            }
        }
    }

    /// Picks a replica by the power of two choices and counts the call.
    fn choose(self: &Arc<Self>) -> Choice {
        let mut state = self.lock();
        let count = state.replicas.len();
        if count == 0 {
            return match state.awaits_replicas {
                true => Choice::Wait,
                false => Choice::NoReplicas,
            };
        }
        let loads: Vec<&LoadEstimate> = state.replicas.iter().map(|slot| &slot.load).collect();
        let sampled = sample(&mut rand::rng(), count, count.min(2)).into_vec();
        let Some(index) = least_loaded(&loads, &sampled, Instant::now(), state.max_ongoing) else {
            return Choice::Wait;
        };
        let slot = &mut state.replicas[index];
        Choice::Replica(InFlight {
            router: self.clone(),
            name: slot.name.clone(),
            handle: slot.handle.clone(),
            number: slot.load.count_call(),
            counted: true,
        })
    }

    /// Takes a place in the bounded queue, or refuses with back-pressure.
    fn enqueue(&self) -> Result<Queued<'_>> {
        let mut state = self.lock();
        if state.waiting >= state.max_queued {
            return Err(ServeError::BackPressure {
                deployment: self.deployment.clone(),
            });
        }
        state.waiting += 1;
        Ok(Queued { router: self })
    }

    /// Makes the call; `None` when the replica rejected it or never got
    /// it.
    async fn send(&self, call: InFlight, request: ServeRequest) -> Result<Option<(Vec<u8>, Encoding)>> {
        match call.handle.handle(request).get_async().await {
            Ok(reply) => self.answer(call, reply),
            Err(error) => self.failed(&call.name, error),
        }
    }

    /// What the replica's `reply` to `call` gives: its body, `None` when
    /// it rejected the call, or the error it answered.
    fn answer(&self, mut call: InFlight, reply: ServeReply) -> Result<Option<(Vec<u8>, Encoding)>> {
        self.finish(&mut call, &reply);
        match reply.outcome {
            Outcome::Ok { body, encoding } => Ok(Some((body, encoding))),
            Outcome::Rejected => Ok(None),
            Outcome::BadRequest(message) => Err(ServeError::BadRequest {
                deployment: self.deployment.clone(),
                message,
            }),
            Outcome::UserError(message) => Err(self.user_error(&call.name, message)),
            Outcome::Status(error) => Err(self.status(error)),
        }
    }

    /// Ends the count of a call that got `reply`, and takes in the
    /// replica's reported load.
    fn finish(&self, call: &mut InFlight, reply: &ServeReply) {
        call.counted = false;
        let now = Instant::now();
        let mut state = self.lock();
        if let Some(load) = state.load_of(&call.name) {
            load.end_call();
            load.take_ongoing(reply.ongoing, now);
            load.take_fullness(reply.fullness, call.number, now);
            if matches!(reply.outcome, Outcome::Rejected) {
                load.rejected(now);
            }
        }
        drop(state);
        self.freed.notify_one();
    }

    /// Takes in the fullness a streamed call brought back.
    fn take_fullness(&self, call: &InFlight, fullness: Option<f64>) {
        if let Some(load) = self.lock().load_of(&call.name) {
            load.take_fullness(fullness, call.number, Instant::now());
        }
    }

    /// Opens a streamed call and waits for its content type and first
    /// chunk; `None` when the replica rejected it or never got it. The call
    /// counts as in flight until the returned stream ends or is dropped.
    async fn open_stream(&self, mut call: InFlight, request: ServeRequest) -> Result<Option<OpenedStream>> {
        let mut chunks = match call.handle.handle_stream(request) {
            Ok(chunks) => chunks,
            Err(error) => return self.failed(&call.name, error),
        };
        let (content_type, first) = match next_chunk(&mut chunks).await {
            Some(Ok(StreamChunk::Start { content_type, fullness })) => {
                self.take_fullness(&call, fullness);
                (content_type, next_chunk(&mut chunks).await)
            }
            other => (Encoding::Bytes.content_type().to_string(), other),
        };
        let first = match first {
            Some(Ok(chunk)) => chunk,
            Some(Err(error)) => return self.failed(&call.name, error),
            None => StreamChunk::Data(Vec::new()),
        };
        let bytes = match first {
            StreamChunk::Data(bytes) => Bytes::from(bytes),
            StreamChunk::End { fullness } => {
                self.take_fullness(&call, fullness);
                Bytes::new()
            }
            StreamChunk::Rejected => {
                // A rejecting replica is full, whatever else it reports.
                let rejected = ServeReply {
                    ongoing: u32::MAX,
                    fullness: None,
                    outcome: Outcome::Rejected,
                };
                self.finish(&mut call, &rejected);
                return Ok(None);
            }
            StreamChunk::BadRequest(message) => {
                return Err(ServeError::BadRequest {
                    deployment: self.deployment.clone(),
                    message,
                });
            }
            StreamChunk::UserError(message) => return Err(self.user_error(&call.name, message)),
            StreamChunk::Status(error) => return Err(self.status(error)),
            StreamChunk::Start { .. } => {
                return Err(ServeError::BadResponse {
                    deployment: self.deployment.clone(),
                    message: "a stream started twice".into(),
                });
            }
        };
        Ok(Some(OpenedStream {
            content_type,
            chunks: self.rest_of_stream(call, bytes, chunks),
        }))
    }

    /// The first chunk, then the others as they come; an error ends it.
    fn rest_of_stream(&self, call: InFlight, first: Bytes, chunks: ObjectRefStream<StreamChunk>) -> BodyStream {
        let deployment = self.deployment.clone();
        let rest = futures_util::stream::unfold(Some((chunks, call)), move |open| {
            let deployment = deployment.clone();
            async move {
                let (mut chunks, call) = open?;
                let item = match next_chunk(&mut chunks).await? {
                    Ok(StreamChunk::Data(bytes)) => return Some((Ok(Bytes::from(bytes)), Some((chunks, call)))),
                    Ok(StreamChunk::End { fullness }) => {
                        call.router.take_fullness(&call, fullness);
                        return None;
                    }
                    Ok(StreamChunk::UserError(message)) => call.router.user_error(&call.name, message),
                    Ok(StreamChunk::Status(error)) => call.router.status(error),
                    Ok(StreamChunk::Start { .. } | StreamChunk::Rejected | StreamChunk::BadRequest(_)) => {
                        ServeError::BadResponse {
                            deployment,
                            message: "a stream's later chunk was a start or a rejection".into(),
                        }
                    }
                    Err(error) => ServeError::ReplicaDied {
                        deployment,
                        replica: call.name.clone(),
                        message: error.to_string(),
                    },
                };
                Some((Err(item), None))
            }
        });
        Box::pin(futures_util::stream::once(async move { Ok(first) }).chain(rest))
    }

    fn status(&self, error: HttpError) -> ServeError {
        ServeError::Status {
            deployment: self.deployment.clone(),
            error,
        }
    }

    fn user_error(&self, replica: &str, message: String) -> ServeError {
        ServeError::User {
            deployment: self.deployment.clone(),
            replica: replica.to_string(),
            message,
        }
    }

    /// What a call that failed in the cluster gives: `None` (route again)
    /// when the replica is gone and never got it, an error otherwise. A
    /// replica that is gone is dropped.
    fn failed<T>(&self, replica: &str, error: raylet::Error) -> Result<Option<T>> {
        let raylet::Error::Task(task) = &error else {
            return Err(ServeError::Cluster(error));
        };
        if !replica_is_gone(task) {
            return Err(ServeError::Cluster(error));
        }
        tracing::warn!(deployment = %self.deployment, replica, "replica is gone: {}", task.message);
        self.lock().replicas.retain(|slot| slot.name != replica);
        self.freed.notify_waiters();
        if task.kind == TaskErrorKind::ActorDiedBeforeSend {
            return Ok(None);
        }
        crate::metrics::record_lost(&self.app, &self.deployment);
        Err(ServeError::ReplicaDied {
            deployment: self.deployment.clone(),
            replica: replica.to_string(),
            message: task.message.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a replica is sent: the body, with the HTTP head from the proxy.
fn request(body: &[u8], head: Option<&HttpHead>) -> ServeRequest {
    ServeRequest {
        body: body.to_vec(),
        head: head.cloned(),
    }
}

/// Whether a failed call means the replica's actor is gone for good.
fn replica_is_gone(error: &TaskError) -> bool {
    error.is_actor_death()
        || matches!(
            error.kind,
            TaskErrorKind::ActorCreationFailed | TaskErrorKind::WorkerCrashed | TaskErrorKind::OutOfMemory
        )
}

/// A call counted in its replica's load estimate, until it is finished or
/// dropped (a timed-out request, or a stream's end).
struct InFlight {
    router: Arc<Router>,
    name: String,
    handle: ReplicaHandle,
    /// Its number among the calls this router sent that replica.
    number: u64,
    counted: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut state = self.router.lock();
        if let Some(load) = state.load_of(&self.name) {
            load.end_call();
        }
        drop(state);
        self.router.freed.notify_one();
    }
}

/// A place in the router's bounded queue, given back when dropped.
struct Queued<'a> {
    router: &'a Router,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.router.lock();
        debug_assert!(state.waiting > 0, "queue places are given back once");
        state.waiting -= 1;
    }
}

/// The next chunk of a streamed call, fetched; `None` at its end.
async fn next_chunk(chunks: &mut ObjectRefStream<StreamChunk>) -> Option<raylet::Result<StreamChunk>> {
    match chunks.next_async().await? {
        Ok(chunk) => Some(chunk.get_async().await),
        Err(error) => Some(Err(error)),
    }
}
