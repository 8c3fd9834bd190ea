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
/// Most task events sent to the head in one message: a flush of a full
/// buffer goes out in ten, each made as the one before has gone.
const EVENTS_PER_BATCH: usize = 10_000;
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

/// A task's change of state as buffered: its message is made only when
/// it goes out, so that a full buffer of [`MAX_BUFFERED`] holds about
/// 10 MiB, not 35.
struct BufferedEvent {
    task_id: TaskId,
    attempt: u32,
    /// When the task's state changed.
    unix_micros: u64,
    change: Change,
}

enum Change {
    Submitted {
        state: TaskState,
        job: JobId,
        function: Box<str>,
        kind: TaskKind,
        actor: Option<ActorId>,
    },
    Dispatched {
        node: Option<NodeId>,
        worker: Option<WorkerId>,
        pid: u32,
    },
    Ended {
        error: Option<Box<str>>,
        start_unix_micros: u64,
        end_unix_micros: u64,
    },
    /// A rarer event, as its message.
    Other(Box<TaskEvent>),
}

impl BufferedEvent {
    fn new(task_id: TaskId, attempt: u32, change: Change) -> Self {
        BufferedEvent {
            task_id,
            attempt,
            unix_micros: unix_micros(),
            change,
        }
    }

    fn into_message(self) -> TaskEvent {
        let mut event = TaskEvent {
            task_id: self.task_id.as_bytes().to_vec(),
            attempt: self.attempt,
            unix_micros: self.unix_micros,
            ..TaskEvent::default()
        };
        match self.change {
            Change::Submitted {
                state,
                job,
                function,
                kind,
                actor,
            } => {
                event.set_state(state);
                event.job_id = job.as_bytes().to_vec();
                event.function = function.into();
                event.set_kind(kind);
                event.actor_id = actor.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
            }
            Change::Dispatched { node, worker, pid } => {
                event.set_state(TaskState::SubmittedToWorker);
                event.node_id = node.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
                event.worker_id = worker.map(|id| id.as_bytes().to_vec()).unwrap_or_default();
                event.worker_pid = pid;
            }
            Change::Ended {
                error,
                start_unix_micros,
                end_unix_micros,
            } => {
                event.set_state(match error {
                    Some(_) => TaskState::Failed,
                    None => TaskState::Finished,
                });
                event.error = error.map(String::from).unwrap_or_default();
                event.start_unix_micros = start_unix_micros;
                event.end_unix_micros = end_unix_micros;
            }
            Change::Other(message) => return *message,
        }
        event
    }
}

#[derive(Default)]
struct Buffer {
    tasks: Vec<BufferedEvent>,
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

    fn push(&self, event: BufferedEvent) {
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
        let change = Change::Submitted {
            state: match waits_for_args {
                true => TaskState::PendingArgsAvail,
                false => TaskState::PendingNodeAssignment,
            },
            job: self.job(),
            function: task.function.into(),
            kind: task.kind,
            actor: task.actor_id,
        };
        self.push(BufferedEvent::new(task.task_id, task.attempt, change));
    }

    /// The owner sent a task to a worker.
    pub(crate) fn dispatched(&self, task_id: TaskId, attempt: u32, placement: &Placement) {
        let change = Change::Dispatched {
            node: placement.node_id,
            worker: placement.worker_id,
            pid: placement.pid,
        };
        self.push(BufferedEvent::new(task_id, attempt, change));
    }

    /// The owner learnt how a task's attempt ended.
    pub(crate) fn ended(&self, task_id: TaskId, attempt: u32, ending: Ending<'_>) {
        let ran = ending.start_unix_micros != 0;
        let change = Change::Ended {
            error: ending.failed.map(Box::from),
            start_unix_micros: ending.start_unix_micros,
            end_unix_micros: if ran {
                ending.start_unix_micros + ending.run_micros
            } else {
                0
            },
        };
        self.push(BufferedEvent::new(task_id, attempt, change));
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
            self.push(BufferedEvent::new(
                *task_id,
                task.attempt,
                Change::Other(Box::new(event)),
            ));
        }
    }

    /// What is buffered, as the batches that carry it to the head: the
    /// first with the spans, the count dropped and the metrics, each with
    /// at most [`EVENTS_PER_BATCH`] task events, made one at a time as they
    /// are sent.
    fn take(&self) -> Option<impl Iterator<Item = ReportTaskEventsRequest> + use<>> {
        let metrics = crate::observability::metrics::take_updates();
        let mut buffer = self.buffer();
        let yielded = std::mem::take(&mut buffer.yielded);
        buffer
            .tasks
            .extend(yielded.into_iter().map(|((task_id, attempt), count)| {
                let event = TaskEvent {
                    items_yielded: count,
                    ..state_event(task_id, attempt, TaskState::Unspecified)
                };
                BufferedEvent::new(task_id, attempt, Change::Other(Box::new(event)))
            }));
        if buffer.tasks.is_empty() && buffer.spans.is_empty() && buffer.dropped == 0 && metrics.is_empty() {
            return None;
        }
        let taken = std::mem::take(&mut *buffer);
        let mut first = Some(ReportTaskEventsRequest {
            tasks: Vec::new(),
            spans: taken.spans,
            dropped: taken.dropped,
            metrics,
        });
        let mut tasks = taken.tasks.into_iter().peekable();
        Some(std::iter::from_fn(move || {
            if first.is_none() && tasks.peek().is_none() {
                return None;
            }
            let mut batch = first.take().unwrap_or_default();
            batch.tasks = tasks
                .by_ref()
                .take(EVENTS_PER_BATCH)
                .map(BufferedEvent::into_message)
                .collect();
            Some(batch)
        }))
    }

    /// Sends what is buffered to the head; what the head cannot take is
    /// dropped and counted in the next flush.
    pub(crate) async fn flush(&self, ctx: &Context) {
        let _sending = self.sending.lock().await;
        let Some(batches) = self.take() else {
            return;
        };
        let mut head_lost = false;
        for batch in batches {
            let events = (batch.tasks.len() + batch.spans.len()) as u64;
            if !head_lost {
                match report(ctx, batch).await {
                    Ok(()) => continue,
                    Err(error) => {
                        tracing::debug!(%error, events, "task events could not reach the head");
                        head_lost = true;
                    }
                }
            }
            self.buffer().dropped += events;
        }
    }
}

async fn report(ctx: &Context, batch: ReportTaskEventsRequest) -> crate::Result<()> {
    let channel = ctx.channel(&ctx.head_address).await?;
    TaskEventServiceClient::new(channel)
        .report_task_events(batch)
        .await
        .map_err(raylet_proto::Error::from)?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffered_event_is_small_and_becomes_the_message_it_stands_for() {
        assert!(
            std::mem::size_of::<BufferedEvent>() <= 96,
            "{}",
            std::mem::size_of::<BufferedEvent>()
        );
        let events = TaskEvents::new(JobId::random(), true);
        let task_id = TaskId::random();
        let identity = TaskIdentity {
            task_id,
            attempt: 0,
            function: "tests::work",
            kind: TaskKind::NormalTask,
            actor_id: None,
        };
        events.submitted(identity, false);
        let placement = Placement {
            node_id: Some(NodeId::random()),
            worker_id: None,
            pid: 7,
        };
        events.dispatched(task_id, 0, &placement);
        let ending = Ending {
            failed: None,
            start_unix_micros: 100,
            run_micros: 5,
        };
        events.ended(task_id, 0, ending);
        events.ended(task_id, 1, Ending::failed("its worker died"));
        let mut batches = events.take().expect("four events");
        let sent = batches.next().expect("one batch").tasks;
        assert!(batches.next().is_none(), "four events go in one batch");
        let states: Vec<TaskState> = sent.iter().map(TaskEvent::state).collect();
        assert_eq!(
            states,
            [
                TaskState::PendingNodeAssignment,
                TaskState::SubmittedToWorker,
                TaskState::Finished,
                TaskState::Failed
            ]
        );
        assert!(sent.iter().all(|event| event.task_id == task_id.as_bytes()));
        assert_eq!(sent[0].function, "tests::work");
        assert_eq!(sent[0].job_id, events.job().as_bytes());
        assert_eq!(sent[1].node_id, placement.node_id.unwrap().as_bytes());
        assert_eq!((sent[1].worker_pid, sent[1].worker_id.len()), (7, 0));
        assert_eq!((sent[2].start_unix_micros, sent[2].end_unix_micros), (100, 105));
        assert_eq!((sent[3].attempt, sent[3].error.as_str()), (1, "its worker died"));
        assert_eq!(sent[3].end_unix_micros, 0);
    }

    #[test]
    fn a_full_buffer_goes_out_in_batches_the_first_with_the_spans_and_the_count_dropped() {
        let events = TaskEvents::new(JobId::random(), true);
        for _ in 0..MAX_BUFFERED + 3 {
            events.ended(TaskId::random(), 0, Ending::failed("gone"));
        }
        events.spans(vec![Span::default()]);
        let batches: Vec<ReportTaskEventsRequest> = events.take().expect("events").collect();
        let sizes: Vec<usize> = batches.iter().map(|batch| batch.tasks.len()).collect();
        assert_eq!(sizes, vec![EVENTS_PER_BATCH; MAX_BUFFERED / EVENTS_PER_BATCH]);
        assert_eq!((batches[0].dropped, batches[0].spans.len()), (3, 1));
        assert!(
            batches[1..]
                .iter()
                .all(|batch| batch.dropped == 0 && batch.spans.is_empty())
        );
        assert!(events.take().is_none(), "the buffer is empty after");
    }
}
