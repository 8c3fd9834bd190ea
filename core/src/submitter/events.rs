//! What the submitter reacts to, and the loop that takes one event at a
//! time: submissions and cancellations from the process, lease events from
//! node managers, results and ends of workers, node deaths from the head,
//! requests to make lost objects again. Idle leases are given back between
//! events.

use std::sync::Arc;

use raylet_proto::v1::{self, LeaseSessionEvent, WorkerExit};
use raylet_proto::{ObjectId, PlacementGroupId, TaskId, WorkerId};
use tokio::sync::oneshot;

use super::handle::{Handling, SubmitterInbox};
use super::queued_task::QueuedTask;
use super::{NotRebuilt, Submission, Submitter};
use crate::links::NodeDeath;
use crate::submitter::group_routes::GroupRoute;
use crate::value::Outcome;

/// What the submitter reacts to.
pub(crate) enum SubmitterEvent {
    /// A task to run.
    Submit(Box<Submission>),
    /// Cancel the task that returns `object`; `force` ends its worker.
    Cancel { object: ObjectId, force: bool },
    /// An event of lease session `session` with the node manager at `node`.
    Lease {
        node: Arc<str>,
        session: u64,
        event: LeaseSessionEvent,
    },
    /// Lease session `session` with the node manager at `node` ended.
    LeaseSessionClosed {
        node: Arc<str>,
        session: u64,
        reason: String,
    },
    /// Results from the worker of lease `lease`.
    Results {
        worker: WorkerId,
        lease: u64,
        finished: Vec<TaskFinished>,
        logs: Vec<v1::LogLine>,
    },
    /// The task stream to the worker of lease `lease` ended.
    WorkerStreamClosed { worker: WorkerId, lease: u64 },
    /// A leased worker exited, as its node manager says.
    WorkerDied { worker: WorkerId, exit: WorkerExit },
    /// The head counts a node incarnation dead.
    NodeDied(NodeDeath),
    /// Run the task that made a lost object again; says why it cannot be.
    Reconstruct {
        object: ObjectId,
        done: oneshot::Sender<Result<(), NotRebuilt>>,
    },
    /// These objects were freed: their tasks need not be kept to rebuild them.
    ForgetLineage(Vec<ObjectId>),
    /// A task whose worker the out-of-memory monitor ended, back after its backoff.
    Retry(Box<QueuedTask>),
    /// The head said where a placement group's bundles are.
    GroupLocated { group: PlacementGroupId, route: GroupRoute },
    /// Stop, dropping every session and lease, then answer.
    Shutdown(oneshot::Sender<()>),
}

/// Takes events until the process shuts the submitter down, giving back
/// idle leases between them.
pub(super) async fn run(inbox: SubmitterInbox) {
    let SubmitterInbox {
        mut received, state, ..
    } = inbox;
    loop {
        let Some(next_linger) = state.lock().as_mut().map(Submitter::arm_linger) else {
            return;
        };
        let event = tokio::select! {
            event = received.recv() => event,
            _ = state.rearm.notified() => continue,
            _ = tokio::time::sleep_until(next_linger) => {
                if let Some(submitter) = state.lock().as_mut() {
                    submitter.return_idle_leases();
                }
                continue;
            }
        };
        let mut slot = state.lock();
        match event {
            None => return,
            Some(SubmitterEvent::Shutdown(done)) => {
                slot.take();
                drop(slot);
                let _ = done.send(());
                return;
            }
            Some(event) => {
                if let Some(submitter) = slot.as_mut() {
                    let _handling = Handling::start();
                    submitter.handle(event);
                }
            }
        }
    }
}

impl Submitter {
    /// Reacts to one event; the loop handles `Shutdown`.
    pub(super) fn handle(&mut self, event: SubmitterEvent) {
        match event {
            SubmitterEvent::Submit(submission) => self.submit(*submission),
            SubmitterEvent::Cancel { object, force } => self.cancel(object, force),
            SubmitterEvent::Lease { node, session, event } => {
                if self.is_current(&node, session) {
                    self.on_lease_event(node, event);
                }
            }
            SubmitterEvent::LeaseSessionClosed { node, session, reason } => {
                if self.is_current(&node, session) {
                    self.close_session(node, reason);
                }
            }
            SubmitterEvent::Results {
                worker,
                lease,
                finished,
                logs,
            } => self.on_results(worker, lease, finished, logs),
            SubmitterEvent::WorkerStreamClosed { worker, lease } => self.on_stream_closed(worker, lease),
            SubmitterEvent::WorkerDied { worker, exit } => self.on_worker_died(worker, &exit),
            SubmitterEvent::NodeDied(death) => self.on_node_died(death),
            SubmitterEvent::Reconstruct { object, done } => {
                let _ = done.send(self.reconstruct(object));
            }
            SubmitterEvent::ForgetLineage(objects) => {
                for object in objects {
                    self.lineage.forget(object);
                }
            }
            SubmitterEvent::Retry(task) => self.on_backoff_over(*task),
            SubmitterEvent::GroupLocated { group, route } => self.on_group_located(group, route),
            SubmitterEvent::Shutdown(_) => unreachable!("handled in run"),
        }
    }
}

/// A task's outcome as its worker reported it.
pub(crate) struct TaskFinished {
    pub(crate) task_id: TaskId,
    pub(crate) outcome: Outcome,
    pub(super) run_micros: u64,
}
