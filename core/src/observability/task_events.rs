//! What this process tells the head about tasks: the state changes of the
//! tasks and actor calls it owns, the tasks it runs that run for a while,
//! and the timeline spans its callees send back; with them, the metrics it
//! recorded (`raylet::metrics`). Events gather in a bounded
//! buffer that a background task sends to the head once a second, and once
//! more when the process shuts down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use raylet_proto::v1::task_event_service_client::TaskEventServiceClient;
use raylet_proto::v1::{ReportTaskEventsRequest, Span, TaskEvent, TaskKind, TaskState};
use raylet_proto::{ActorId, JobId, NodeId, TaskId, WorkerId};

use crate::context::Context;
use crate::observability::timeline::unix_micros;

/// How often buffered events go to the head.
const FLUSH_PERIOD: Duration = Duration::from_secs(1);
/// Most events held between two flushes; more are counted as dropped.
const MAX_BUFFERED: usize = 100_000;
/// A task a worker runs is reported as running once it ran this long.
const RUNNING_AFTER: Duration = Duration::from_millis(500);

/// What a task is, as its owner first reports it.
pub(crate) struct TaskIdentity<'a> {
    pub(crate) task_id: TaskId,
    pub(crate) attempt: u32,
    pub(crate) function: &'a str,
    pub(crate) kind: TaskKind,
    pub(crate) actor_id: Option<ActorId>,
}

/// Where a task was sent.
pub(crate) struct Placement {
    pub(crate) node_id: Option<NodeId>,
    pub(crate) worker_id: Option<WorkerId>,
    pub(crate) pid: u32,
}

/// How a task's attempt ended, as its worker said.
pub(crate) struct Ending<'a> {
    pub(crate) failed: Option<&'a str>,
    pub(crate) start_unix_micros: u64,
    pub(crate) run_micros: u64,
}

impl<'a> Ending<'a> {
    /// An attempt that failed before its worker could say how it went.
    pub(crate) fn failed(reason: &'a str) -> Self {
        Ending {
            failed: Some(reason),
            start_unix_micros: 0,
            run_micros: 0,
        }
    }
}

/// A task this worker runs now.
struct RunningTask {
    attempt: u32,
    job_id: Vec<u8>,
    started: std::time::Instant,
    start_unix_micros: u64,
    reported: bool,
}

#[derive(Default)]
struct Buffer {
    tasks: Vec<TaskEvent>,
    spans: Vec<Span>,
    dropped: u64,
    /// Items that generators' callers received, by task and attempt: the
    /// latest count of each goes out with the next flush.
    yielded: HashMap<(TaskId, u32), u64>,
}

/// The process's task events on their way to the head.
pub(crate) struct TaskEvents {
    buffer: Mutex<Buffer>,
    running: Mutex<HashMap<TaskId, RunningTask>>,
    /// The job that tasks submitted from here belong to: the driver's, or in
    /// a worker the job of the task it ran last.
    job: Mutex<JobId>,
    enabled: bool,
    /// Held while a batch is on its way, so the last flush at shutdown
    /// waits for a periodic one in flight.
    sending: tokio::sync::Mutex<()>,
}

impl TaskEvents {
    pub(crate) fn new(job: JobId, enabled: bool) -> Self {
        TaskEvents {
            buffer: Mutex::default(),
            running: Mutex::default(),
            job: Mutex::new(job),
            enabled,
            sending: tokio::sync::Mutex::new(()),
        }
    }

    fn buffer(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn running(&self) -> MutexGuard<'_, HashMap<TaskId, RunningTask>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn job(&self) -> JobId {
        *self.job.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// In a worker: the job and timeline setting of the task it starts,
    /// which the tasks it submits inherit.
    pub(crate) fn adopt(&self, job: &[u8], timeline: bool) {
        if let Ok(job) = JobId::from_wire(job) {
            *self.job.lock().unwrap_or_else(|p| p.into_inner()) = job;
            crate::observability::timeline::set_job(job);
        }
        crate::observability::timeline::set_on(timeline);
    }

    fn push(&self, event: TaskEvent) {
        if !self.enabled {
            return;
        }
        let mut buffer = self.buffer();
        match buffer.tasks.len() < MAX_BUFFERED {
            true => buffer.tasks.push(event),
            false => buffer.dropped += 1,
        }
    }

    /// The owner took a task in: it waits for its arguments or a worker.
    pub(crate) fn submitted(&self, task: TaskIdentity<'_>, waits_for_args: bool) {
        let state = match waits_for_args {
            true => TaskState::PendingArgsAvail,
            false => TaskState::PendingNodeAssignment,
        };
        let mut event = TaskEvent {
            task_id: task.task_id.as_bytes().to_vec(),
            attempt: task.attempt,
            job_id: self.job().as_bytes().to_vec(),
            function: task.function.to_string(),
            kind: task.kind as i32,
            unix_micros: unix_micros(),
            actor_id: task.actor_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default(),
            ..TaskEvent::default()
        };
        event.set_state(state);
        self.push(event);
    }

    /// The owner sent a task to a worker.
    pub(crate) fn dispatched(&self, task_id: TaskId, attempt: u32, placement: &Placement) {
        let mut event = state_event(task_id, attempt, TaskState::SubmittedToWorker);
        event.node_id = placement.node_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
        event.worker_id = placement.worker_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
        event.worker_pid = placement.pid;
        self.push(event);
    }

    /// The owner learnt how a task's attempt ended.
    pub(crate) fn ended(&self, task_id: TaskId, attempt: u32, ending: Ending<'_>) {
        let state = match ending.failed {
            Some(_) => TaskState::Failed,
            None => TaskState::Finished,
        };
        let mut event = state_event(task_id, attempt, state);
        event.error = ending.failed.unwrap_or_default().to_string();
        if ending.start_unix_micros != 0 {
            event.start_unix_micros = ending.start_unix_micros;
            event.end_unix_micros = ending.start_unix_micros + ending.run_micros;
        }
        self.push(event);
    }

    /// A generator's caller received its `count`th item.
    pub(crate) fn yielded(&self, task_id: TaskId, attempt: u32, count: u64) {
        if self.enabled {
            self.buffer().yielded.insert((task_id, attempt), count);
        }
    }

    /// Timeline spans that a callee sent back with a result.
    pub(crate) fn spans(&self, spans: Vec<Span>) {
        if spans.is_empty() || !self.enabled {
            return;
        }
        let mut buffer = self.buffer();
        let room = MAX_BUFFERED.saturating_sub(buffer.spans.len());
        let lost = spans.len().saturating_sub(room);
        buffer.spans.extend(spans.into_iter().take(room));
        buffer.dropped += lost as u64;
    }

    /// In a worker: a task starts running here.
    pub(crate) fn started(&self, task_id: TaskId, attempt: u32, job_id: &[u8], start_unix_micros: u64) {
        let task = RunningTask {
            attempt,
            job_id: job_id.to_vec(),
            started: std::time::Instant::now(),
            start_unix_micros,
            reported: false,
        };
        self.running().insert(task_id, task);
    }

    /// In a worker: a task stopped running here.
    pub(crate) fn stopped(&self, task_id: TaskId) {
        self.running().remove(&task_id);
    }

    /// Reports the tasks running here for a while that are not reported yet.
    fn report_long_running(&self, placement: &Placement) {
        let mut running = self.running();
        for (task_id, task) in running.iter_mut() {
            if task.reported || task.started.elapsed() < RUNNING_AFTER {
                continue;
            }
            task.reported = true;
            let mut event = state_event(*task_id, task.attempt, TaskState::Running);
            event.job_id = task.job_id.clone();
            event.start_unix_micros = task.start_unix_micros;
            event.node_id = placement.node_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
            event.worker_id = placement.worker_id.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
            event.worker_pid = placement.pid;
            self.push(event);
        }
    }

    fn take(&self) -> Option<ReportTaskEventsRequest> {
        let metrics = crate::observability::metrics::take_updates();
        let mut buffer = self.buffer();
        let yielded = std::mem::take(&mut buffer.yielded);
        buffer
            .tasks
            .extend(yielded.into_iter().map(|((task_id, attempt), count)| TaskEvent {
                items_yielded: count,
                ..state_event(task_id, attempt, TaskState::Unspecified)
            }));
        if buffer.tasks.is_empty() && buffer.spans.is_empty() && buffer.dropped == 0 && metrics.is_empty() {
            return None;
        }
        let taken = std::mem::take(&mut *buffer);
        Some(ReportTaskEventsRequest {
            tasks: taken.tasks,
            spans: taken.spans,
            dropped: taken.dropped,
            metrics,
        })
    }

    /// Sends what is buffered to the head; a batch the head cannot take is
    /// dropped and counted in the next one.
    pub(crate) async fn flush(&self, ctx: &Context) {
        let _sending = self.sending.lock().await;
        let Some(batch) = self.take() else {
            return;
        };
        let events = batch.tasks.len() + batch.spans.len();
        let sent = async {
            let channel = ctx.channel(&ctx.head_address).await?;
            TaskEventServiceClient::new(channel)
                .report_task_events(batch)
                .await
                .map_err(raylet_proto::Error::from)?;
            Ok::<_, crate::Error>(())
        };
        if let Err(error) = sent.await {
            tracing::debug!(%error, events, "task events could not reach the head");
            self.buffer().dropped += events as u64;
        }
    }
}

fn state_event(task_id: TaskId, attempt: u32, state: TaskState) -> TaskEvent {
    let mut event = TaskEvent {
        task_id: task_id.as_bytes().to_vec(),
        attempt,
        unix_micros: unix_micros(),
        ..TaskEvent::default()
    };
    event.set_state(state);
    event
}

/// Flushes `events` once a second, for as long as the
/// process runs; `placement` says where this process is, for the tasks it
/// runs.
pub(crate) async fn keep_flushing(ctx: Arc<Context>, events: Arc<TaskEvents>, placement: Placement) {
    let mut ticker = tokio::time::interval(FLUSH_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        events.report_long_running(&placement);
        events.flush(&ctx).await;
    }
}
