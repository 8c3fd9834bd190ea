//! Runs one task, actor constructor or actor method call: checks the
//! binary and the function, turns panics into task errors, and says where
//! the task failed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use raylet_proto::v1::{ActorCreation, Span, TaskResult, TaskSpec};
use raylet_proto::{ActorId, TaskId};

use super::actor_host::{ActorHost, QueuedCall, not_hosted};
use super::hand_over::{hand_over, panic_error};
use super::{WorkerContext, generator, logs};
use crate::actor::instance::{MethodCall, lookup_class};
use crate::objects::lent_objects;
use crate::observability::timeline;
use crate::observability::timeline::unix_micros;
use crate::registry::{self, Invoke, RegistryError, Returned, TaskOutcome};
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{EncodedValue, outcome_to_proto};

/// Where a task's result and output go: the stream of the owner that pushed it.
pub(crate) type ResultSender = raylet_proto::task_stream::EventSender;

/// Runs a task with its resolved arguments and reports how it went.
pub(crate) async fn run_task(
    context: &Arc<WorkerContext>,
    mut spec: TaskSpec,
    args: Result<Vec<Bytes>, TaskError>,
    results: &ResultSender,
) -> TaskResult {
    let _lent = context
        .core
        .owner
        .borrows
        .lend(lent_objects::received(std::mem::take(&mut spec.lent)));
    let started = Instant::now();
    let start_unix_micros = unix_micros();
    let task_id = TaskId::from_wire(&spec.task_id).ok();
    let events = &context.core.owner.task_events;
    events.adopt(&spec.job_id, spec.timeline);
    if let Some(id) = task_id {
        events.started(id, spec.attempt, &spec.job_id, start_unix_micros);
    }
    let cancelled = task_id.is_some_and(|id| context.take_cancelled(id));
    let outcome = if cancelled {
        Err(TaskError::new(
            TaskErrorKind::Cancelled,
            &spec.function,
            "cancelled before it started",
        ))
    } else {
        logs::attach(task_id, &spec.function, results.clone());
        match args {
            Ok(args) => execute(&spec, args, context).await,
            Err(error) => Err(error),
        }
    };
    raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerRan);
    let values = match outcome {
        Ok(returned) => hand_over_all(context, &spec, returned, results).await,
        Err(error) => Err(error),
    };
    let (outcome, more_returns) = match values {
        Ok(values) => {
            let mut values = values.into_iter();
            let first = values.next().ok_or_else(|| {
                TaskError::new(TaskErrorKind::Application, &spec.function, "the call returned no value")
            });
            (first, values.map(|value| outcome_to_proto(&Ok(value), true)).collect())
        }
        Err(error) => (Err(error), Vec::new()),
    };
    let outcome = outcome.map_err(|error| with_origin(error, &spec, context));
    logs::drain();
    let run_micros = started.elapsed().as_micros() as u64;
    if let Some(id) = task_id {
        events.stopped(id);
    }
    let spans = match spec.timeline {
        true => {
            let mut span = run_span(&spec, context, start_unix_micros, run_micros);
            if let Some(items) = outcome
                .as_ref()
                .ok()
                .and_then(|value| generator::items_yielded(&spec, value))
            {
                span.args.insert("items".to_string(), items.to_string());
            }
            timeline::record(span);
            timeline::take_pending()
        }
        false => Vec::new(),
    };
    TaskResult {
        task_id: spec.task_id,
        outcome: Some(outcome_to_proto(&outcome, true)),
        run_micros,
        start_unix_micros,
        spans,
        attempt: spec.attempt,
        metrics: crate::observability::metrics::take_updates(),
        more_returns,
    }
}

/// The timeline span of a task's run on this worker.
fn run_span(spec: &TaskSpec, context: &WorkerContext, start_unix_micros: u64, run_micros: u64) -> Span {
    let category = match (&spec.actor_creation, spec.actor_id.is_empty()) {
        (Some(_), _) => "actor_creation",
        (None, false) => "actor_task",
        (None, true) => "task",
    };
    Span {
        name: spec.function.clone(),
        category: category.to_string(),
        job_id: spec.job_id.clone(),
        task_id: spec.task_id.clone(),
        node_id: context.node_id.as_bytes().to_vec(),
        pid: context.pid,
        start_unix_micros,
        end_unix_micros: start_unix_micros + run_micros,
        args: [("attempt".to_string(), spec.attempt.to_string())].into(),
    }
}

/// Sync functions run on this thread; async ones on the cluster thread.
async fn execute(spec: &TaskSpec, args: Vec<Bytes>, context: &Arc<WorkerContext>) -> TaskOutcome {
    if spec.binary_hash != context.core.ctx().binary.hash {
        let message = format!(
            "the caller runs build {} of the binary, this worker runs build {}",
            spec.binary_hash,
            context.core.ctx().binary.hash
        );
        return Err(TaskError::new(TaskErrorKind::BinaryMismatch, &spec.function, message));
    }
    if let Some(creation) = &spec.actor_creation {
        return construct_actor(spec, creation, args, context);
    }
    if !spec.actor_id.is_empty() {
        return call_method(spec, args, context).await;
    }
    let invoke = registry::lookup(&spec.function).map_err(|e| not_found(spec, e, context))?;
    match invoke {
        Invoke::Sync(function) => catch_unwind(AssertUnwindSafe(|| function(args)))
            .unwrap_or_else(|payload| Err(panic_error(&spec.function, payload))),
        Invoke::Async(function) => joined(&spec.function, context.core.ctx().runtime.spawn(function(args))).await,
    }
}

/// The task error for a function or actor type this binary does not register.
fn not_found(spec: &TaskSpec, error: RegistryError, context: &WorkerContext) -> TaskError {
    let message = format!("{error} ({})", context.core.ctx().binary.path);
    TaskError::new(TaskErrorKind::FunctionNotFound, &spec.function, message)
}

/// Runs an actor's constructor and makes this worker its host.
fn construct_actor(
    spec: &TaskSpec,
    creation: &ActorCreation,
    args: Vec<Bytes>,
    context: &Arc<WorkerContext>,
) -> TaskOutcome {
    let id = ActorId::from_wire(&spec.actor_id)
        .map_err(|e| TaskError::new(TaskErrorKind::Argument, &spec.function, e.to_string()))?;
    let class = lookup_class(&spec.function).map_err(|e| not_found(spec, e, context))?;
    let instance = catch_unwind(AssertUnwindSafe(|| (class.construct)(args)))
        .unwrap_or_else(|payload| Err(panic_error(&spec.function, payload)))?;
    let max_concurrency = creation.max_concurrency.max(1) as usize;
    let host = ActorHost::start(context.clone(), id, instance, max_concurrency);
    if context.actor.set(host).is_err() {
        let message = "this worker hosts an actor already";
        return Err(TaskError::new(TaskErrorKind::Argument, &spec.function, message));
    }
    registry::encode_value(&spec.function, &())
}

/// Runs one queued actor call; its result goes to its caller's stream.
pub(crate) async fn run_call(context: Arc<WorkerContext>, call: QueuedCall) -> (TaskResult, ResultSender) {
    let QueuedCall { spec, results } = call;
    raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerDequeued);
    let args = super::args::resolve_args(&context, &spec).await;
    raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::WorkerArgsReady);
    (run_task(&context, spec, args, &results).await, results)
}

/// Calls a method of the hosted actor: a sync one on this thread when the
/// actor runs one call at a time, else on a thread of its own; an async one
/// as a task of this thread, where its calls arrive.
async fn call_method(spec: &TaskSpec, args: Vec<Bytes>, context: &Arc<WorkerContext>) -> TaskOutcome {
    let host = context
        .actor
        .get()
        .filter(|host| host.id.as_bytes()[..] == spec.actor_id[..])
        .ok_or_else(|| not_hosted(spec))?;
    let Some(call) = host.instance.call(&spec.method, args) else {
        let message = format!("the actor has no method {}", spec.method);
        return Err(TaskError::new(TaskErrorKind::FunctionNotFound, &spec.function, message));
    };
    match call {
        MethodCall::Sync(method) if host.max_concurrency == 1 => {
            catch_unwind(AssertUnwindSafe(method)).unwrap_or_else(|payload| Err(panic_error(&spec.function, payload)))
        }
        MethodCall::Sync(method) => joined(&spec.function, tokio::task::spawn_blocking(method)).await,
        MethodCall::Async(future) => joined(&spec.function, tokio::spawn(future)).await,
    }
}

/// The outcome of a spawned call; a panic in it is the call's error.
async fn joined(function: &str, handle: tokio::task::JoinHandle<TaskOutcome>) -> TaskOutcome {
    match handle.await {
        Ok(outcome) => outcome,
        Err(join) if join.is_panic() => Err(panic_error(function, join.into_panic())),
        Err(join) => Err(TaskError::new(TaskErrorKind::Cancelled, function, join.to_string())),
    }
}

/// Readies what a call returned for its caller: its return values, in
/// order, or the count of the items a generator sent as it ran.
async fn hand_over_all(
    context: &Arc<WorkerContext>,
    spec: &TaskSpec,
    returned: Returned,
    results: &ResultSender,
) -> Result<Vec<EncodedValue>, TaskError> {
    let task = TaskId::from_wire(&spec.task_id)
        .map_err(|e| TaskError::new(TaskErrorKind::Argument, &spec.function, e.to_string()))?;
    let values = match returned {
        Returned::One(value) => vec![value],
        Returned::Many(values) => values,
        Returned::Items(items) => return Ok(vec![generator::run_items(context, spec, items, results).await?]),
    };
    let expected = spec.num_returns.max(1) as usize;
    if values.len() != expected {
        let message = format!(
            "the call returned {} values, its caller expects {expected}",
            values.len()
        );
        return Err(TaskError::new(TaskErrorKind::Application, &spec.function, message));
    }
    let mut ready = Vec::with_capacity(values.len());
    for (index, value) in values.into_iter().enumerate() {
        ready.push(hand_over(context, spec, task.object_at(index as u64), value).await?);
    }
    Ok(ready)
}

/// The result of a task that failed before it could run.
pub(crate) fn failed(spec: &TaskSpec, error: TaskError) -> TaskResult {
    TaskResult {
        task_id: spec.task_id.clone(),
        outcome: Some(outcome_to_proto(&Err(error), true)),
        attempt: spec.attempt,
        ..TaskResult::default()
    }
}

/// Fills in where the task failed.
fn with_origin(mut error: TaskError, spec: &TaskSpec, context: &WorkerContext) -> TaskError {
    if error.function.is_empty() {
        error.function = spec.function.clone();
    }
    error.node_id = error.node_id.or(Some(context.node_id));
    if error.pid == 0 {
        error.pid = context.pid;
    }
    error.attempt = spec.attempt;
    error
}
