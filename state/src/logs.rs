//! `raylet logs`: the output of a worker, an actor or a task, read from the
//! log files that workers write on their nodes (`worker-<id>-<pid>.out|.err`
//! in the node's work directory). An actor's worker is found through the
//! head's actor table, a task's through its task record; a task's lines are
//! those between its markers in its worker's file.

use raylet_cluster_status::{ClusterStatus, NodeStatus};
use raylet_common::auth::AuthToken;
use raylet_proto::v1::ReadWorkerLogRequest;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::{ActorId, NodeId, TaskId, WorkerId};

use raylet_proto::worker_logs::{TASK_END, TASK_START};

use crate::error::{Result, StateError};
use crate::tasks::list_tasks;

/// How long a lookup waits for the head or a node to answer.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whose output to read.
#[derive(Clone, Debug)]
pub enum LogSource {
    /// A worker process, by id, on `node` or on any alive node.
    Worker { id: WorkerId, node: Option<NodeId> },
    /// A worker process, by pid, on `node` or on any alive node.
    Pid { pid: u32, node: Option<NodeId> },
    /// The worker process that hosts (or hosted last) an actor.
    Actor(ActorId),
    /// What a task printed, in its latest attempt that ran.
    Task(TaskId),
}

/// The output that was found.
#[derive(Clone, Debug)]
pub struct WorkerLogText {
    pub node_id: NodeId,
    /// `worker-<id>-<pid>.out` or `.err`.
    pub file: String,
    pub text: String,
    /// Whether the file is longer than what was read (its end).
    pub truncated: bool,
}

/// The stdout (or `stderr`) of `source` in the cluster whose head is at `head`.
pub async fn read_worker_log(head: &str, token: &AuthToken, source: &LogSource, stderr: bool) -> Result<WorkerLogText> {
    let status = ClusterStatus::fetch(head, token, PATIENCE).await?;
    let (request, node, task) = locate(head, token, source, stderr).await?;
    let nodes: Vec<&NodeStatus> = status
        .alive()
        .filter(|candidate| node.is_none_or(|node| candidate.node_id == node))
        .collect();
    for candidate in nodes {
        let channel = raylet_proto::channel::connect(&candidate.address, token, PATIENCE).await?;
        let reply = NodeManagerServiceClient::new(channel)
            .read_worker_log(request.clone())
            .await;
        let log = reply.map_err(raylet_proto::Error::from)?.into_inner();
        if !log.found {
            continue;
        }
        let text = String::from_utf8_lossy(&log.data).into_owned();
        return Ok(WorkerLogText {
            node_id: candidate.node_id,
            file: log.file,
            text: match task {
                Some(task) => lines_of_task(&text, &task.to_string()),
                None => text,
            },
            truncated: log.size > log.data.len() as u64,
        });
    }
    let where_ = match node {
        Some(node) => format!("on node {node}, which is not alive or has no such worker"),
        None => "on any alive node".to_string(),
    };
    Err(StateError::NoLogFile {
        what: format!("{source:?}"),
        place: where_,
    })
}

/// The request that names `source`'s worker file, the node to ask (any
/// when `None`), and the task whose lines to keep.
async fn locate(
    head: &str,
    token: &AuthToken,
    source: &LogSource,
    stderr: bool,
) -> Result<(ReadWorkerLogRequest, Option<NodeId>, Option<TaskId>)> {
    let request = |worker: Option<WorkerId>, pid: u32| ReadWorkerLogRequest {
        worker_id: worker.map(|id| id.as_bytes().to_vec()).unwrap_or_default(),
        pid,
        stderr,
        max_bytes: 0,
    };
    match source {
        LogSource::Worker { id, node } => Ok((request(Some(*id), 0), *node, None)),
        LogSource::Pid { pid, node } => Ok((request(None, *pid), *node, None)),
        LogSource::Actor(id) => {
            let actors = raylet::list_actors(head, token).await?;
            let actor = actors
                .iter()
                .find(|actor| actor.id == *id)
                .ok_or(StateError::NoActor(*id))?;
            if actor.pid == 0 {
                return Err(StateError::ActorNotStarted(*id));
            }
            Ok((request(None, actor.pid), actor.node_id, None))
        }
        LogSource::Task(id) => {
            let listing = list_tasks(head, token, None, u32::MAX).await?;
            let task = listing
                .tasks
                .iter()
                .find(|task| task.task_id == *id && task.worker_pid.is_some())
                .ok_or(StateError::TaskNeverRan(*id))?;
            let pid = task.worker_pid.unwrap_or_default();
            Ok((request(task.worker_id, pid), task.node_id, Some(*id)))
        }
    }
}

/// The lines of `text` between the start and end markers of `task`.
fn lines_of_task(text: &str, task: &str) -> String {
    let mut inside = false;
    let mut kept = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(TASK_START) {
            inside = rest.split_whitespace().next() == Some(task);
            continue;
        }
        if line.starts_with(TASK_END) {
            inside = false;
            continue;
        }
        if inside {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_lines_are_those_between_its_markers() {
        let text = "startup\n:task_start: aa f\none\n:task_end: aa\n:task_start: bb g\nother\n\
                    :task_end: bb\n:task_start: aa f\ntwo\n";
        assert_eq!(lines_of_task(text, "aa"), "one\ntwo\n");
        assert_eq!(lines_of_task(text, "bb"), "other\n");
        assert_eq!(lines_of_task(text, "cc"), "");
    }
}
