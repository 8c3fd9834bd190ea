//! What a remote call is made of: its options, its arguments, and the error
//! a failed task yields.

use std::fmt;

use bytes::Bytes;
use raylet_proto::placement_group::demand_in_bundle;
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::v1::{self, FailureKind};
use raylet_proto::{Amount, LabelSelector, NodeId, ResourceSet, Scheduling, SchedulingStrategy};
use serde::Serialize;

use crate::{ObjectRef, PlacementGroup, Result};

/// Options of one remote call. `#[raylet::remote(..)]` sets the defaults and
/// the generated `options()` builder changes them per call.
#[derive(Clone, Debug)]
pub struct TaskOptions {
    pub(crate) function: &'static str,
    pub(crate) display_name: Option<String>,
    pub(crate) resources: Resources,
    pub(crate) scheduling: SchedulingOptions,
    pub(crate) max_retries: u32,
    pub(crate) retry_exceptions: bool,
}

impl TaskOptions {
    /// Retries after a worker dies, unless set otherwise.
    pub const DEFAULT_MAX_RETRIES: u32 = 3;

    /// Options for the registered function `function`: 1 CPU, 3 retries.
    pub fn new(function: &'static str) -> Self {
        TaskOptions {
            function,
            display_name: None,
            resources: Resources::default().with(CPU, 1.0),
            scheduling: SchedulingOptions::default(),
            max_retries: Self::DEFAULT_MAX_RETRIES,
            retry_exceptions: false,
        }
    }

    pub fn num_cpus(self, amount: f64) -> Self {
        self.resource(CPU, amount)
    }

    pub fn num_gpus(self, amount: f64) -> Self {
        self.resource(GPU, amount)
    }

    /// Bytes of memory the task needs.
    pub fn memory(self, bytes: f64) -> Self {
        self.resource(MEMORY, bytes)
    }

    /// Any resource by name, e.g. `resource("TPU", 1.0)`.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources = self.resources.with(name, amount);
        self
    }

    /// How the node is chosen among those that fit (default: Ray's hybrid
    /// policy; `Spread`; or a node affinity).
    pub fn scheduling_strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.scheduling = self.scheduling.strategy(strategy);
        self
    }

    /// Runs only on nodes whose label `key` satisfies `expression`:
    /// `value`, `!value`, `in(a,b)` or `!in(a,b)`.
    pub fn label_selector(mut self, key: &str, expression: &str) -> Self {
        self.scheduling = self.scheduling.label(key, expression);
        self
    }

    /// How often a task is retried when its worker dies (default 3).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Also retry when the function returns `Err` or panics.
    pub fn retry_exceptions(mut self, retry: bool) -> Self {
        self.retry_exceptions = retry;
        self
    }

    /// A name to show for this call instead of the function's.
    pub fn name(mut self, name: &str) -> Self {
        self.display_name = Some(name.to_string());
        self
    }

    /// Runs the task in bundle `bundle` of `group`, or in any of its
    /// bundles; its resources come out of the bundle's.
    pub fn placement_group(mut self, group: &PlacementGroup, bundle: Option<u32>) -> Self {
        self.scheduling = self.scheduling.in_group(group, bundle);
        self
    }

    /// The resource demand, validated; inside a placement group, asked
    /// under the bundle's names.
    pub(crate) fn demand(&self) -> Result<ResourceSet> {
        self.scheduling.in_bundle(self.resources.to_set()?)
    }
}

/// Resources a call or an actor asks for, by name, as given.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resources(Vec<(String, f64)>);

impl Resources {
    /// These resources with `name` set to `amount`.
    pub(crate) fn with(mut self, name: &str, amount: f64) -> Self {
        self.0.retain(|(existing, _)| existing != name);
        self.0.push((name.to_string(), amount));
        self
    }

    pub(crate) fn names(&self, name: &str) -> bool {
        self.0.iter().any(|(existing, _)| existing == name)
    }

    /// The amounts, validated: more than one GPU must be a whole number.
    pub(crate) fn to_set(&self) -> Result<ResourceSet> {
        let mut set = ResourceSet::new();
        for (name, amount) in &self.0 {
            if name == GPU && *amount > 1.0 && amount.fract() != 0.0 {
                let message = format!("num_gpus above 1 must be a whole number, got {amount}");
                return Err(raylet_proto::Error::InvalidArgument(message).into());
            }
            set.set(name, Amount::parse(name, *amount)?);
        }
        Ok(set)
    }
}

/// Where a call or an actor may run beyond its resources, as given.
#[derive(Clone, Debug, Default)]
pub(crate) struct SchedulingOptions {
    strategy: SchedulingStrategy,
    label_selector: Vec<(String, String)>,
    /// Why the options cannot be used, found when they were set.
    invalid: Option<String>,
}

impl SchedulingOptions {
    pub(crate) fn strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    pub(crate) fn label(mut self, key: &str, expression: &str) -> Self {
        self.label_selector.push((key.to_string(), expression.to_string()));
        self
    }

    pub(crate) fn in_group(mut self, group: &PlacementGroup, bundle: Option<u32>) -> Self {
        if let Some(index) = bundle.filter(|&index| index >= group.bundle_count()) {
            self.invalid = Some(format!(
                "bundle index {index} is out of range: placement group {} has {} bundles",
                group.id(),
                group.bundle_count()
            ));
        }
        self.strategy = SchedulingStrategy::PlacementGroup {
            group: group.id(),
            bundle,
        };
        self
    }

    /// `demand` as work inside the placement group asks for it, if any.
    pub(crate) fn in_bundle(&self, demand: ResourceSet) -> Result<ResourceSet> {
        match self.strategy {
            SchedulingStrategy::PlacementGroup { group, bundle } => Ok(demand_in_bundle(group, bundle, &demand)?),
            _ => Ok(demand),
        }
    }

    /// The strategy and selector, validated.
    pub(crate) fn to_scheduling(&self) -> Result<Scheduling> {
        if let Some(invalid) = &self.invalid {
            return Err(raylet_proto::Error::InvalidArgument(invalid.clone()).into());
        }
        let label_selector = self
            .label_selector
            .iter()
            .try_fold(LabelSelector::default(), |selector, (key, expression)| {
                selector.with(key, expression)
            })?;
        Ok(Scheduling {
            strategy: self.strategy.clone(),
            label_selector,
        })
    }
}

/// One argument of a remote call: an encoded value (with the references
/// serialized inside it, kept alive until the task is done), or a reference
/// that the worker resolves before the function runs.
#[derive(Clone, Debug)]
pub enum Arg {
    Value {
        data: Bytes,
        contained: Vec<crate::AnyObjectRef>,
    },
    Ref(crate::AnyObjectRef),
}

/// Turns a value or an `ObjectRef` into an argument of type `T`.
pub trait IntoArg<T> {
    fn into_arg(self) -> Result<Arg>;
}

impl<T: Serialize> IntoArg<T> for T {
    fn into_arg(self) -> Result<Arg> {
        let (data, contained) = crate::value::collecting_refs(|| raylet_proto::codec::encode(&self));
        Ok(Arg::Value {
            data: data?.into(),
            contained,
        })
    }
}

impl<T> IntoArg<T> for ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.raw()))
    }
}

impl<T> IntoArg<T> for &ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.raw()))
    }
}

/// Passes the reference itself to a function that takes an `ObjectRef<T>`.
impl<T> IntoArg<ObjectRef<T>> for &ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        <ObjectRef<T> as IntoArg<ObjectRef<T>>>::into_arg(self.clone())
    }
}

/// Why a task failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskErrorKind {
    /// The function returned `Err`; the message is the error's.
    Application,
    /// The function panicked; the message is the panic's.
    Panic,
    /// The worker process died, on every attempt.
    WorkerCrashed,
    /// The node's out-of-memory monitor ended the worker, on every attempt.
    OutOfMemory,
    Cancelled,
    /// No node of the cluster can ever fit the requested resources.
    Infeasible,
    /// A hard scheduling constraint names what is not there, such as a
    /// node affinity to a dead node.
    Unschedulable,
    /// The worker binary has no function of that name.
    FunctionNotFound,
    /// The worker runs another build of the binary than the caller.
    BinaryMismatch,
    /// An argument could not be decoded or fetched.
    Argument,
    /// The process that owned an object is gone.
    OwnerDied,
    /// The actor's process died and the call was not retried, or the actor
    /// is dead; the message says why.
    ActorDied,
    /// The actor's constructor failed; the message is its error.
    ActorCreationFailed,
}

/// A failed task, as its `ObjectRef` yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    pub kind: TaskErrorKind,
    pub function: String,
    pub message: String,
    pub node_id: Option<NodeId>,
    pub pid: u32,
    /// The attempt that failed last, from 0; above 0 means it was retried.
    pub attempt: u32,
}

impl TaskError {
    pub(crate) fn new(kind: TaskErrorKind, function: &str, message: impl Into<String>) -> Self {
        TaskError {
            kind,
            function: function.to_string(),
            message: message.into(),
            node_id: None,
            pid: 0,
            attempt: 0,
        }
    }

    pub(crate) fn from_proto(failure: v1::TaskFailure) -> Self {
        let kind = match failure.kind() {
            FailureKind::Application => TaskErrorKind::Application,
            FailureKind::Panic => TaskErrorKind::Panic,
            FailureKind::WorkerCrashed => TaskErrorKind::WorkerCrashed,
            FailureKind::OutOfMemory => TaskErrorKind::OutOfMemory,
            FailureKind::Cancelled => TaskErrorKind::Cancelled,
            FailureKind::Infeasible => TaskErrorKind::Infeasible,
            FailureKind::Unschedulable => TaskErrorKind::Unschedulable,
            FailureKind::FunctionNotFound => TaskErrorKind::FunctionNotFound,
            FailureKind::BinaryMismatch => TaskErrorKind::BinaryMismatch,
            FailureKind::OwnerDied => TaskErrorKind::OwnerDied,
            FailureKind::ActorDied => TaskErrorKind::ActorDied,
            FailureKind::ActorCreationFailed => TaskErrorKind::ActorCreationFailed,
            FailureKind::Argument | FailureKind::Unspecified => TaskErrorKind::Argument,
        };
        TaskError {
            kind,
            function: failure.function,
            message: failure.message,
            node_id: NodeId::from_wire(&failure.node_id).ok(),
            pid: failure.pid,
            attempt: failure.attempt,
        }
    }

    pub(crate) fn to_proto(&self) -> v1::TaskFailure {
        let kind = match self.kind {
            TaskErrorKind::Application => FailureKind::Application,
            TaskErrorKind::Panic => FailureKind::Panic,
            TaskErrorKind::WorkerCrashed => FailureKind::WorkerCrashed,
            TaskErrorKind::OutOfMemory => FailureKind::OutOfMemory,
            TaskErrorKind::Cancelled => FailureKind::Cancelled,
            TaskErrorKind::Infeasible => FailureKind::Infeasible,
            TaskErrorKind::Unschedulable => FailureKind::Unschedulable,
            TaskErrorKind::FunctionNotFound => FailureKind::FunctionNotFound,
            TaskErrorKind::BinaryMismatch => FailureKind::BinaryMismatch,
            TaskErrorKind::Argument => FailureKind::Argument,
            TaskErrorKind::OwnerDied => FailureKind::OwnerDied,
            TaskErrorKind::ActorDied => FailureKind::ActorDied,
            TaskErrorKind::ActorCreationFailed => FailureKind::ActorCreationFailed,
        };
        v1::TaskFailure {
            kind: kind as i32,
            message: self.message.clone(),
            function: self.function.clone(),
            node_id: self.node_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default(),
            pid: self.pid,
            attempt: self.attempt,
        }
    }

    /// Whether retrying on another worker may help.
    pub(crate) fn is_exception(&self) -> bool {
        matches!(self.kind, TaskErrorKind::Application | TaskErrorKind::Panic)
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            TaskErrorKind::Application => "returned an error",
            TaskErrorKind::Panic => "panicked",
            TaskErrorKind::WorkerCrashed => "lost its worker",
            TaskErrorKind::OutOfMemory => "ran out of memory (OOM)",
            TaskErrorKind::Cancelled => "was cancelled",
            TaskErrorKind::Infeasible => "cannot be scheduled",
            TaskErrorKind::Unschedulable => "cannot be scheduled where it must run",
            TaskErrorKind::FunctionNotFound => "is not registered in the worker",
            TaskErrorKind::BinaryMismatch => "was sent to another build of the binary",
            TaskErrorKind::Argument => "could not get its arguments",
            TaskErrorKind::OwnerDied => "lost the owner of an object",
            TaskErrorKind::ActorDied => "was not run: its actor died",
            TaskErrorKind::ActorCreationFailed => "was not run: its actor's constructor failed",
        };
        write!(f, "task {} {what}", self.function)?;
        if let Some(node) = self.node_id {
            write!(f, " (node {}, pid {}", node.short(), self.pid)?;
            if self.attempt > 0 {
                write!(f, ", attempt {} after {} retries", self.attempt + 1, self.attempt)?;
            }
            write!(f, ")")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for TaskError {}
