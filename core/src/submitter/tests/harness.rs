//! The submitter on a virtual cluster (core/src/links/virtual_cluster.rs),
//! with the calls a driver makes of it: submit, cancel, reconstruct.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::{JobId, ObjectId, TaskId};
use tokio::sync::oneshot;

use crate::links::virtual_cluster::VirtualCluster;
use crate::submitter::pending_gate::PendingGate;
use crate::submitter::queued_task::{QueuedTask, TaskInputs};
use crate::submitter::task::TaskOptions;
use crate::submitter::{NotRebuilt, QueuedOptions, SchedulingClass, Submission, SubmitterEvent, TaskTemplate};

pub(super) struct SubmitterTest {
    cluster: VirtualCluster,
    gate: Arc<PendingGate>,
}

impl Deref for SubmitterTest {
    type Target = VirtualCluster;

    fn deref(&self) -> &VirtualCluster {
        &self.cluster
    }
}

impl DerefMut for SubmitterTest {
    fn deref_mut(&mut self) -> &mut VirtualCluster {
        &mut self.cluster
    }
}

impl SubmitterTest {
    pub(super) fn start() -> Self {
        SubmitterTest {
            cluster: VirtualCluster::start(),
            gate: PendingGate::new(1_000),
        }
    }

    /// Submits a task without arguments; returns the object of its result.
    pub(super) fn submit(&self, options: TaskOptions) -> ObjectId {
        self.submit_call(options).return_object()
    }

    /// Submits a task without arguments; its return objects (and a
    /// generator's stream) exist before it is sent.
    pub(super) fn submit_call(&self, options: TaskOptions) -> TaskId {
        let generator = options.generator;
        let template = template(options);
        let task_id = TaskId::random();
        for index in 0..u64::from(template.options.num_returns) {
            self.core.owner.store.add_pending(task_id.object_at(index));
        }
        if let Some(backpressure) = generator {
            self.core.owner.generators.open(task_id, backpressure);
        }
        let submission = Submission {
            task_id,
            template,
            args: Vec::new(),
            permit: self.gate.admit(),
        };
        self.core
            .submitter
            .handle_now(SubmitterEvent::Submit(Box::new(submission)))
            .expect("the submitter runs");
        task_id
    }

    pub(super) fn cancel(&self, object: ObjectId, force: bool) {
        self.send(SubmitterEvent::Cancel { object, force });
    }

    /// Asks the submitter to run the task that made `object` again.
    pub(super) async fn reconstruct(&mut self, object: ObjectId) -> Result<(), NotRebuilt> {
        let (done, answer) = oneshot::channel();
        self.send(SubmitterEvent::Reconstruct { object, done });
        self.settle().await;
        answer.await.expect("the submitter answers")
    }

    /// `object` was freed: its task need not be kept to make it again.
    pub(super) fn forget_lineage(&self, object: ObjectId) {
        self.send(SubmitterEvent::ForgetLineage(vec![object]));
    }

    /// How many tasks the process counts as pending.
    pub(super) fn pending(&self) -> usize {
        self.gate.pending()
    }
}

/// The ids of the lease requests among `requests`.
pub(super) fn lease_request_ids(requests: &[LeaseRequest]) -> Vec<u64> {
    requests
        .iter()
        .filter_map(|r| match r {
            LeaseRequest::Request(request) => Some(request.request_id),
            _ => None,
        })
        .collect()
}

/// The template of tasks with `options`.
fn template(options: TaskOptions) -> Arc<TaskTemplate> {
    let class = SchedulingClass {
        demand: options.demand().expect("valid resources"),
        scheduling: options.scheduling.to_scheduling().expect("valid scheduling"),
    };
    Arc::new(TaskTemplate {
        options: QueuedOptions::new(options),
        class,
        job: JobId::random(),
    })
}

/// A task with `options` and no arguments, as the submitter queues it, for
/// tests of its parts without a cluster.
pub(in crate::submitter) fn queued(options: TaskOptions) -> QueuedTask {
    let inputs = TaskInputs {
        args: Vec::new(),
        lent: Vec::new(),
        pinned: Vec::new(),
    };
    let permit = PendingGate::new(1).admit();
    QueuedTask::new(TaskId::random(), template(options), inputs, permit)
}
