//! The head's record of tasks: it merges the events that owners and workers
//! report into one record per task attempt, keeps the timeline's spans,
//! counts tasks by state and their scheduling latency for `/metrics`, and
//! takes the metrics that came with the reports. All
//! of it lives in memory, up to a bound; the oldest finished records go
//! first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};
use raylet_common::metrics::{self, LATENCY_BUCKETS};
use raylet_proto::v1::task_event_service_server::TaskEventService;
use raylet_proto::v1::{
    ListSpansReply, ListSpansRequest, ListTasksReply, ListTasksRequest, ReportTaskEventsReply, ReportTaskEventsRequest,
    Span, TaskEvent, TaskRecord, TaskState,
};
use tonic::{Request, Response, Status};

use super::pushed_metrics::PushedMetrics;

/// Most task attempts the head keeps (Ray keeps 100,000 too).
pub const MAX_TASK_RECORDS: usize = 100_000;
/// Most timeline spans the head keeps.
pub const MAX_SPANS: usize = 200_000;
/// The largest report the head decodes: a process's full second of
/// events (100,000 of each kind) fits.
pub const MAX_REPORT_BYTES: usize = 64 << 20;
/// Most records a listing returns when the caller sets no limit.
const DEFAULT_LIST_LIMIT: usize = 10_000;

static TASKS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    metrics::gauge(
        "raylet_tasks",
        "Tasks and actor calls by state and function",
        &["state", "function"],
    )
});
static SCHEDULING_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    metrics::histogram(
        "raylet_task_scheduling_latency_seconds",
        "Time from a task's submission (its arguments ready) to its dispatch to a leased worker",
        &[],
        LATENCY_BUCKETS,
    )
});
static EVENTS_DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    metrics::counter(
        "raylet_task_events_dropped_total",
        "Task events lost to full buffers, by where",
        &["where"],
    )
});

/// One attempt of a task.
type AttemptKey = (Vec<u8>, u32);

/// Every recorded task attempt and span.
#[derive(Default)]
pub struct TaskTable {
    metrics: PushedMetrics,
    records: HashMap<AttemptKey, TaskRecord>,
    /// Attempts in the order they were first seen: eviction goes from the front.
    arrival: VecDeque<AttemptKey>,
    spans: VecDeque<Span>,
    dropped: u64,
}

impl TaskTable {
    /// Merges one reporter's batch.
    pub fn report(&mut self, batch: ReportTaskEventsRequest) {
        if batch.dropped > 0 {
            EVENTS_DROPPED.with_label_values(&["reporter"]).inc_by(batch.dropped);
            self.dropped += batch.dropped;
        }
        for event in batch.tasks {
            self.apply(event);
        }
        for update in batch.metrics {
            self.metrics.apply(update);
        }
        for span in batch.spans {
            if self.spans.len() >= MAX_SPANS {
                self.spans.pop_front();
                self.count_evicted();
            }
            self.spans.push_back(span);
        }
        self.evict();
    }

    fn apply(&mut self, event: TaskEvent) {
        let key = (event.task_id.clone(), event.attempt);
        let record = self.records.entry(key.clone()).or_insert_with(|| {
            self.arrival.push_back(key);
            TaskRecord {
                task_id: event.task_id.clone(),
                attempt: event.attempt,
                ..TaskRecord::default()
            }
        });
        merge(record, event);
    }

    /// Drops the oldest records beyond the bound: finished ones first, then,
    /// when unfinished ones alone exceed it (a driver that queued a million
    /// tasks), the oldest of those too, so the table's memory stays bounded.
    /// A later event of a dropped task starts its record again.
    fn evict(&mut self) {
        let mut passes = self.arrival.len();
        while self.records.len() > MAX_TASK_RECORDS && passes > 0 {
            passes -= 1;
            let Some(key) = self.arrival.pop_front() else {
                return;
            };
            let finished = self.records.get(&key).is_none_or(|r| is_terminal(r.state()));
            match finished {
                true => self.drop_record(&key),
                false => self.arrival.push_back(key),
            }
        }
        while self.records.len() > MAX_TASK_RECORDS {
            let Some(key) = self.arrival.pop_front() else {
                return;
            };
            self.drop_record(&key);
        }
    }

    fn drop_record(&mut self, key: &AttemptKey) {
        if self.records.remove(key).is_some() {
            self.count_evicted();
        }
    }

    fn count_evicted(&mut self) {
        EVENTS_DROPPED.with_label_values(&["head"]).inc();
        self.dropped += 1;
    }

    /// The records of `job` (every job when `None`), newest first, at most
    /// `limit`; and how many matched.
    pub fn list(&self, job: Option<&[u8]>, limit: usize) -> (Vec<TaskRecord>, usize) {
        let matching = self
            .arrival
            .iter()
            .rev()
            .filter_map(|key| self.records.get(key))
            .filter(|record| job.is_none_or(|job| record.job_id == job));
        let mut total = 0;
        let mut records = Vec::new();
        for record in matching {
            total += 1;
            if records.len() < limit {
                records.push(record.clone());
            }
        }
        (records, total)
    }

    /// The spans of `job` (every job when `None`), oldest first.
    pub fn spans(&self, job: Option<&[u8]>) -> Vec<Span> {
        self.spans
            .iter()
            .filter(|span| job.is_none_or(|job| span.job_id == job))
            .cloned()
            .collect()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Folds an event into its attempt's record. States only move forward, as
/// events from the owner and the worker may arrive in either order; a
/// finished or failed attempt stays so.
fn merge(record: &mut TaskRecord, event: TaskEvent) {
    let state = event.state();
    fill(&mut record.job_id, event.job_id);
    fill(&mut record.node_id, event.node_id);
    fill(&mut record.worker_id, event.worker_id);
    fill(&mut record.actor_id, event.actor_id);
    if record.function.is_empty() {
        record.function = event.function;
        record.kind = event.kind;
    }
    if event.worker_pid != 0 {
        record.worker_pid = event.worker_pid;
    }
    if event.start_unix_micros != 0 {
        record.start_unix_micros = event.start_unix_micros;
    }
    if event.end_unix_micros != 0 {
        record.end_unix_micros = event.end_unix_micros;
    }
    match state {
        TaskState::PendingArgsAvail | TaskState::PendingNodeAssignment if record.submitted_unix_micros == 0 => {
            record.submitted_unix_micros = event.unix_micros;
        }
        TaskState::SubmittedToWorker if record.scheduled_unix_micros == 0 => {
            record.scheduled_unix_micros = event.unix_micros;
            if record.submitted_unix_micros != 0 {
                let waited = event.unix_micros.saturating_sub(record.submitted_unix_micros);
                SCHEDULING_SECONDS
                    .with_label_values(&[] as &[&str])
                    .observe(waited as f64 / 1e6);
            }
        }
        _ => {}
    }
    if !event.error.is_empty() {
        record.error = event.error;
    }
    record.items_yielded = record.items_yielded.max(event.items_yielded);
    let old = record.state();
    if state as i32 > old as i32 && !is_terminal(old) {
        if old != TaskState::Unspecified {
            TASKS.with_label_values(&[old.as_str_name(), &record.function]).dec();
        }
        TASKS.with_label_values(&[state.as_str_name(), &record.function]).inc();
        record.set_state(state);
    }
}

fn fill(slot: &mut Vec<u8>, value: Vec<u8>) {
    if !value.is_empty() {
        *slot = value;
    }
}

pub fn is_terminal(state: TaskState) -> bool {
    matches!(state, TaskState::Finished | TaskState::Failed)
}

/// Serves [`TaskEventService`] over a shared [`TaskTable`].
pub(crate) struct TaskEventServiceImpl {
    pub(crate) table: Arc<Mutex<TaskTable>>,
}

impl TaskEventServiceImpl {
    fn table(&self) -> MutexGuard<'_, TaskTable> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[tonic::async_trait]
impl TaskEventService for TaskEventServiceImpl {
    async fn report_task_events(
        &self,
        request: Request<ReportTaskEventsRequest>,
    ) -> Result<Response<ReportTaskEventsReply>, Status> {
        self.table().report(request.into_inner());
        Ok(Response::new(ReportTaskEventsReply {}))
    }

    async fn list_tasks(&self, request: Request<ListTasksRequest>) -> Result<Response<ListTasksReply>, Status> {
        let request = request.into_inner();
        let job = (!request.job_id.is_empty()).then_some(request.job_id.as_slice());
        let limit = match request.limit {
            0 => DEFAULT_LIST_LIMIT,
            limit => limit as usize,
        };
        let table = self.table();
        let (tasks, total) = table.list(job, limit);
        Ok(Response::new(ListTasksReply {
            tasks,
            total: total as u64,
            dropped: table.dropped(),
        }))
    }

    async fn list_spans(&self, request: Request<ListSpansRequest>) -> Result<Response<ListSpansReply>, Status> {
        let request = request.into_inner();
        let job = (!request.job_id.is_empty()).then_some(request.job_id.as_slice());
        let table = self.table();
        Ok(Response::new(ListSpansReply {
            spans: table.spans(job),
            dropped: table.dropped(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(task: u8, state: TaskState, micros: u64) -> TaskEvent {
        let mut event = TaskEvent {
            task_id: vec![task; 16],
            function: "demo::work".into(),
            unix_micros: micros,
            ..TaskEvent::default()
        };
        event.set_state(state);
        event
    }

    fn report(table: &mut TaskTable, events: Vec<TaskEvent>) {
        table.report(ReportTaskEventsRequest {
            tasks: events,
            ..Default::default()
        });
    }

    #[test]
    fn events_in_any_order_merge_into_one_record_whose_state_only_moves_forward() {
        let mut table = TaskTable::default();
        let mut finished = event(1, TaskState::Finished, 30);
        finished.start_unix_micros = 20;
        finished.end_unix_micros = 30;
        let mut running = event(1, TaskState::Running, 20);
        running.worker_pid = 42;
        report(
            &mut table,
            vec![event(1, TaskState::PendingNodeAssignment, 10), finished],
        );
        report(&mut table, vec![running, event(1, TaskState::SubmittedToWorker, 15)]);
        let (records, total) = table.list(None, 10);
        assert_eq!(total, 1);
        let record = &records[0];
        assert_eq!(record.state(), TaskState::Finished);
        assert_eq!(record.worker_pid, 42);
        assert_eq!((record.submitted_unix_micros, record.scheduled_unix_micros), (10, 15));
        assert_eq!((record.start_unix_micros, record.end_unix_micros), (20, 30));
    }

    #[test]
    fn the_bound_evicts_the_oldest_finished_records_and_keeps_unfinished_ones() {
        let mut table = TaskTable::default();
        let mut first = event(0, TaskState::Running, 1);
        first.task_id = u64::MAX.to_le_bytes().to_vec();
        report(&mut table, vec![first]);
        let finished = (0..MAX_TASK_RECORDS as u64 + 5).map(|i| TaskEvent {
            task_id: i.to_le_bytes().to_vec(),
            state: TaskState::Finished as i32,
            ..TaskEvent::default()
        });
        report(&mut table, finished.collect());
        let (_, total) = table.list(None, 0);
        assert_eq!(total, MAX_TASK_RECORDS);
        assert_eq!(table.dropped(), 6);
        assert!(table.records.contains_key(&(u64::MAX.to_le_bytes().to_vec(), 0)));
    }

    #[test]
    fn unfinished_records_beyond_the_bound_go_oldest_first() {
        let mut table = TaskTable::default();
        let queued = (0..MAX_TASK_RECORDS as u64 + 3).map(|i| TaskEvent {
            task_id: i.to_le_bytes().to_vec(),
            state: TaskState::PendingNodeAssignment as i32,
            ..TaskEvent::default()
        });
        report(&mut table, queued.collect());
        assert_eq!(table.list(None, 0).1, MAX_TASK_RECORDS);
        assert_eq!(table.dropped(), 3);
        assert!(!table.records.contains_key(&(0u64.to_le_bytes().to_vec(), 0)));
        assert!(table.records.contains_key(&(3u64.to_le_bytes().to_vec(), 0)));
    }

    #[test]
    fn listing_filters_by_job_and_returns_the_newest_first() {
        let mut table = TaskTable::default();
        for task in 1..=3 {
            let mut submitted = event(task, TaskState::PendingNodeAssignment, task as u64);
            submitted.job_id = vec![task % 2; 16];
            report(&mut table, vec![submitted]);
        }
        let (records, total) = table.list(Some(&[1; 16]), 1);
        assert_eq!(total, 2);
        assert_eq!(records[0].task_id, vec![3; 16]);
    }
}
