//! The task stream to a leased worker: tasks go out in frames written by
//! the thread that sends them (those sent before it connects merged into
//! one), results come back and are stored at once so that a waiting `get`
//! wakes without a detour through the submitter, which takes them on the
//! same thread. When the stream ends, the worker's node manager is asked
//! how it exited.

use std::sync::{Arc, Mutex, MutexGuard};

use raylet_proto::v1::{self, TaskBatch, WorkerExit, WorkerExitKind};
use raylet_proto::{NodeId, ObjectId, TaskId, WorkerId};

use super::events::{SubmitterEvent, TaskFinished};
use super::handle::SubmitterHandle;
use crate::links::{EventHandler, TaskOutlet};
use crate::objects::owner::Owner;
use crate::observability::task_events::Ending;
use crate::value::Outcome;

/// Where a leased worker's frames go: held back, merged, while its stream
/// opens, then written at once by the thread that sends them.
#[derive(Clone)]
pub(super) struct WorkerOutbox(Arc<Mutex<Outbox>>);

enum Outbox {
    /// The stream is opening; what was sent meanwhile, in order.
    Opening(TaskBatch),
    Open(Box<dyn TaskOutlet>),
    /// The stream failed or never opened.
    Closed,
}

impl WorkerOutbox {
    fn lock(&self) -> MutexGuard<'_, Outbox> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `batch` in order after those sent before; a stream that failed
    /// takes nothing, and its reader tells the submitter that it ended.
    pub(super) fn send(&self, batch: TaskBatch) {
        let mut outbox = self.lock();
        match &mut *outbox {
            Outbox::Opening(waiting) => {
                waiting.tasks.extend(batch.tasks);
                waiting.cancel.extend(batch.cancel);
            }
            Outbox::Open(outlet) => {
                if outlet.send(&batch).is_err() {
                    *outbox = Outbox::Closed;
                    return;
                }
                raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerWrote);
            }
            Outbox::Closed => {}
        }
    }

    /// The stream opened: what waited goes out first.
    fn opened(&self, outlet: Box<dyn TaskOutlet>) {
        let mut outbox = self.lock();
        let Outbox::Opening(waiting) = std::mem::replace(&mut *outbox, Outbox::Closed) else {
            return;
        };
        let nothing_waited = waiting.tasks.is_empty() && waiting.cancel.is_empty();
        if nothing_waited || outlet.send(&waiting).is_ok() {
            *outbox = Outbox::Open(outlet);
        }
    }
}

/// Opens the task stream to a leased worker, on a connection of its own: a
/// port may have served an earlier worker, so cached connections are not
/// reused. Tasks sent before it connects wait in the outbox, and go in
/// order, merged into one frame.
pub(super) fn connect_worker(
    owner: Arc<Owner>,
    submitter: SubmitterHandle,
    (worker, lease): (WorkerId, u64),
    address: String,
) -> WorkerOutbox {
    let outbox = WorkerOutbox(Arc::new(Mutex::new(Outbox::Opening(TaskBatch::default()))));
    let opening = owner.ctx.links.workers.task_stream(
        address,
        results_handler(owner.clone(), submitter.clone(), (worker, lease)),
    );
    let opened = outbox.clone();
    tokio::spawn(async move {
        match opening.await {
            Ok(outlet) => opened.opened(outlet),
            Err(error) => {
                tracing::debug!(%worker, %error, "worker stream did not open");
                *opened.lock() = Outbox::Closed;
                let _ = submitter.send(SubmitterEvent::WorkerStreamClosed { worker, lease });
            }
        }
    });
    outbox
}

/// Stores each result as it arrives and has the submitter take it at once
/// on the reading thread; tells it too when the stream ends.
fn results_handler(owner: Arc<Owner>, submitter: SubmitterHandle, (worker, lease): (WorkerId, u64)) -> EventHandler {
    Box::new(move |batch| match batch {
        Ok(Some(batch)) => {
            raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerRead);
            owner.absorb_items(batch.items);
            let finished = complete_values(&owner, batch.results);
            raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerStored);
            let _ = submitter.handle_now(SubmitterEvent::Results {
                worker,
                lease,
                finished,
                logs: batch.logs,
            });
        }
        ended => {
            if let Err(error) = ended {
                tracing::debug!(%worker, %error, "worker stream ended");
            }
            let _ = submitter.handle_now(SubmitterEvent::WorkerStreamClosed { worker, lease });
        }
    })
}

/// Decodes results, reports how each attempt ended, and stores values (all
/// of a task's returns) at once so that a waiting `get` wakes without a
/// detour through the submitter; failures, which may be retried, are left
/// to the submitter.
pub(crate) fn complete_values(owner: &Owner, results: Vec<v1::TaskResult>) -> Vec<TaskFinished> {
    let finished: Vec<TaskFinished> = results
        .into_iter()
        .filter_map(|result| {
            let task_id = TaskId::from_wire(&result.task_id).ok()?;
            let outcome = owner.adopt_outcome(result.outcome.unwrap_or_default());
            if outcome.is_ok() && !result.more_returns.is_empty() {
                let more = result.more_returns.into_iter().map(|more| owner.adopt_outcome(more));
                let more: Vec<(ObjectId, Outcome)> = (1..).map(|index| task_id.object_at(index)).zip(more).collect();
                owner.store.complete_many(more);
            }
            let error = outcome.as_ref().err().map(ToString::to_string);
            let ending = Ending {
                failed: error.as_deref(),
                start_unix_micros: result.start_unix_micros,
                run_micros: result.run_micros,
            };
            owner.task_events.ended(task_id, result.attempt, ending);
            owner.task_events.spans(result.spans);
            crate::observability::metrics::absorb(result.metrics);
            Some(TaskFinished {
                task_id,
                outcome,
                run_micros: result.run_micros,
            })
        })
        .collect();
    let values = finished
        .iter()
        .filter_map(|f| Some((f.task_id.return_object(), Ok(f.outcome.as_ref().ok()?.clone()))));
    owner.store.complete_many(values);
    finished
}

/// How a worker exited, as its node manager saw it.
pub(super) async fn worker_exit(owner: &Owner, node: Arc<str>, worker: WorkerId) -> WorkerExit {
    match owner.ctx.links.nodes.worker_exit(node, worker).await {
        Ok(exit) if exit.exited => exit,
        Ok(_) => unknown_exit("stopped answering".into()),
        Err(error) => unknown_exit(format!("was lost with its node ({error})")),
    }
}

/// An end of a worker that its node manager cannot tell.
pub(super) fn unknown_exit(description: String) -> WorkerExit {
    WorkerExit {
        exited: true,
        description,
        kind: WorkerExitKind::Unspecified.into(),
    }
}

/// Prints a worker's output lines, each prefixed with the function that
/// printed it, the worker's pid and its node.
pub(crate) fn print_log_lines(pid: u32, node_id: Option<NodeId>, logs: &[v1::LogLine]) {
    let node = node_id.map(|id| id.short()).unwrap_or_default();
    for log in logs {
        let function = log.function.rsplit("::").next().unwrap_or(&log.function);
        let line = format!("({function} pid={pid} node={node}) {}", log.line);
        if log.stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}
