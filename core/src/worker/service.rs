//! The worker's task service: owners push tasks over task streams. Each task's
//! arguments are resolved, then the task runs right here on the main
//! thread, and its result goes back on the same stream. Calls of the actor
//! this worker hosts go to the actor's queue instead, which answers on the
//! caller's stream.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use raylet_proto::auth::AuthToken;
use raylet_proto::task_stream::{self, TaskReader};
use raylet_proto::v1::{self, TaskBatch, TaskSpec, WorkerEvents, task_arg};
use raylet_proto::{ObjectId, TaskId};

use super::WorkerContext;
use super::actor_host::not_hosted;
use super::executor;
use crate::object_ref::{AnyObjectRef, RawRef};
use crate::task::{TaskError, TaskErrorKind};
use crate::value::{Body, Format, StoredAt};

/// Serves the task streams that owners open on `listener`, each on a task
/// of its own.
pub(super) async fn serve(
    context: Arc<WorkerContext>,
    token: AuthToken,
    listener: std::net::TcpListener,
) -> crate::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a task stream");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (context, token) = (context.clone(), token.clone());
        tokio::spawn(async move {
            match task_stream::accept(socket, &token).await {
                Ok((tasks, results)) => run_stream(context, tasks, results).await,
                Err(error) => tracing::debug!(%error, "a task stream was refused"),
            }
        });
    }
}

/// Runs the stream's tasks in order. Before each task, every batch that has
/// already arrived is read, so that cancellations sent after a task was
/// pushed are seen before it starts.
///
/// Results go back together while more tasks wait here, and at once when
/// none do, so a lone task is answered without delay.
async fn run_stream(context: Arc<WorkerContext>, mut inbound: TaskReader, results: executor::ResultSender) {
    let mut queue = std::collections::VecDeque::new();
    let mut finished = Vec::new();
    loop {
        if queue.is_empty() {
            match inbound.message().await {
                Ok(Some(batch)) => absorb(&context, batch, &mut queue),
                _ => return,
            }
        }
        while let Some(batch) = next_if_ready(&mut inbound).await {
            absorb(&context, batch, &mut queue);
        }
        if let Some(spec) = queue.pop_front() {
            match is_actor_call(&spec) {
                true => match context.actor.get() {
                    Some(host) => host.enqueue(spec, results.clone()),
                    None => finished.push(executor::failed(&spec, not_hosted(&spec))),
                },
                false => {
                    let args = resolve_args(&context, &spec).await;
                    finished.push(executor::run_task(&context, spec, args, &results).await);
                }
            }
        }
        if !finished.is_empty() && (queue.is_empty() || finished.len() >= MAX_RESULTS_PER_MESSAGE) {
            let events = WorkerEvents {
                results: std::mem::take(&mut finished),
                logs: Vec::new(),
            };
            if results.send(&events).is_err() {
                return;
            }
        }
    }
}

/// Results held back at most while more tasks wait.
const MAX_RESULTS_PER_MESSAGE: usize = 32;

/// A call of an actor's method, as opposed to a task or an actor's constructor.
fn is_actor_call(spec: &TaskSpec) -> bool {
    !spec.actor_id.is_empty() && spec.actor_creation.is_none()
}

fn absorb(context: &WorkerContext, batch: TaskBatch, queue: &mut std::collections::VecDeque<TaskSpec>) {
    for cancel in batch.cancel {
        if let Ok(task_id) = TaskId::from_wire(&cancel.task_id) {
            context.cancel(task_id);
        }
    }
    queue.extend(batch.tasks);
}

/// The next batch if one has arrived already; `None` otherwise, or when the
/// stream has ended (the next blocking read will see that).
async fn next_if_ready(inbound: &mut TaskReader) -> Option<TaskBatch> {
    let mut next = std::pin::pin!(inbound.message());
    let polled = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
    match polled {
        Poll::Ready(Ok(Some(batch))) => Some(batch),
        _ => None,
    }
}

/// Inline values as they are; stored objects mapped from this node's store;
/// references fetched from their owners on the cluster thread, whose
/// connections stay alive while a task runs here.
pub(super) async fn resolve_args(context: &Arc<WorkerContext>, spec: &TaskSpec) -> Result<Vec<Bytes>, TaskError> {
    let mut args = Vec::with_capacity(spec.args.len());
    for (index, arg) in spec.args.iter().enumerate() {
        let resolved = match &arg.kind {
            Some(task_arg::Kind::Value(bytes)) => Ok(bytes.clone()),
            Some(task_arg::Kind::Stored(stored)) => map_stored(context, spec, stored).await,
            Some(task_arg::Kind::ObjectRef(object)) => fetch(context, object).await,
            None => Err(ArgError::Other("the argument is empty".into())),
        };
        match resolved {
            Ok(bytes) => args.push(bytes),
            Err(ArgError::Upstream(error)) => return Err(error),
            Err(ArgError::Other(message)) => return Err(argument_error(spec, index, message)),
        }
    }
    Ok(args)
}

/// Why an argument has no bytes: the task that makes it failed, or
/// something else went wrong.
enum ArgError {
    Upstream(TaskError),
    Other(String),
}

impl<E: std::fmt::Display> From<E> for ArgError {
    fn from(error: E) -> Self {
        ArgError::Other(error.to_string())
    }
}

async fn map_stored(context: &Arc<WorkerContext>, spec: &TaskSpec, stored: &v1::StoredArg) -> Result<Bytes, ArgError> {
    let object = RawRef {
        id: ObjectId::from_wire(&stored.object_id)?,
        owner: spec.owner_address.as_str().into(),
    };
    let at = StoredAt::from_proto(stored.location.clone().unwrap_or_default());
    map_object(context, object, at).await
}

/// A stored object's bytes, straight from this node's shared memory.
async fn map_object(context: &Arc<WorkerContext>, object: RawRef, at: StoredAt) -> Result<Bytes, ArgError> {
    let core = context.core.clone();
    let mapped = context
        .core
        .runtime
        .spawn(async move { core.map_object(&object, &at).await })
        .await??;
    Ok(Bytes::from_owner(mapped))
}

async fn fetch(context: &Arc<WorkerContext>, object: &v1::ObjectRefProto) -> Result<Bytes, ArgError> {
    let raw = RawRef::from_proto(object)?;
    let object = AnyObjectRef::unheld(raw.clone());
    let id = raw.id;
    let core = context.core.clone();
    let fetched = context
        .core
        .runtime
        .spawn(async move { core.wait_outcome(&object, None).await })
        .await??;
    let value = fetched
        .ok_or("waiting without a deadline ended")?
        .map_err(ArgError::Upstream)?;
    if value.format != Format::Postcard {
        return Err(ArgError::Other(format!(
            "object {id} was stored as an rkyv archive; pass its ObjectRef and call get_archived() in the task"
        )));
    }
    match value.body {
        Body::Inline(data) => Ok(data),
        Body::Stored(at) => map_object(context, raw, at).await,
    }
}

fn argument_error(spec: &TaskSpec, index: usize, error: impl std::fmt::Display) -> TaskError {
    TaskError::new(
        TaskErrorKind::Argument,
        &spec.function,
        format!("argument {index}: {error}"),
    )
}
