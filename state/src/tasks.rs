//! Tasks as the head records them, for `raylet list tasks`, `raylet summary
//! tasks`, the dashboard and scripts: one row per attempt of a task or
//! actor call, and their counts by function and state.

use std::collections::BTreeMap;

use raylet_common::auth::AuthToken;
use raylet_proto::v1::task_event_service_client::TaskEventServiceClient;
use raylet_proto::v1::{ListSpansRequest, ListTasksRequest, Span, TaskKind, TaskRecord, TaskState};
use raylet_proto::{ActorId, JobId, NodeId, TaskId, WorkerId};
use serde::Serialize;

use crate::error::Result;

/// How long a listing waits for the head to answer a connection.
const HEAD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// One attempt of a task or actor call. Times are milliseconds since the
/// Unix epoch, absent until the task got there.
#[derive(Clone, Debug, Serialize)]
pub struct TaskInfo {
    pub task_id: TaskId,
    pub attempt: u32,
    /// The registered function, or `Class::method` for an actor call.
    pub name: String,
    /// PENDING_ARGS_AVAIL, PENDING_NODE_ASSIGNMENT, SUBMITTED_TO_WORKER,
    /// RUNNING, FINISHED or FAILED.
    pub state: String,
    /// NORMAL_TASK, ACTOR_CREATION_TASK or ACTOR_TASK.
    pub kind: String,
    pub job_id: Option<JobId>,
    pub actor_id: Option<ActorId>,
    pub node_id: Option<NodeId>,
    pub worker_id: Option<WorkerId>,
    pub worker_pid: Option<u32>,
    pub submitted_ms: Option<f64>,
    pub scheduled_ms: Option<f64>,
    pub start_ms: Option<f64>,
    pub end_ms: Option<f64>,
    /// How long its function ran.
    pub duration_ms: Option<f64>,
    pub error: Option<String>,
    /// Of a generator: the items its caller received so far.
    pub items_yielded: Option<u64>,
}

impl TaskInfo {
    fn from_record(record: TaskRecord) -> Option<Self> {
        let millis = |micros: u64| (micros != 0).then_some(micros as f64 / 1000.0);
        let duration = (record.start_unix_micros != 0 && record.end_unix_micros >= record.start_unix_micros)
            .then(|| (record.end_unix_micros - record.start_unix_micros) as f64 / 1000.0);
        Some(TaskInfo {
            task_id: TaskId::from_wire(&record.task_id).ok()?,
            attempt: record.attempt,
            name: record.function.clone(),
            state: record.state().as_str_name().to_string(),
            kind: record.kind().as_str_name().to_string(),
            job_id: JobId::from_wire(&record.job_id).ok(),
            actor_id: ActorId::from_wire(&record.actor_id).ok(),
            node_id: NodeId::from_wire(&record.node_id).ok(),
            worker_id: WorkerId::from_wire(&record.worker_id).ok(),
            worker_pid: (record.worker_pid != 0).then_some(record.worker_pid),
            submitted_ms: millis(record.submitted_unix_micros),
            scheduled_ms: millis(record.scheduled_unix_micros),
            start_ms: millis(record.start_unix_micros),
            end_ms: millis(record.end_unix_micros),
            duration_ms: duration,
            error: (!record.error.is_empty()).then_some(record.error),
            items_yielded: (record.items_yielded != 0).then_some(record.items_yielded),
        })
    }

    pub fn is_actor_call(&self) -> bool {
        self.kind == TaskKind::ActorTask.as_str_name()
    }
}

/// The head's task records and what it could not keep.
#[derive(Clone, Debug, Serialize)]
pub struct TaskListing {
    /// Newest first.
    pub tasks: Vec<TaskInfo>,
    /// How many records matched; `tasks` holds at most the limit asked for.
    pub total: u64,
    /// Events lost to full buffers or the head's bound.
    pub dropped: u64,
}

/// The tasks of `job` (every job when `None`) that the head at `head`
/// records, newest first, at most `limit` (0: the head's own bound).
pub async fn list_tasks(head: &str, token: &AuthToken, job: Option<JobId>, limit: u32) -> Result<TaskListing> {
    let channel = raylet_proto::channel::connect(head, token, HEAD_PATIENCE).await?;
    let request = ListTasksRequest {
        job_id: job.map(|job| job.as_bytes().to_vec()).unwrap_or_default(),
        limit,
    };
    let reply = TaskEventServiceClient::new(channel).list_tasks(request).await;
    let reply = reply.map_err(raylet_proto::Error::from)?.into_inner();
    Ok(TaskListing {
        tasks: reply.tasks.into_iter().filter_map(TaskInfo::from_record).collect(),
        total: reply.total,
        dropped: reply.dropped,
    })
}

/// The timeline spans of `job` (every job when `None`) that the head holds.
pub(crate) async fn list_spans(head: &str, token: &AuthToken, job: Option<JobId>) -> Result<Vec<Span>> {
    let channel = raylet_proto::channel::connect(head, token, HEAD_PATIENCE).await?;
    let request = ListSpansRequest {
        job_id: job.map(|job| job.as_bytes().to_vec()).unwrap_or_default(),
    };
    let reply = TaskEventServiceClient::new(channel).list_spans(request).await;
    Ok(reply.map_err(raylet_proto::Error::from)?.into_inner().spans)
}

/// The attempts of one function (or actor method), by state.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionSummary {
    pub name: String,
    pub kind: String,
    /// Attempts in each state, by Ray's state names.
    pub states: BTreeMap<String, u64>,
    /// The mean run time of its finished attempts.
    pub mean_duration_ms: Option<f64>,
}

/// Counts `tasks` by function and state, as `ray summary tasks` does; the
/// most-run functions first.
pub fn summarize_tasks(tasks: &[TaskInfo]) -> Vec<FunctionSummary> {
    let mut by_name: BTreeMap<&str, (FunctionSummary, f64, u64)> = BTreeMap::new();
    for task in tasks {
        let (summary, run_ms, runs) = by_name.entry(&task.name).or_insert_with(|| {
            let summary = FunctionSummary {
                name: task.name.clone(),
                kind: task.kind.clone(),
                states: BTreeMap::new(),
                mean_duration_ms: None,
            };
            (summary, 0.0, 0)
        });
        *summary.states.entry(task.state.clone()).or_default() += 1;
        if let (Some(duration), true) = (task.duration_ms, task.state == TaskState::Finished.as_str_name()) {
            *run_ms += duration;
            *runs += 1;
        }
    }
    let mut summaries: Vec<FunctionSummary> = by_name
        .into_values()
        .map(|(mut summary, run_ms, runs)| {
            summary.mean_duration_ms = (runs > 0).then(|| run_ms / runs as f64);
            summary
        })
        .collect();
    summaries.sort_by_key(|summary| std::cmp::Reverse(summary.states.values().sum::<u64>()));
    summaries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str, state: TaskState, duration_ms: Option<f64>) -> TaskInfo {
        TaskInfo {
            task_id: TaskId::random(),
            attempt: 0,
            name: name.into(),
            state: state.as_str_name().into(),
            kind: TaskKind::NormalTask.as_str_name().into(),
            job_id: None,
            actor_id: None,
            node_id: None,
            worker_id: None,
            worker_pid: None,
            submitted_ms: None,
            scheduled_ms: None,
            start_ms: None,
            end_ms: None,
            duration_ms,
            error: None,
            items_yielded: None,
        }
    }

    #[test]
    fn the_summary_counts_each_function_by_state_and_averages_finished_runs() {
        let tasks = vec![
            task("a", TaskState::Finished, Some(2.0)),
            task("a", TaskState::Finished, Some(4.0)),
            task("a", TaskState::Failed, Some(100.0)),
            task("b", TaskState::Running, None),
        ];
        let summary = summarize_tasks(&tasks);
        assert_eq!(summary[0].name, "a");
        assert_eq!(summary[0].states["FINISHED"], 2);
        assert_eq!(summary[0].states["FAILED"], 1);
        assert_eq!(summary[0].mean_duration_ms, Some(3.0));
        assert_eq!(summary[1].states["RUNNING"], 1);
        assert_eq!(summary[1].mean_duration_ms, None);
    }
}
