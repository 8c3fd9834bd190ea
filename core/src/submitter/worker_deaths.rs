//! Leased workers that died: a task stream that ends marks its worker
//! dying and asks its node manager how it exited; then its lease goes back
//! as failed and the tasks it ran run again or fail, as `retries.rs`
//! decides. A node incarnation the head counts dead takes its leased
//! workers with it, and the lease session with it closes unless a newer
//! incarnation granted through it.

use std::sync::Arc;

use raylet_proto::WorkerId;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{ReturnLease, WorkerExit};

use super::events::SubmitterEvent;
use super::queued_task::QueuedTask;
use super::retries::{AfterFailure, after_worker_exit, record_failure};
use super::worker_stream::{unknown_exit, worker_exit};
use super::{LeasedWorker, Submitter};
use crate::links::NodeDeath;
use crate::task_error::{TaskError, TaskErrorKind};

impl Submitter {
    /// The task stream of lease `lease` of a worker ended: the worker is
    /// taken to be dying until its node manager says how it exited.
    pub(super) fn on_stream_closed(&mut self, worker_id: WorkerId, lease: u64) {
        let Some(worker) = self.workers.get_mut(&worker_id).filter(|w| w.lease == lease) else {
            return;
        };
        worker.dying = true;
        let node = worker.node.clone();
        let owner = self.owner.clone();
        let events = self.handle.events.clone();
        tokio::spawn(async move {
            let exit = worker_exit(&owner, node, worker_id).await;
            let _ = events.send(SubmitterEvent::WorkerDied {
                worker: worker_id,
                exit,
            });
        });
    }

    /// A leased worker exited as `exit` says.
    pub(super) fn on_worker_died(&mut self, worker_id: WorkerId, exit: &WorkerExit) {
        let Some(worker) = self.forget_worker(worker_id) else {
            return;
        };
        self.session(&worker.node)
            .send_request(LeaseRequest::ReturnLease(ReturnLease {
                worker_id: worker_id.as_bytes().to_vec(),
                worker_failed: true,
            }));
        self.rerun_or_fail(worker, exit);
    }

    /// Runs again, or fails, what the workers leased on a dead node
    /// incarnation ran; results they send late are ignored, as they are no
    /// longer leased. A session with that node closes unless a newer
    /// incarnation granted through it.
    pub(super) fn on_node_died(&mut self, death: NodeDeath) {
        let lost: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.node_id == Some(death.node_id) && w.incarnation == death.incarnation)
            .map(|(id, _)| *id)
            .collect();
        let exit = unknown_exit(format!("was lost with its node ({})", death.reason));
        for worker_id in lost {
            if let Some(worker) = self.forget_worker(worker_id) {
                tracing::warn!(node = %death.node_id, pid = worker.pid, "a leased worker's node died");
                self.rerun_or_fail(worker, &exit);
            }
        }
        let address: Arc<str> = death.address.into();
        let with_dead = self.sessions.get(&address).is_some_and(|session| {
            session
                .granted_by
                .is_none_or(|granted_by| granted_by == (death.node_id, death.incarnation))
        });
        if with_dead {
            self.close_session(address, format!("its node died: {}", death.reason));
        }
    }

    /// Drops a leased worker from the submitter's state.
    pub(super) fn forget_worker(&mut self, worker_id: WorkerId) -> Option<LeasedWorker> {
        let worker = self.workers.remove(&worker_id)?;
        if let Some(shape) = self.shapes.get_mut(&worker.shape) {
            shape.workers.retain(|id| *id != worker_id);
        }
        Some(worker)
    }

    /// Queues the tasks a dead worker was running again, those that may run
    /// again, and fails the others; a cancelled one is dropped.
    fn rerun_or_fail(&mut self, mut worker: LeasedWorker, exit: &WorkerExit) {
        let description = exit.description.as_str();
        for task in std::mem::take(&mut worker.in_flight).into_values() {
            record_failure(&self.owner, &task, &format!("the worker process {description}"));
            if self.cancelled.remove(&task.return_id()) {
                continue;
            }
            let verdict = after_worker_exit(&task, exit);
            if let AfterFailure::RunAgain { .. } = verdict {
                tracing::warn!(
                    function = task.options().function,
                    pid = worker.pid,
                    description,
                    "worker died; retrying its task"
                );
            }
            match verdict {
                AfterFailure::RunAgain { after: None } => self.requeue(task),
                AfterFailure::RunAgain { after: Some(delay) } => self.requeue_after(task, delay),
                AfterFailure::Fail(kind) => {
                    let error = worker_death_error(&task, kind, &worker, description);
                    self.fail_task(&task, error);
                }
            }
        }
        self.dispatch(&worker.shape);
    }
}

/// The error of a task whose worker died under it on its last attempt.
fn worker_death_error(task: &QueuedTask, kind: TaskErrorKind, worker: &LeasedWorker, description: &str) -> TaskError {
    let attempts = task.attempt + 1;
    let mut error = TaskError::new(
        kind,
        &task.options().shown_name(),
        format!("the worker process {description} while running the task (ran {attempts} time(s))"),
    );
    error.node_id = worker.node_id;
    error.pid = worker.pid;
    error.attempt = task.attempt;
    error
}
