//! `raylet logs`: the output of a worker, an actor or a task, read from the
//! log files that workers write on their nodes (`worker-<id>-<pid>.out|.err`
//! in the node's work directory). An actor's worker is found through the
//! head's actor table, a task's through its task record; a task's lines are
//! those between its markers in its worker's file. A [`LogFollower`] then
//! reads what the log gets next, across its rotations.

use raylet_cluster_status::{ClusterStatus, NodeStatus};
use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{LogPosition, ReadWorkerLogRequest};
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
    /// Whether the log is longer than what was read (its end).
    pub truncated: bool,
    /// Reads what the log gets after this text.
    pub follower: LogFollower,
}

/// Reads what a worker's log gets after a first read, from the node that
/// has it, following the log's parts as it rotates.
#[derive(Clone, Debug)]
pub struct LogFollower {
    node: NodeManagerServiceClient<AuthedChannel>,
    request: ReadWorkerLogRequest,
    end: Option<LogPosition>,
    /// A line read only in part, kept until its end arrives.
    partial: Vec<u8>,
    task: Option<TaskLines>,
}

/// What a follower read next.
#[derive(Clone, Debug, Default)]
pub struct FollowedText {
    /// Whole lines (of the task, for a task's log).
    pub text: String,
    /// Whether the follower fell so far behind that parts of the log it
    /// had not read were removed.
    pub lines_lost: bool,
}

/// The most a follower reads at a time.
const FOLLOW_BYTES: u64 = 1 << 20;

impl LogFollower {
    /// The whole lines written since the last read; empty when there are
    /// none yet.
    pub async fn next(&mut self) -> Result<FollowedText> {
        let mut followed = FollowedText::default();
        loop {
            let request = ReadWorkerLogRequest {
                follow_from: self.end,
                max_bytes: FOLLOW_BYTES,
                ..self.request.clone()
            };
            let reply = self.node.read_worker_log(request).await;
            let log = reply.map_err(raylet_proto::Error::from)?.into_inner();
            followed.lines_lost |= log.lines_lost;
            self.end = log.end.or(self.end);
            if log.data.is_empty() {
                return Ok(followed);
            }
            self.partial.extend_from_slice(&log.data);
            let whole = self.partial.iter().rposition(|b| *b == b'\n').map_or(0, |end| end + 1);
            let lines: Vec<u8> = self.partial.drain(..whole).collect();
            let text = String::from_utf8_lossy(&lines);
            match &mut self.task {
                Some(task) => followed.text.push_str(&task.keep(&text)),
                None => followed.text.push_str(&text),
            }
        }
    }
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
        let reply = NodeManagerServiceClient::new(channel.clone())
            .read_worker_log(request.clone())
            .await;
        let log = reply.map_err(raylet_proto::Error::from)?.into_inner();
        if !log.found {
            continue;
        }
        let text = String::from_utf8_lossy(&log.data).into_owned();
        let mut task = task.map(TaskLines::of);
        let text = match &mut task {
            Some(task) => task.keep(&text),
            None => text,
        };
        return Ok(WorkerLogText {
            node_id: candidate.node_id,
            file: log.file,
            text,
            truncated: log.size > log.data.len() as u64,
            follower: LogFollower {
                node: NodeManagerServiceClient::new(channel),
                request,
                end: log.end,
                partial: Vec::new(),
                task,
            },
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
        follow_from: None,
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

/// Keeps the lines of one task: those between its start and end markers.
#[derive(Clone, Debug)]
struct TaskLines {
    task: String,
    /// Whether the lines read last were inside the task's markers.
    inside: bool,
}

impl TaskLines {
    fn of(task: TaskId) -> Self {
        TaskLines {
            task: task.to_string(),
            inside: false,
        }
    }

    /// The task's lines in `text`, which follows the text read before.
    fn keep(&mut self, text: &str) -> String {
        let mut kept = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(TASK_START) {
                self.inside = rest.split_whitespace().next() == Some(self.task.as_str());
                continue;
            }
            if line.starts_with(TASK_END) {
                self.inside = false;
                continue;
            }
            if self.inside {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_lines_are_those_between_its_markers_also_when_read_in_pieces() {
        let lines = |task: &str| TaskLines {
            task: task.to_string(),
            inside: false,
        };
        let text = "startup\n:task_start: aa f\none\n:task_end: aa\n:task_start: bb g\nother\n\
                    :task_end: bb\n:task_start: aa f\ntwo\n";
        assert_eq!(lines("aa").keep(text), "one\ntwo\n");
        assert_eq!(lines("bb").keep(text), "other\n");
        assert_eq!(lines("cc").keep(text), "");
        let mut followed = lines("aa");
        assert_eq!(followed.keep("x\n:task_start: aa f\none\n"), "one\n");
        assert_eq!(followed.keep("two\n:task_end: aa\nthree\n"), "two\n");
    }
}
