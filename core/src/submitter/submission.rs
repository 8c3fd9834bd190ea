//! A submitted task made ready to queue: its arguments resolved (values
//! inline, owned objects inlined or located, borrowed ones passed as
//! references), a task whose owned arguments are pending put back until
//! they are done, and one whose argument failed failed with it.

use raylet_proto::ObjectId;
use raylet_proto::v1::{self, TaskArg, TaskKind, task_arg};

use super::events::SubmitterEvent;
use super::queued_task::{QueuedTask, TaskInputs};
use super::{Submission, Submitter};
use crate::objects::lent_objects::lend_contained;
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::objects::owner::Owner;
use crate::observability::task_events::{Ending, TaskIdentity};
use crate::submitter::task::Arg;
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{Body, EncodedValue};

/// A submission's arguments as far as they resolve: those ready, the owned
/// objects still pending, and the error of the first that failed.
struct ResolvedArgs {
    args: Vec<TaskArg>,
    waiting: Vec<ObjectId>,
    failed: Option<TaskError>,
}

impl Submitter {
    pub(super) fn submit(&mut self, submission: Submission) {
        if self.cancelled.remove(&submission.task_id.return_object()) {
            return;
        }
        let resolved = resolve_args(&self.owner, &submission.args);
        let identity = TaskIdentity {
            task_id: submission.task_id,
            attempt: 0,
            function: submission.template.options.function,
            kind: TaskKind::NormalTask,
            actor_id: None,
        };
        self.owner.task_events.submitted(identity, !resolved.waiting.is_empty());
        if let Some(error) = resolved.failed {
            return self.fail_submission(&submission, error);
        }
        if !resolved.waiting.is_empty() {
            return self.resubmit_when_ready(submission, resolved.waiting);
        }
        self.queue(submission, resolved.args);
    }

    /// Fails the objects of a task one of whose arguments failed.
    fn fail_submission(&self, submission: &Submission, error: TaskError) {
        let reason = error.to_string();
        self.owner
            .task_events
            .ended(submission.task_id, 0, Ending::failed(&reason));
        let returns = u64::from(submission.template.options.num_returns);
        let task_id = submission.task_id;
        self.owner
            .fail_all((0..returns).map(|index| task_id.object_at(index)), error);
    }

    /// Queues a task whose arguments are all resolved, last of its class.
    fn queue(&mut self, submission: Submission, args: Vec<TaskArg>) {
        let inputs = TaskInputs {
            lent: lend_contained(&self.owner, &submission.args),
            pinned: pinned_by(submission.args),
            args,
        };
        let template = submission.template.clone();
        let task = QueuedTask::new(submission.task_id, submission.template, inputs, submission.permit);
        self.shape_mut(&template.class).queue.push_back(task);
        self.dispatch(&template.class);
    }

    fn resubmit_when_ready(&self, submission: Submission, waiting: Vec<ObjectId>) {
        let store = self.owner.store.clone();
        let events = self.handle.events.clone();
        tokio::spawn(async move {
            for id in waiting {
                let _ = store.wait(id, None).await;
            }
            let _ = events.send(SubmitterEvent::Submit(Box::new(submission)));
        });
    }
}

/// Resolves `args` in order, up to the first that failed.
fn resolve_args(owner: &Owner, args: &[Arg]) -> ResolvedArgs {
    let mut resolved = ResolvedArgs {
        args: Vec::with_capacity(args.len()),
        waiting: Vec::new(),
        failed: None,
    };
    for arg in args {
        match resolve_arg(owner, arg) {
            Ok(Some(ready)) => resolved.args.push(ready),
            Ok(None) => resolved.waiting.push(match arg {
                Arg::Ref(object) => object.id(),
                Arg::Value { .. } => unreachable!("values are always resolved"),
            }),
            Err(error) => {
                resolved.failed = Some(error);
                break;
            }
        }
    }
    resolved
}

/// An owned, finished argument: its bytes inline, or where it is stored.
/// A value, or an owned object's value inlined (or where it is stored),
/// or a borrowed reference for the worker to fetch; `None` while an owned
/// object is pending.
pub(crate) fn resolve_arg(owner: &Owner, arg: &Arg) -> Result<Option<TaskArg>, TaskError> {
    let kind = match arg {
        Arg::Value { data, .. } => task_arg::Kind::Value(data.clone()),
        Arg::Ref(object) if owner.owns(object) => match owner.store.try_get(object.id()) {
            Ok(Some(Ok(value))) => owned_arg(object.id(), value),
            Ok(Some(Err(error))) => return Err(error),
            Ok(None) => return Ok(None),
            Err(lost) => {
                return Err(TaskError::new(TaskErrorKind::Argument, "", lost.to_string()));
            }
        },
        Arg::Ref(object) => task_arg::Kind::ObjectRef(object.raw().to_proto()),
    };
    Ok(Some(TaskArg { kind: Some(kind) }))
}

/// The objects a call's arguments refer to: pinned until the call is done.
pub(crate) fn pinned_by(args: Vec<Arg>) -> Vec<AnyObjectRef> {
    args.into_iter()
        .flat_map(|arg| match arg {
            Arg::Value { contained, .. } => contained,
            Arg::Ref(object) => vec![object],
        })
        .collect()
}

fn owned_arg(id: ObjectId, value: EncodedValue) -> task_arg::Kind {
    match value.body {
        Body::Inline(data) => task_arg::Kind::Value(data),
        Body::Stored(at) => task_arg::Kind::Stored(v1::StoredArg {
            object_id: id.as_bytes().to_vec(),
            location: Some(at.to_proto()),
        }),
    }
}
