//! How many tasks go ahead to one leased worker: a worker with nothing to
//! do takes the next task; a busy one takes more, up to [`PIPELINE_DEPTH`],
//! only while the tasks it has and the next one are known to be short
//! (their functions' recent run times sum within [`PIPELINE_BUDGET`]), so
//! that short tasks save a round trip and long ones do not hold others
//! back behind them while other workers could run them.

use std::collections::HashMap;
use std::time::Duration;

use raylet_proto::TaskId;

use super::queued_task::QueuedTask;

/// Most tasks sent ahead to one leased worker.
const PIPELINE_DEPTH: usize = 8;
/// A task is queued behind others on a worker only when those are expected
/// to finish within this long: long tasks must not hold short ones back
/// while other workers could run them.
const PIPELINE_BUDGET: Duration = Duration::from_micros(2_000);

/// How long each function ran lately, to decide whether queueing a task
/// behind others on one worker is worth it.
#[derive(Default)]
pub(super) struct RunTimes {
    micros: HashMap<String, f64>,
}

impl RunTimes {
    /// Counts a run of `function` that took `micros` into its average.
    pub(super) fn record(&mut self, function: &str, micros: u64) {
        let sample = micros as f64;
        match self.micros.get_mut(function) {
            Some(average) => *average = 0.8 * *average + 0.2 * sample,
            None => {
                self.micros.insert(function.to_string(), sample);
            }
        }
    }

    /// Whether `next` may go to a worker that runs `in_flight`: always when
    /// it is idle; behind others only when all are known to be short.
    pub(super) fn may_send(&self, in_flight: &HashMap<TaskId, QueuedTask>, next: Option<&QueuedTask>) -> bool {
        if in_flight.is_empty() {
            return true;
        }
        if in_flight.len() >= PIPELINE_DEPTH {
            return false;
        }
        let budget = PIPELINE_BUDGET.as_micros() as f64;
        let expected = |task: &QueuedTask| {
            self.micros
                .get(task.options().function)
                .copied()
                .unwrap_or(f64::INFINITY)
        };
        let queued: f64 = in_flight.values().map(expected).sum();
        queued + next.map_or(0.0, expected) <= budget
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use raylet_proto::TaskId;

    use super::{PIPELINE_BUDGET, PIPELINE_DEPTH, RunTimes};
    use crate::submitter::queued_task::QueuedTask;
    use crate::submitter::task::TaskOptions;
    use crate::submitter::tests::harness::queued;

    fn task(function: &'static str) -> QueuedTask {
        queued(TaskOptions::new(function))
    }

    fn running(tasks: impl IntoIterator<Item = QueuedTask>) -> HashMap<TaskId, QueuedTask> {
        tasks.into_iter().map(|task| (task.task_id, task)).collect()
    }

    /// Run times with `function` known to take `micros`.
    fn knowing(function: &str, micros: u64) -> RunTimes {
        let mut times = RunTimes::default();
        times.record(function, micros);
        times
    }

    #[test]
    fn an_idle_worker_takes_any_task() {
        let times = RunTimes::default();
        assert!(times.may_send(&HashMap::new(), Some(&task("tests::unknown"))));
    }

    #[test]
    fn a_task_of_unknown_length_waits_for_a_busy_worker() {
        let times = knowing("tests::short", 10);
        let busy = running([task("tests::short")]);
        assert!(!times.may_send(&busy, Some(&task("tests::unknown"))));
        let busy_with_unknown = running([task("tests::unknown")]);
        assert!(!times.may_send(&busy_with_unknown, Some(&task("tests::short"))));
    }

    #[test]
    fn short_tasks_go_ahead_while_they_fit_the_budget() {
        let quarter = PIPELINE_BUDGET.as_micros() as u64 / 4;
        let times = knowing("tests::short", quarter);
        let three = running((0..3).map(|_| task("tests::short")));
        assert!(times.may_send(&three, Some(&task("tests::short"))), "four quarters fit");
        let four = running((0..4).map(|_| task("tests::short")));
        assert!(!times.may_send(&four, Some(&task("tests::short"))), "a fifth does not");
    }

    #[test]
    fn no_more_than_the_pipeline_depth_go_ahead() {
        let times = knowing("tests::tiny", 1);
        let almost = running((0..PIPELINE_DEPTH - 1).map(|_| task("tests::tiny")));
        assert!(times.may_send(&almost, Some(&task("tests::tiny"))));
        let full = running((0..PIPELINE_DEPTH).map(|_| task("tests::tiny")));
        assert!(!times.may_send(&full, Some(&task("tests::tiny"))));
    }

    #[test]
    fn a_run_time_is_a_moving_average() {
        let budget = PIPELINE_BUDGET.as_micros() as u64;
        let mut times = knowing("tests::varied", budget / 2);
        let one = || running([task("tests::varied")]);
        assert!(times.may_send(&one(), Some(&task("tests::varied"))));
        times.record("tests::varied", budget * 3);
        // 0.8 * budget / 2 + 0.2 * 3 * budget = budget: two no longer fit.
        assert!(!times.may_send(&one(), Some(&task("tests::varied"))));
    }
}
