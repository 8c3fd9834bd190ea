//! Cancelling a task by one of its objects. A queued task leaves its queue
//! and fails as cancelled without running (and the lease requests its class
//! no longer needs are cancelled). A running one's worker is told to stop
//! it, and with `force` the worker is ended too; its objects fail as
//! cancelled at once, and whatever its worker sends or does later is
//! ignored. A task not queued yet (its arguments pending, or its retry
//! waiting out a backoff) is marked, and dropped when it comes.

use raylet_proto::ObjectId;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::{CancelTask, ReturnLease, TaskBatch};

use super::Submitter;
use super::retries::record_failure;
use crate::task_error::{TaskError, TaskErrorKind};

/// The error of a cancelled task's objects.
fn cancelled(object: ObjectId) -> TaskError {
    TaskError::new(TaskErrorKind::Cancelled, "", format!("object {object} was cancelled"))
}

impl Submitter {
    pub(super) fn cancel(&mut self, object: ObjectId, force: bool) {
        if self.cancel_queued(object) || self.cancel_running(object, force) {
            return;
        }
        if matches!(self.owner.store.try_get(object), Ok(None)) {
            self.cancelled.insert(object);
            self.owner.store.complete(object, Err(cancelled(object)));
        }
    }

    /// Fails the queued task that returns `object`, if one does.
    fn cancel_queued(&mut self, object: ObjectId) -> bool {
        let found = self.shapes.iter_mut().find_map(|(class, shape)| {
            let index = shape.queue.iter().position(|t| t.returns(object))?;
            Some((class.clone(), shape.queue.remove(index)?))
        });
        let Some((class, task)) = found else {
            return false;
        };
        record_failure(&self.owner, &task, "cancelled");
        let error = TaskError {
            function: task.options().shown_name(),
            ..cancelled(object)
        };
        self.fail_task(&task, error);
        self.dispatch(&class);
        true
    }

    /// Stops the running task that returns `object`, if one does.
    fn cancel_running(&mut self, object: ObjectId, force: bool) -> bool {
        let pushed = self.workers.iter().find_map(|(id, w)| {
            let task = w.in_flight.values().find(|t| t.returns(object))?;
            Some((*id, w.node.clone(), w.tasks.clone(), task.task_id, task.return_ids()))
        });
        let Some((worker_id, node, tasks, task_id, returns)) = pushed else {
            return false;
        };
        tasks.send(TaskBatch {
            cancel: vec![CancelTask {
                task_id: task_id.as_bytes().to_vec(),
            }],
            ..TaskBatch::default()
        });
        if force {
            let kill = ReturnLease {
                worker_id: worker_id.as_bytes().to_vec(),
                worker_failed: true,
            };
            self.session(&node).send_request(LeaseRequest::ReturnLease(kill));
        }
        if matches!(self.owner.store.try_get(task_id.return_object()), Ok(None)) {
            self.cancelled.insert(task_id.return_object());
            self.owner.fail_all(returns, cancelled(object));
        }
        true
    }
}
