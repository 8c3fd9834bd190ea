//! Runs tasks one at a time on the worker's main thread: checks the binary
//! and the function, turns panics into task errors, and reports results.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use bytes::Bytes;
use raylet_proto::TaskId;
use raylet_proto::v1::{TaskResult, TaskSpec, WorkerEvents};
use tokio::sync::mpsc;
use tonic::Status;

use super::{WorkerContext, logs};
use crate::memory_store::outcome_to_proto;
use crate::registry::{self, Invoke, TaskOutcome};
use crate::task::{TaskError, TaskErrorKind};

/// Where a task's result goes: the stream of the owner that pushed it.
pub(crate) type ResultSender = mpsc::UnboundedSender<Result<WorkerEvents, Status>>;

/// A task with its resolved arguments.
pub(crate) struct Execution {
    pub(crate) spec: TaskSpec,
    pub(crate) args: Result<Vec<Bytes>, TaskError>,
    pub(crate) results: ResultSender,
}

/// Runs executions until every sender is gone.
pub(crate) fn run(
    receiver: std::sync::mpsc::Receiver<Execution>,
    context: &WorkerContext,
    runtime: &tokio::runtime::Runtime,
) {
    while let Ok(execution) = receiver.recv() {
        let Ok(task_id) = TaskId::from_wire(&execution.spec.task_id) else {
            continue;
        };
        let started = std::time::Instant::now();
        let outcome = if context.take_cancelled(task_id) {
            Err(TaskError::new(
                TaskErrorKind::Cancelled,
                &execution.spec.function,
                "cancelled before it started",
            ))
        } else {
            context.set_running(Some(task_id));
            logs::attach(&execution.spec.function, execution.results.clone());
            let outcome = execution
                .args
                .and_then(|args| execute(&execution.spec, args, context, runtime));
            context.set_running(None);
            outcome
        };
        let outcome = outcome.map_err(|error| with_origin(error, &execution.spec, context));
        let result = TaskResult {
            task_id: execution.spec.task_id,
            outcome: Some(outcome_to_proto(&outcome)),
            run_micros: started.elapsed().as_micros() as u64,
        };
        let _ = execution.results.send(Ok(WorkerEvents {
            results: vec![result],
            logs: Vec::new(),
        }));
    }
}

fn execute(
    spec: &TaskSpec,
    args: Vec<Bytes>,
    context: &WorkerContext,
    runtime: &tokio::runtime::Runtime,
) -> TaskOutcome {
    if spec.binary_hash != context.core.binary.hash {
        let message = format!(
            "the caller runs build {} of the binary, this worker runs build {}",
            spec.binary_hash, context.core.binary.hash
        );
        return Err(TaskError::new(TaskErrorKind::BinaryMismatch, &spec.function, message));
    }
    let Some(invoke) = registry::lookup(&spec.function) else {
        let message = format!(
            "no #[raylet::remote] function named {} in {}",
            spec.function, context.core.binary.path
        );
        return Err(TaskError::new(TaskErrorKind::FunctionNotFound, &spec.function, message));
    };
    match invoke {
        Invoke::Sync(function) => catch_unwind(AssertUnwindSafe(|| function(args)))
            .unwrap_or_else(|payload| Err(panic_error(&spec.function, payload))),
        Invoke::Async(function) => match runtime.block_on(runtime.spawn(function(args))) {
            Ok(outcome) => outcome,
            Err(join) if join.is_panic() => Err(panic_error(&spec.function, join.into_panic())),
            Err(join) => Err(TaskError::new(
                TaskErrorKind::Cancelled,
                &spec.function,
                join.to_string(),
            )),
        },
    }
}

fn panic_error(function: &str, payload: Box<dyn Any + Send>) -> TaskError {
    let message = if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-text payload".to_string()
    };
    TaskError::new(TaskErrorKind::Panic, function, message)
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
