//! What a finished attempt of a task does. A value is final (and the task
//! kept as lineage while a node stores it). An error its own code raised
//! runs it again only when it retries exceptions and has retries left; a
//! worker that died under it runs it again while it has retries left (after
//! a doubling backoff when the out-of-memory monitor ended the worker);
//! otherwise the error is final. A task runs again ahead of its class's
//! queue, as its next attempt.

use std::time::Duration;

use raylet_common::Backoff;
use raylet_proto::WorkerId;
use raylet_proto::v1::{self, WorkerExit, WorkerExitKind};
use tokio::time::Instant;

use super::events::{SubmitterEvent, TaskFinished};
use super::queued_task::QueuedTask;
use super::worker_stream::print_log_lines;
use super::{SchedulingClass, Submitter};
use crate::objects::owner::Owner;
use crate::observability::task_events::Ending;
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::Outcome;

/// The first pause before a task whose worker ran out of memory runs again.
pub(super) const OOM_RETRY_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause before a task the out-of-memory monitor ended runs again.
const MAX_OOM_RETRY_BACKOFF: Duration = Duration::from_secs(8);

/// What a task whose attempt failed does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterFailure {
    /// It runs again, after this pause if any.
    RunAgain { after: Option<Duration> },
    /// It fails with an error of this kind.
    Fail(TaskErrorKind),
}

/// What a task does whose worker exited as `exit` says while running it.
pub(super) fn after_worker_exit(task: &QueuedTask, exit: &WorkerExit) -> AfterFailure {
    let out_of_memory = exit.kind() == WorkerExitKind::OomKilled;
    match (task.can_retry(), out_of_memory) {
        (true, false) => AfterFailure::RunAgain { after: None },
        (true, true) => AfterFailure::RunAgain {
            after: Some(Backoff::delay_for_attempt(
                OOM_RETRY_BACKOFF,
                MAX_OOM_RETRY_BACKOFF,
                task.attempt,
            )),
        },
        (false, false) => AfterFailure::Fail(TaskErrorKind::WorkerCrashed),
        (false, true) => AfterFailure::Fail(TaskErrorKind::OutOfMemory),
    }
}

/// Whether `error`, which the task's worker returned, makes it run again.
fn runs_again_after(task: &QueuedTask, error: &TaskError) -> bool {
    task.options().retry_exceptions && error.is_exception() && task.can_retry()
}

impl Submitter {
    /// Fails every queued task of `shape` with an error of `kind`.
    pub(super) fn fail_queued(&mut self, shape: &SchedulingClass, kind: TaskErrorKind, reason: &str) {
        let Some(shape) = self.shapes.get_mut(shape) else {
            return;
        };
        let queued = std::mem::take(&mut shape.queue);
        for task in queued {
            let error = TaskError::new(kind, &task.options().shown_name(), reason);
            record_failure(&self.owner, &task, &error.to_string());
            self.fail_task(&task, error);
        }
    }

    /// A worker of lease `lease` sent results; a worker left with nothing
    /// to do starts to linger, and its class's queue goes on.
    pub(super) fn on_results(
        &mut self,
        worker_id: WorkerId,
        lease: u64,
        results: Vec<TaskFinished>,
        logs: Vec<v1::LogLine>,
    ) {
        let Some(worker) = self.workers.get_mut(&worker_id).filter(|w| w.lease == lease) else {
            return;
        };
        if self.owner.ctx.log_to_driver {
            print_log_lines(worker.pid, worker.node_id, &logs);
        }
        let mut finished = Vec::with_capacity(results.len());
        for result in results {
            if let Some(task) = worker.in_flight.remove(&result.task_id) {
                self.run_times.record(task.options().function, result.run_micros);
                finished.push((task, result.outcome));
            }
        }
        if worker.in_flight.is_empty() {
            worker.idle_since = Some(Instant::now());
        }
        let shape = worker.shape.clone();
        for (task, outcome) in finished {
            self.finish(task, outcome);
        }
        self.dispatch(&shape);
    }

    /// A task's attempt ended with `outcome`; a cancelled task's is ignored.
    fn finish(&mut self, task: QueuedTask, outcome: Outcome) {
        if self.cancelled.remove(&task.return_id()) {
            return;
        }
        match outcome {
            Err(error) if runs_again_after(&task, &error) => {
                tracing::info!(function = task.options().function, %error, "retrying a task that failed");
                self.requeue(task);
            }
            Err(error) => self.fail_task(&task, error),
            Ok(value) => self.keep_lineage(task, &value),
        }
    }

    /// Fails the objects `task` returns, and the items a run of a generator
    /// was making again.
    pub(super) fn fail_task(&self, task: &QueuedTask, error: TaskError) {
        let items = match task.options().generator {
            true => self.owner.generators.rebuilt(task.task_id),
            false => Vec::new(),
        };
        let rebuilt = items.into_iter().map(|item| task.task_id.object_at(item + 1));
        self.owner.fail_all(task.return_ids().chain(rebuilt), error);
    }

    /// Queues the task's next attempt first in its class.
    pub(super) fn requeue(&mut self, mut task: QueuedTask) {
        task.attempt += 1;
        self.owner.task_events.submitted(task.identity(), false);
        let template = task.template.clone();
        self.shape_mut(&template.class).queue.push_front(task);
    }

    /// A task back from its backoff is queued first in its class, unless it
    /// was cancelled meanwhile.
    pub(super) fn on_backoff_over(&mut self, task: QueuedTask) {
        if self.cancelled.remove(&task.return_id()) {
            return record_failure(&self.owner, &task, "cancelled");
        }
        let template = task.template.clone();
        self.shape_mut(&template.class).queue.push_front(task);
        self.dispatch(&template.class);
    }

    /// Runs the task again after `delay`, giving its node time to free memory.
    pub(super) fn requeue_after(&mut self, mut task: QueuedTask, delay: Duration) {
        task.attempt += 1;
        self.owner.task_events.submitted(task.identity(), false);
        let events = self.handle.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = events.send(SubmitterEvent::Retry(Box::new(task)));
        });
    }
}

/// Reports that a task's attempt failed without a result from its worker.
pub(super) fn record_failure(owner: &Owner, task: &QueuedTask, reason: &str) {
    owner
        .task_events
        .ended(task.task_id, task.attempt, Ending::failed(reason));
}

#[cfg(test)]
mod tests {
    use raylet_proto::v1::{WorkerExit, WorkerExitKind};

    use super::{AfterFailure, MAX_OOM_RETRY_BACKOFF, OOM_RETRY_BACKOFF, after_worker_exit, runs_again_after};
    use crate::submitter::queued_task::QueuedTask;
    use crate::submitter::task::TaskOptions;
    use crate::submitter::tests::harness::queued;
    use crate::task_error::{TaskError, TaskErrorKind};

    /// A task with `options`, at attempt `attempt`.
    fn attempt(options: TaskOptions, attempt: u32) -> QueuedTask {
        let mut task = queued(options);
        task.attempt = attempt;
        task
    }

    fn exit(kind: WorkerExitKind) -> WorkerExit {
        WorkerExit {
            exited: true,
            description: "ended".into(),
            kind: kind.into(),
        }
    }

    fn work() -> TaskOptions {
        TaskOptions::new("tests::work")
    }

    #[test]
    fn a_crashed_worker_runs_its_task_again_while_it_has_retries_left() {
        let crashed = exit(WorkerExitKind::Signaled);
        let first = attempt(work().max_retries(2), 0);
        assert_eq!(
            after_worker_exit(&first, &crashed),
            AfterFailure::RunAgain { after: None }
        );
        let second = attempt(work().max_retries(2), 1);
        assert_eq!(
            after_worker_exit(&second, &crashed),
            AfterFailure::RunAgain { after: None }
        );
        let last = attempt(work().max_retries(2), 2);
        let verdict = after_worker_exit(&last, &crashed);
        assert_eq!(verdict, AfterFailure::Fail(TaskErrorKind::WorkerCrashed));
        let never = attempt(work().max_retries(0), 0);
        let verdict = after_worker_exit(&never, &crashed);
        assert_eq!(verdict, AfterFailure::Fail(TaskErrorKind::WorkerCrashed));
    }

    #[test]
    fn a_worker_the_oom_monitor_ended_runs_its_task_again_after_a_doubling_backoff() {
        let killed = exit(WorkerExitKind::OomKilled);
        for (tried, step) in [
            (0, OOM_RETRY_BACKOFF),
            (1, OOM_RETRY_BACKOFF * 2),
            (2, OOM_RETRY_BACKOFF * 4),
        ] {
            let task = attempt(work().max_retries(5), tried);
            let AfterFailure::RunAgain { after: Some(pause) } = after_worker_exit(&task, &killed) else {
                panic!("attempt {tried} runs again after a pause");
            };
            assert!((step / 2..=step).contains(&pause), "attempt {tried}: {pause:?}");
        }
        let late = attempt(work().max_retries(50), 40);
        let AfterFailure::RunAgain { after: Some(pause) } = after_worker_exit(&late, &killed) else {
            panic!("a late attempt runs again after a pause");
        };
        assert!(pause <= MAX_OOM_RETRY_BACKOFF, "the pause is bounded: {pause:?}");
        let spent = attempt(work().max_retries(1), 1);
        let verdict = after_worker_exit(&spent, &killed);
        assert_eq!(verdict, AfterFailure::Fail(TaskErrorKind::OutOfMemory));
    }

    #[test]
    fn an_error_the_task_raised_runs_it_again_only_when_it_retries_exceptions() {
        let raised = TaskError::new(TaskErrorKind::Application, "tests::work", "bad input");
        let panicked = TaskError::new(TaskErrorKind::Panic, "tests::work", "index out of bounds");
        let retrying = attempt(work().max_retries(1).retry_exceptions(true), 0);
        assert!(runs_again_after(&retrying, &raised));
        assert!(runs_again_after(&retrying, &panicked));
        let not_retrying = attempt(work().max_retries(1), 0);
        assert!(!runs_again_after(&not_retrying, &raised));
        let spent = attempt(work().max_retries(1).retry_exceptions(true), 1);
        assert!(!runs_again_after(&spent, &raised), "no retries left");
    }

    #[test]
    fn an_error_not_raised_by_the_task_is_not_an_exception_to_retry() {
        let retrying = attempt(work().max_retries(3).retry_exceptions(true), 0);
        for kind in [
            TaskErrorKind::Argument,
            TaskErrorKind::Cancelled,
            TaskErrorKind::Infeasible,
        ] {
            let error = TaskError::new(kind, "tests::work", "not the task's own");
            assert!(!runs_again_after(&retrying, &error), "{kind:?}");
        }
    }
}
