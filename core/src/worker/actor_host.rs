//! The actor a worker hosts: its calls, from every caller's stream, wait in
//! one queue and start in arrival order, with at most `max_concurrency`
//! running at once (one at a time unless the actor asks for more).

use std::sync::Arc;

use raylet_proto::ActorId;
use raylet_proto::v1::TaskSpec;
use tokio::sync::{Semaphore, mpsc};

use super::WorkerContext;
use super::executor::{self, ResultSender};
use crate::actor::instance::ActorInstance;
use crate::task::{TaskError, TaskErrorKind};

/// A call waiting in the actor's queue, and the stream its result goes to.
pub(crate) struct QueuedCall {
    pub(crate) spec: TaskSpec,
    pub(crate) results: ResultSender,
}

/// The actor this worker hosts and the queue of its calls.
pub(crate) struct ActorHost {
    pub(crate) id: ActorId,
    pub(crate) instance: Arc<dyn ActorInstance>,
    pub(crate) max_concurrency: usize,
    calls: mpsc::UnboundedSender<QueuedCall>,
}

impl ActorHost {
    /// Hosts `instance`; each queued call runs with [`executor::run_call`].
    pub(crate) fn start(
        context: Arc<WorkerContext>,
        id: ActorId,
        instance: Arc<dyn ActorInstance>,
        max_concurrency: usize,
    ) -> Self {
        let (calls, mut queued) = mpsc::unbounded_channel::<QueuedCall>();
        let slots = Arc::new(Semaphore::new(max_concurrency));
        tokio::spawn(async move {
            while let Some(call) = queued.recv().await {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let running = executor::run_call(context.clone(), call);
                if max_concurrency == 1 {
                    running.await;
                    drop(slot);
                    continue;
                }
                tokio::spawn(async move {
                    running.await;
                    drop(slot);
                });
            }
        });
        ActorHost {
            id,
            instance,
            max_concurrency,
            calls,
        }
    }

    /// Queues a call of one of the actor's methods.
    pub(crate) fn enqueue(&self, spec: TaskSpec, results: ResultSender) {
        let _ = self.calls.send(QueuedCall { spec, results });
    }
}

/// The error of a call that reached a worker hosting no such actor.
pub(crate) fn not_hosted(spec: &TaskSpec) -> TaskError {
    let actor = ActorId::from_wire(&spec.actor_id).map_or_else(|_| "(a malformed id)".to_string(), |id| id.to_string());
    let message = format!("this worker hosts no actor {actor}");
    TaskError::new(TaskErrorKind::ActorDied, &spec.function, message)
}
