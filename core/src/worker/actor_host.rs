//! The actor a worker hosts: its calls, from every caller's stream, wait in
//! one queue and start in arrival order, with at most `max_concurrency`
//! running at once (one at a time unless the actor asks for more). One at a
//! time, results go back together while more calls wait, and at once when
//! none do, as on a task stream.

use std::sync::{Arc, Mutex};

use raylet_proto::ActorId;
use raylet_proto::v1::{TaskResult, TaskSpec, WorkerEvents};
use tokio::sync::{Semaphore, mpsc};

use super::WorkerContext;
use super::executor;
use crate::actor::instance::ActorInstance;
use crate::task_error::{TaskError, TaskErrorKind};
use raylet_proto::task_stream::EventSender as ResultSender;

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
        // The calls of every caller; each caller has at most its pending-task
        // bound in flight (`Config::max_pending_tasks`), as in Ray, where
        // `max_pending_calls` bounds the caller, not the actor.
        let (calls, queued) = mpsc::unbounded_channel::<QueuedCall>();
        match max_concurrency {
            1 => tokio::spawn(run_one_at_a_time(context, queued)),
            _ => tokio::spawn(run_concurrently(context, queued, max_concurrency)),
        };
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

async fn run_one_at_a_time(context: Arc<WorkerContext>, mut queued: mpsc::UnboundedReceiver<QueuedCall>) {
    let mut finished = FinishedCalls::default();
    loop {
        let call = match queued.try_recv() {
            Ok(call) => call,
            Err(_) => {
                finished.send();
                match queued.recv().await {
                    Some(call) => call,
                    None => return,
                }
            }
        };
        let (result, results) = executor::run_call(context.clone(), call).await;
        finished.add(result, results);
    }
}

/// Runs up to `max_concurrency` calls at once. Results of calls that end
/// together go back together: each goes into an outbox, and the call that
/// ended sends what the outbox holds, at once when no other call runs, and
/// otherwise after letting the other ready tasks of this thread run.
async fn run_concurrently(
    context: Arc<WorkerContext>,
    mut queued: mpsc::UnboundedReceiver<QueuedCall>,
    max_concurrency: usize,
) {
    let slots = Arc::new(Semaphore::new(max_concurrency));
    let outbox = Arc::new(Mutex::new(FinishedCalls::default()));
    while let Some(call) = queued.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let running = executor::run_call(context.clone(), call);
        let (outbox, slots) = (outbox.clone(), slots.clone());
        tokio::spawn(async move {
            let (result, results) = running.await;
            drop(slot);
            lock(&outbox).add(result, results);
            if slots.available_permits() < max_concurrency {
                tokio::task::yield_now().await;
            }
            lock(&outbox).send();
        });
    }
}

fn lock(outbox: &Mutex<FinishedCalls>) -> std::sync::MutexGuard<'_, FinishedCalls> {
    outbox.lock().unwrap_or_else(|p| p.into_inner())
}

/// Results held back while more calls wait, by the stream they go to.
#[derive(Default)]
struct FinishedCalls {
    streams: Vec<(ResultSender, Vec<TaskResult>)>,
    count: usize,
}

impl FinishedCalls {
    fn add(&mut self, result: TaskResult, results: ResultSender) {
        match self.streams.iter_mut().find(|(stream, _)| stream.same_stream(&results)) {
            Some((_, held)) => held.push(result),
            None => self.streams.push((results, vec![result])),
        }
        self.count += 1;
        if self.count >= MAX_HELD_RESULTS {
            self.send();
        }
    }

    fn send(&mut self) {
        for (stream, results) in self.streams.drain(..) {
            let _ = stream.send(&WorkerEvents {
                results,
                ..WorkerEvents::default()
            });
            raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerWrote);
        }
        self.count = 0;
    }
}

/// Results held back at most while more calls wait.
const MAX_HELD_RESULTS: usize = 32;

/// The error of a call that reached a worker hosting no such actor.
pub(crate) fn not_hosted(spec: &TaskSpec) -> TaskError {
    let actor = ActorId::from_wire(&spec.actor_id).map_or_else(|_| "(a malformed id)".to_string(), |id| id.to_string());
    let message = format!("this worker hosts no actor {actor}");
    TaskError::new(TaskErrorKind::ActorDied, &spec.function, message)
}
