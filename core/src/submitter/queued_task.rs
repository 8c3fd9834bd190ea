//! A task as the submitter keeps it from submission until its result is in
//! (and after, while a stored result may need it to run again): small, so
//! that a driver can queue a million of them. What the tasks of one
//! function and options share is interned as a [`TaskTemplate`]; the wire
//! spec is built only when the task is sent to a worker.

use std::sync::Arc;

use raylet_proto::v1::{LentObject, TaskArg, TaskKind, TaskSpec, task_arg};
use raylet_proto::{JobId, ObjectId, TaskId};

use super::SchedulingClass;
use crate::interner::Interner;
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::objects::owner::Owner;
use crate::observability::task_events::TaskIdentity;
use crate::submitter::pending_gate::PendingPermit;
use crate::submitter::task::TaskOptions;

/// What the tasks of one function and options share.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct TaskTemplate {
    pub(crate) options: QueuedOptions,
    pub(crate) class: SchedulingClass,
    /// The job the tasks belong to.
    pub(crate) job: JobId,
}

/// The templates of a process's calls, one shared copy of each.
pub(crate) type TemplateCache = Interner<TaskTemplate>;

/// What a queued task keeps of its options.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct QueuedOptions {
    pub(crate) function: &'static str,
    display_name: Option<Box<str>>,
    pub(crate) max_retries: u32,
    pub(crate) retry_exceptions: bool,
    pub(crate) num_returns: u32,
    /// Whether the function is a generator: its items stream back.
    pub(crate) generator: bool,
}

impl QueuedOptions {
    pub(crate) fn new(options: TaskOptions) -> Self {
        QueuedOptions {
            function: options.function,
            display_name: options.display_name.map(String::into_boxed_str),
            max_retries: options.max_retries,
            retry_exceptions: options.retry_exceptions,
            num_returns: options.num_returns,
            generator: options.generator.is_some(),
        }
    }

    /// The name the task is shown under: its display name or its function.
    pub(crate) fn shown_name(&self) -> String {
        self.display_name.as_deref().unwrap_or(self.function).to_string()
    }
}

/// A task's resolved arguments, the objects lent with them and the
/// references they hold, which stay pinned until the task is done.
pub(crate) struct TaskInputs {
    pub(crate) args: Vec<TaskArg>,
    pub(crate) lent: Vec<LentObject>,
    pub(crate) pinned: Vec<AnyObjectRef>,
}

/// A queued task's inputs, with where most of their bytes are.
struct HeldInputs {
    inputs: TaskInputs,
    /// The node manager whose store holds most of the arguments' bytes.
    near: Option<Arc<str>>,
}

/// 48 bytes: what every task shares is in its template, and its inputs
/// are boxed, `None` for the many tasks without arguments.
pub(crate) struct QueuedTask {
    pub(crate) task_id: TaskId,
    pub(crate) attempt: u32,
    /// Whether the worker records timeline spans of it.
    pub(crate) timeline: bool,
    pub(crate) template: Arc<TaskTemplate>,
    inputs: Option<Box<HeldInputs>>,
    /// Its place among the process's pending tasks; given up when it is
    /// done, even if it is kept to run again.
    permit: Option<PendingPermit>,
}

impl QueuedTask {
    pub(crate) fn new(task_id: TaskId, template: Arc<TaskTemplate>, inputs: TaskInputs, permit: PendingPermit) -> Self {
        let empty = inputs.args.is_empty() && inputs.lent.is_empty() && inputs.pinned.is_empty();
        QueuedTask {
            task_id,
            attempt: 0,
            timeline: crate::observability::timeline::is_on(),
            template,
            inputs: (!empty).then(|| {
                let near = holder_of_most_bytes(&inputs.args);
                Box::new(HeldInputs { inputs, near })
            }),
            permit: Some(permit),
        }
    }

    /// The task with its result in: it no longer counts as pending.
    pub(crate) fn done(mut self) -> Self {
        self.permit = None;
        self
    }

    /// The node manager whose store holds most of the arguments' bytes.
    pub(crate) fn near(&self) -> Option<&Arc<str>> {
        self.inputs.as_ref()?.near.as_ref()
    }

    pub(crate) fn options(&self) -> &QueuedOptions {
        &self.template.options
    }

    pub(crate) fn return_id(&self) -> ObjectId {
        self.task_id.return_object()
    }

    /// The objects the task returns: its values, or a generator's outcome.
    pub(crate) fn return_ids(&self) -> impl Iterator<Item = ObjectId> + use<> {
        let task_id = self.task_id;
        (0..u64::from(self.template.options.num_returns)).map(move |index| task_id.object_at(index))
    }

    /// Whether `object` is one the task returns.
    pub(crate) fn returns(&self, object: ObjectId) -> bool {
        self.return_ids().any(|id| id == object)
    }

    pub(crate) fn identity(&self) -> TaskIdentity<'_> {
        TaskIdentity {
            task_id: self.task_id,
            attempt: self.attempt,
            function: self.template.options.function,
            kind: TaskKind::NormalTask,
            actor_id: None,
        }
    }

    pub(crate) fn can_retry(&self) -> bool {
        self.attempt < self.template.options.max_retries
    }

    /// The spec a worker runs, for this attempt.
    pub(crate) fn spec(&self, owner: &Owner) -> TaskSpec {
        let (args, lent) = match &self.inputs {
            Some(held) => (held.inputs.args.clone(), held.inputs.lent.clone()),
            None => (Vec::new(), Vec::new()),
        };
        TaskSpec {
            task_id: self.task_id.as_bytes().to_vec(),
            function: self.template.options.function.to_string(),
            binary_hash: owner.ctx.binary.hash.clone(),
            args,
            attempt: self.attempt,
            owner_address: owner.ctx.address.to_string(),
            job_id: self.template.job.as_bytes().to_vec(),
            timeline: self.timeline,
            lent,
            num_returns: self.template.options.num_returns,
            generator: match self.template.options.generator {
                true => owner.generators.call_for(self.task_id),
                false => None,
            },
            ..TaskSpec::default()
        }
    }
}

/// The node manager whose store holds the most bytes of `args` that are
/// stored (a copy counts for every node that holds one); `None` when no
/// argument is stored.
fn holder_of_most_bytes(args: &[TaskArg]) -> Option<Arc<str>> {
    let mut bytes: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for arg in args {
        if let Some(task_arg::Kind::Stored(stored)) = &arg.kind
            && let Some(location) = &stored.location
        {
            let holders = std::iter::once(&location.node_address).chain(&location.copies);
            for holder in holders {
                *bytes.entry(holder.as_str()).or_default() += location.size;
            }
        }
    }
    bytes
        .into_iter()
        .max_by_key(|(node, size)| (*size, std::cmp::Reverse(*node)))
        .map(|(node, _)| node.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_task_takes_48_bytes_so_that_a_million_fit_in_48_mib() {
        assert_eq!(std::mem::size_of::<QueuedTask>(), 48);
    }
}
