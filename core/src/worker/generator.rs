//! Runs a generator on its worker: each item goes to the caller as soon as
//! it is made, as an object of its own, and the generator pauses while its
//! caller has `backpressure` items it has not taken. A retry makes the
//! items its caller has already but does not send them again.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{FutureExt, StreamExt};
use raylet_proto::task_stream::EventSender;
use raylet_proto::v1::{GeneratorCall, GeneratorItem, TaskSpec, WorkerEvents};
use raylet_proto::{IdMap, TaskId};
use tokio::sync::{Notify, mpsc};

use super::WorkerContext;
use super::hand_over::{hand_over, panic_error};
use crate::registry::{ItemOutcome, Items};
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{EncodedValue, outcome_to_proto};

/// Where the callers of this worker's running generators stand.
#[derive(Default)]
pub(crate) struct GeneratorGates {
    gates: Mutex<IdMap<TaskId, Arc<Gate>>>,
}

/// What a running generator learns from its caller.
#[derive(Default)]
struct Gate {
    consumed: AtomicU64,
    cancelled: AtomicBool,
    changed: Notify,
}

impl GeneratorGates {
    /// The caller of `task` took `consumed` items in all.
    pub(crate) fn ack(&self, task: TaskId, consumed: u64) {
        if let Some(gate) = self.gate(task) {
            gate.consumed.fetch_max(consumed, Ordering::AcqRel);
            gate.changed.notify_one();
        }
    }

    /// The caller of `task` cancelled it: it stops before its next item.
    pub(crate) fn cancel(&self, task: TaskId) {
        if let Some(gate) = self.gate(task) {
            gate.cancelled.store(true, Ordering::Release);
            gate.changed.notify_one();
        }
    }

    fn gate(&self, task: TaskId) -> Option<Arc<Gate>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner()).get(&task).cloned()
    }

    fn open(self: &Arc<Self>, task: TaskId, consumed: u64) -> OpenGate {
        let gate = Arc::new(Gate {
            consumed: AtomicU64::new(consumed),
            ..Gate::default()
        });
        self.gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(task, gate.clone());
        OpenGate {
            gates: self.clone(),
            task,
            gate,
        }
    }
}

/// A running generator's gate, closed when it ends.
struct OpenGate {
    gates: Arc<GeneratorGates>,
    task: TaskId,
    gate: Arc<Gate>,
}

impl OpenGate {
    fn cancelled(&self) -> bool {
        self.gate.cancelled.load(Ordering::Acquire)
    }

    /// Waits until item `index` may go: while fewer than `bound` items are
    /// not taken. Fails when the caller cancels.
    async fn room_for(&self, index: u64, bound: u64) -> Result<(), ()> {
        loop {
            let changed = self.gate.changed.notified();
            if self.cancelled() {
                return Err(());
            }
            if bound == 0 || index < self.gate.consumed.load(Ordering::Acquire) + bound {
                return Ok(());
            }
            changed.await;
        }
    }
}

impl Drop for OpenGate {
    fn drop(&mut self) {
        self.gates
            .gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.task);
    }
}

/// Runs a generator's items to its caller; its outcome is the number of
/// items it yielded, or the error that ended it after the items before.
pub(super) async fn run_items(
    context: &Arc<WorkerContext>,
    spec: &TaskSpec,
    items: Items,
    results: &EventSender,
) -> ItemOutcome {
    let task = TaskId::from_wire(&spec.task_id)
        .map_err(|e| TaskError::new(TaskErrorKind::Argument, &spec.function, e.to_string()))?;
    let gate = context
        .generators
        .open(task, spec.generator.as_ref().map_or(0, |call| call.consumed));
    let yielded = yield_all(context, spec, (task, &gate), items, results).await;
    context.take_cancelled(task);
    let count = yielded?;
    EncodedValue::encode(&count).map_err(|e| TaskError::new(TaskErrorKind::Application, &spec.function, e.to_string()))
}

/// Sends each item the caller wants, pausing at the gate before making it;
/// returns how many the generator yielded.
async fn yield_all(
    context: &Arc<WorkerContext>,
    spec: &TaskSpec,
    (task, gate): (TaskId, &OpenGate),
    items: Items,
    results: &EventSender,
) -> Result<u64, TaskError> {
    let call = spec.generator.clone().unwrap_or_default();
    let mut source = ItemSource::start(items, context, spec);
    let mut index = 0u64;
    loop {
        let wanted = wanted(&call, index);
        if wanted && gate.room_for(index, call.backpressure).await.is_err() {
            return Err(cancelled(spec, index));
        }
        let Some(item) = source.next(&spec.function).await else {
            return Ok(index);
        };
        let value = item?;
        if wanted {
            send_item(context, spec, (task, index), value, results).await?;
        }
        index += 1;
        if gate.cancelled() {
            return Err(cancelled(spec, index));
        }
    }
}

/// The items a generator call yielded, from its outcome; `None` for other calls.
pub(super) fn items_yielded(spec: &TaskSpec, outcome: &EncodedValue) -> Option<u64> {
    spec.generator.as_ref()?;
    crate::generator::table::items_in(outcome)
}

/// Whether item `index` goes to the caller on this run.
fn wanted(call: &GeneratorCall, index: u64) -> bool {
    match call.rebuild.is_empty() {
        true => index >= call.skip,
        false => call.rebuild.contains(&index),
    }
}

fn cancelled(spec: &TaskSpec, yielded: u64) -> TaskError {
    TaskError::new(
        TaskErrorKind::Cancelled,
        &spec.function,
        format!("the generator was cancelled after {yielded} items"),
    )
}

/// Readies item `index` as object `index + 1` of the task and sends it.
async fn send_item(
    context: &Arc<WorkerContext>,
    spec: &TaskSpec,
    (task, index): (TaskId, u64),
    value: EncodedValue,
    results: &EventSender,
) -> Result<(), TaskError> {
    let value = hand_over(context, spec, task.object_at(index + 1), value).await?;
    let item = GeneratorItem {
        task_id: spec.task_id.clone(),
        attempt: spec.attempt,
        index,
        item: Some(outcome_to_proto(&Ok(value), true)),
    };
    let events = WorkerEvents {
        items: vec![item],
        ..WorkerEvents::default()
    };
    results.send(&events).map_err(|_| {
        TaskError::new(
            TaskErrorKind::Cancelled,
            &spec.function,
            "the caller's stream closed while the generator ran",
        )
    })
}

/// Where a generator's items come from: an iterator advanced here (or, for
/// an actor whose calls run concurrently, on a thread that may block, so
/// that its other calls go on meanwhile), or a stream polled on the
/// worker's runtime one item ahead.
enum ItemSource {
    Iter(Box<dyn Iterator<Item = ItemOutcome> + Send>),
    BlockingIter(Option<Box<dyn Iterator<Item = ItemOutcome> + Send>>),
    Stream(mpsc::Receiver<ItemOutcome>),
}

impl ItemSource {
    fn start(items: Items, context: &WorkerContext, spec: &TaskSpec) -> Self {
        let shares_thread =
            !spec.actor_id.is_empty() && context.actor.get().is_some_and(|host| host.max_concurrency > 1);
        match items {
            Items::Iter(iter) if shares_thread => ItemSource::BlockingIter(Some(iter)),
            Items::Iter(iter) => ItemSource::Iter(iter),
            Items::Stream(mut stream) => {
                let (sender, receiver) = mpsc::channel(1);
                let function = spec.function.clone();
                context.core.ctx().runtime.spawn(async move {
                    loop {
                        let item = match AssertUnwindSafe(stream.next()).catch_unwind().await {
                            Ok(Some(item)) => item,
                            Ok(None) => return,
                            Err(payload) => Err(panic_error(&function, payload)),
                        };
                        let last = item.is_err();
                        if sender.send(item).await.is_err() || last {
                            return;
                        }
                    }
                });
                ItemSource::Stream(receiver)
            }
        }
    }

    async fn next(&mut self, function: &str) -> Option<ItemOutcome> {
        match self {
            ItemSource::Iter(iter) => advance(iter, function),
            ItemSource::BlockingIter(slot) => {
                let mut iter = slot.take()?;
                let name = function.to_string();
                let advanced = tokio::task::spawn_blocking(move || {
                    let item = advance(&mut iter, &name);
                    (iter, item)
                })
                .await;
                match advanced {
                    Ok((iter, item)) => {
                        *slot = Some(iter);
                        item
                    }
                    Err(join) => Some(Err(TaskError::new(
                        TaskErrorKind::Cancelled,
                        function,
                        join.to_string(),
                    ))),
                }
            }
            ItemSource::Stream(receiver) => receiver.recv().await,
        }
    }
}

/// The iterator's next item; a panic is the generator's error.
fn advance(iter: &mut Box<dyn Iterator<Item = ItemOutcome> + Send>, function: &str) -> Option<ItemOutcome> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| iter.next())) {
        Ok(item) => item,
        Err(payload) => Some(Err(panic_error(function, payload))),
    }
}
