//! The worker's task service: owners push tasks over task streams. Each task's
//! arguments are resolved, then the task runs right here on the main
//! thread, and its result goes back on the same stream. Calls of the actor
//! this worker hosts go to the actor's queue instead, which answers on the
//! caller's stream.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::TaskId;
use raylet_proto::local_socket;
use raylet_proto::task_stream::{self, StreamSocket, TaskReader};
use raylet_proto::v1::{TaskSpec, WorkerEvents};
use tokio::sync::mpsc;

use super::WorkerContext;
use super::actor_host::not_hosted;
use super::args::resolve_args;
use super::executor;

/// Where owners open task streams: a TCP port, and beside it, for owners
/// on this machine, a Unix socket named after it (none with TLS, or where
/// the machine's socket folder is unsound).
pub(super) struct TaskListeners {
    tcp: std::net::TcpListener,
    unix: Option<std::os::unix::net::UnixListener>,
}

impl TaskListeners {
    pub(super) fn bind(ip: IpAddr) -> crate::Result<Self> {
        let tcp = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
        tcp.set_nonblocking(true)?;
        let unix = local_socket::bind(tcp.local_addr()?, "task streams");
        Ok(TaskListeners { tcp, unix })
    }

    /// The TCP address owners are told.
    pub(super) fn address(&self) -> crate::Result<SocketAddr> {
        Ok(self.tcp.local_addr()?)
    }
}

/// Serves the task streams that owners open on `listeners`, each on a task
/// of its own.
pub(super) async fn serve(
    context: Arc<WorkerContext>,
    token: AuthToken,
    listeners: TaskListeners,
) -> crate::Result<()> {
    let tcp = tokio::net::TcpListener::from_std(listeners.tcp)?;
    let unix = listeners.unix.map(tokio::net::UnixListener::from_std).transpose()?;
    loop {
        let accepted = tokio::select! {
            accepted = tcp.accept() => accepted.map(|(socket, _)| StreamSocket::Tcp(socket)),
            accepted = accept_local(unix.as_ref()) => accepted.map(StreamSocket::Unix),
        };
        let socket = match accepted {
            Ok(socket) => socket,
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

/// The next connection on the Unix socket; never, without one.
async fn accept_local(listener: Option<&tokio::net::UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(socket, _)| socket),
        None => std::future::pending().await,
    }
}

/// Runs the stream's tasks in order, while a task of its own reads the
/// stream: cancellations and a generator's acknowledgements take effect
/// while a task runs. The reader hands over a task only as it yields, once
/// it has taken every batch that had arrived, so that cancellations sent
/// after a task was pushed are seen before it starts.
///
/// Results go back together while more tasks wait here, and at once when
/// none do, so a lone task is answered without delay.
async fn run_stream(context: Arc<WorkerContext>, inbound: TaskReader, results: executor::ResultSender) {
    // Bounded by the owner: it pushes at most a pipeline's depth of tasks ahead.
    let (queued, mut queue) = mpsc::unbounded_channel();
    let reader = tokio::spawn(read_batches(context.clone(), inbound, queued, results.clone()));
    let mut finished = Vec::new();
    while let Some(spec) = queue.recv().await {
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerDequeued);
        let args = resolve_args(&context, &spec).await;
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerArgsReady);
        finished.push(executor::run_task(&context, spec, args, &results).await);
        if finished.len() >= MAX_RESULTS_PER_MESSAGE || queue.is_empty() {
            let events = WorkerEvents {
                results: std::mem::take(&mut finished),
                ..WorkerEvents::default()
            };
            if results.send(&events).is_err() {
                break;
            }
            raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerWrote);
        }
    }
    reader.abort();
}

/// Takes the stream's batches as they come: cancellations and
/// acknowledgements at once, calls of the hosted actor into its queue, and
/// other tasks into the stream's, until the stream ends.
async fn read_batches(
    context: Arc<WorkerContext>,
    mut inbound: TaskReader,
    queued: mpsc::UnboundedSender<TaskSpec>,
    results: executor::ResultSender,
) {
    while let Ok(Some(batch)) = inbound.message().await {
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerRead);
        for cancel in batch.cancel {
            if let Ok(task_id) = TaskId::from_wire(&cancel.task_id) {
                context.cancel(task_id);
            }
        }
        for ack in batch.acks {
            if let Ok(task_id) = TaskId::from_wire(&ack.task_id) {
                context.generators.ack(task_id, ack.consumed);
            }
        }
        for spec in batch.tasks {
            if !is_actor_call(&spec) {
                if queued.send(spec).is_err() {
                    return;
                }
                continue;
            }
            match context.actor.get() {
                Some(host) => host.enqueue(spec, results.clone()),
                None => {
                    let events = WorkerEvents {
                        results: vec![executor::failed(&spec, not_hosted(&spec))],
                        ..WorkerEvents::default()
                    };
                    let _ = results.send(&events);
                }
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
