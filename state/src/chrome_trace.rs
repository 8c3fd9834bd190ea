//! `raylet timeline`: the recorded task runs and timeline spans as a Chrome
//! trace (`chrome://tracing`, Perfetto), one process row per node and one
//! thread row per worker process, as Ray's timeline draws them.

use std::collections::{BTreeMap, HashSet};

use raylet_common::auth::AuthToken;
use raylet_proto::v1::Span;
use raylet_proto::{JobId, NodeId};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::Result;
use crate::tasks::{TaskInfo, list_spans, list_tasks};

/// A Chrome trace: its events and what went into them.
#[derive(Debug, Serialize)]
pub struct ChromeTrace {
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<Value>,
    #[serde(rename = "displayTimeUnit")]
    pub display_time_unit: &'static str,
    /// Task runs drawn from task records alone: their jobs ran without
    /// the timeline on, so the phases inside them are missing.
    #[serde(skip)]
    pub runs_without_spans: usize,
    /// Task runs drawn in all.
    #[serde(skip)]
    pub task_runs: usize,
}

/// The trace of `job` (every job when `None`) from the head at `head`.
pub async fn chrome_trace(head: &str, token: &AuthToken, job: Option<JobId>) -> Result<ChromeTrace> {
    let tasks = list_tasks(head, token, job, u32::MAX).await?.tasks;
    let spans = list_spans(head, token, job).await?;
    Ok(build(&tasks, spans))
}

/// Rows of the trace: a number per node, named in metadata events.
#[derive(Default)]
struct Rows {
    nodes: BTreeMap<Vec<u8>, u32>,
    workers: HashSet<(u32, u32)>,
    events: Vec<Value>,
}

impl Rows {
    /// The trace's process number of a node, and a name event for a new one.
    fn node(&mut self, node: &[u8]) -> u32 {
        if let Some(number) = self.nodes.get(node) {
            return *number;
        }
        let number = self.nodes.len() as u32 + 1;
        self.nodes.insert(node.to_vec(), number);
        let name = match NodeId::from_wire(node) {
            Ok(id) => format!("node {}", id.short()),
            Err(_) => "driver".to_string(),
        };
        self.events
            .push(json!({"name": "process_name", "ph": "M", "pid": number, "args": {"name": name}}));
        number
    }

    fn worker(&mut self, node: u32, pid: u32) {
        if self.workers.insert((node, pid)) {
            let name = format!("worker {pid}");
            self.events
                .push(json!({"name": "thread_name", "ph": "M", "pid": node, "tid": pid, "args": {"name": name}}));
        }
    }

    fn complete(&mut self, event: CompleteEvent<'_>) {
        let node = self.node(event.node);
        self.worker(node, event.pid);
        self.events.push(json!({
            "name": event.name,
            "cat": event.category,
            "ph": "X",
            "ts": event.start_micros,
            "dur": event.end_micros.saturating_sub(event.start_micros),
            "pid": node,
            "tid": event.pid,
            "args": event.args,
        }));
    }
}

/// A span with a start and an end ("X" in Chrome's format).
struct CompleteEvent<'a> {
    name: &'a str,
    category: &'a str,
    node: &'a [u8],
    pid: u32,
    start_micros: u64,
    end_micros: u64,
    args: Value,
}

/// Spans as recorded; task runs that have no span of their own are drawn
/// from their task records.
fn build(tasks: &[TaskInfo], spans: Vec<Span>) -> ChromeTrace {
    let mut rows = Rows::default();
    let spanned: HashSet<(Vec<u8>, String)> = spans
        .iter()
        .filter(|span| !span.task_id.is_empty())
        .map(|span| {
            (
                span.task_id.clone(),
                span.args.get("attempt").cloned().unwrap_or_default(),
            )
        })
        .collect();
    let mut task_runs = spanned.len();
    for span in &spans {
        rows.complete(CompleteEvent {
            name: &span.name,
            category: &span.category,
            node: &span.node_id,
            pid: span.pid,
            start_micros: span.start_unix_micros,
            end_micros: span.end_unix_micros,
            args: json!(span.args),
        });
    }
    let mut runs_without_spans = 0;
    for task in tasks {
        let (Some(start), Some(end)) = (task.start_ms, task.end_ms) else {
            continue;
        };
        let key = (task.task_id.as_bytes().to_vec(), task.attempt.to_string());
        if spanned.contains(&key) {
            continue;
        }
        runs_without_spans += 1;
        task_runs += 1;
        let node = task.node_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
        let category = match task.is_actor_call() {
            true => "actor_task",
            false => "task",
        };
        let mut args = json!({"task_id": task.task_id.to_string(), "attempt": task.attempt, "state": task.state});
        if let Some(items) = task.items_yielded {
            args["items"] = json!(items);
        }
        rows.complete(CompleteEvent {
            name: &task.name,
            category,
            node: &node,
            pid: task.worker_pid.unwrap_or_default(),
            start_micros: (start * 1000.0) as u64,
            end_micros: (end * 1000.0) as u64,
            args,
        });
    }
    ChromeTrace {
        trace_events: rows.events,
        display_time_unit: "ms",
        runs_without_spans,
        task_runs,
    }
}
