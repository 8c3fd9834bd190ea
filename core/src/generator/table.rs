//! The owner's side of its generator calls: the items that came back and
//! wait to be taken, how many were taken (told back to the worker so that
//! it pauses at the bound), and where to send those acknowledgements.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use raylet_proto::v1::{CancelTask, GeneratorAck, GeneratorCall, GeneratorItem, ObjectOutcome, TaskBatch};
use raylet_proto::{IdMap, ObjectId, TaskId};

use crate::objects::memory_store::MemoryStore;
use crate::objects::object_ref::handle::{AnyObjectRef, RawRef};
use crate::observability::task_events::TaskEvents;
use crate::value::{Body, EncodedValue, Outcome};

/// Items a generator may send ahead of its caller unless the call says
/// otherwise: enough to keep a consumer busy, few enough to bound memory.
pub const DEFAULT_BACKPRESSURE: u64 = 64;

/// Sends a batch to the worker that runs a generator.
pub(crate) type WorkerSink = Arc<dyn Fn(TaskBatch) + Send + Sync>;

/// The generator calls this process made whose streams are open.
pub(crate) struct Generators {
    /// The owner's objects, which items become.
    objects: ItemObjects,
    task_events: Arc<TaskEvents>,
    open: Mutex<IdMap<TaskId, Arc<GeneratorState>>>,
    /// Finished calls that run again to make lost items: those items.
    rebuilds: Mutex<IdMap<TaskId, Vec<u64>>>,
}

/// Where a call's items become objects: the owner's table, and the
/// address the references name.
#[derive(Clone)]
struct ItemObjects {
    store: Arc<MemoryStore>,
    owner: Arc<str>,
}

impl ItemObjects {
    /// A handle to object `id` of this owner, pending until it completes.
    fn held(&self, id: ObjectId) -> AnyObjectRef {
        self.store.ensure_pending(id);
        let raw = RawRef {
            id,
            owner: self.owner.clone(),
        };
        AnyObjectRef::owned(raw, &self.store)
    }
}

/// One generator call, as its caller sees it.
pub(crate) struct GeneratorState {
    pub(crate) task: TaskId,
    objects: ItemObjects,
    /// Items sent ahead and not taken, at most; 0 for no bound.
    backpressure: u64,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    /// Items that came back, in order: the next one's index.
    received: u64,
    /// Items the caller took.
    taken: u64,
    /// `taken` as the worker was last told it.
    acked: u64,
    /// Items that came back and wait to be taken.
    ready: VecDeque<AnyObjectRef>,
    /// The worker that runs the call, once it runs.
    sink: Option<WorkerSink>,
    /// Set when the caller stopped the call: it is not sent again.
    stopped: bool,
}

impl Generators {
    /// The generator calls of the owner of `store`, at `owner`.
    pub(crate) fn new(store: Arc<MemoryStore>, owner: Arc<str>, task_events: Arc<TaskEvents>) -> Self {
        Generators {
            objects: ItemObjects { store, owner },
            task_events,
            open: Mutex::default(),
            rebuilds: Mutex::default(),
        }
    }

    /// Opens the stream of a generator call before it is submitted.
    pub(crate) fn open(&self, task: TaskId, backpressure: u64) -> Arc<GeneratorState> {
        let state = Arc::new(GeneratorState {
            task,
            objects: self.objects.clone(),
            backpressure,
            progress: Mutex::default(),
        });
        self.table().insert(task, state.clone());
        state
    }

    /// The stream was dropped: items that still come are deleted.
    pub(crate) fn close(&self, task: TaskId) {
        self.table().remove(&task);
    }

    fn table(&self) -> MutexGuard<'_, IdMap<TaskId, Arc<GeneratorState>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, task: TaskId) -> Option<Arc<GeneratorState>> {
        self.table().get(&task).cloned()
    }

    /// Call `task` runs again to make `items`, which were lost.
    pub(crate) fn rebuild(&self, task: TaskId, items: Vec<u64>) {
        self.rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(task, items);
    }

    /// Call `task` finished a run: the items it was to make again, if any.
    pub(crate) fn rebuilt(&self, task: TaskId) -> Vec<u64> {
        self.rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&task)
            .unwrap_or_default()
    }

    /// How the next attempt of generator call `task` runs: it makes the
    /// items being rebuilt, or it skips what came back, knowing what was
    /// taken; `None` once its stream was dropped or stopped.
    pub(crate) fn call_for(&self, task: TaskId) -> Option<GeneratorCall> {
        if let Some(items) = self.rebuilds.lock().unwrap_or_else(|p| p.into_inner()).get(&task) {
            return Some(GeneratorCall {
                rebuild: items.clone(),
                ..GeneratorCall::default()
            });
        }
        let state = self.get(task)?;
        let progress = state.progress();
        if progress.stopped {
            return None;
        }
        Some(GeneratorCall {
            skip: progress.received,
            consumed: progress.taken,
            backpressure: state.backpressure,
            rebuild: Vec::new(),
        })
    }

    /// The call `task` was sent to the worker behind `sink`.
    pub(crate) fn dispatched(&self, task: TaskId, sink: WorkerSink) {
        if let Some(state) = self.get(task) {
            state.progress().sink = Some(sink);
        }
    }

    /// Takes in items that workers sent: the next of its stream waits to be
    /// taken; one that came already (from an attempt before a retry, or a
    /// run that makes lost items again) completes its object if that is
    /// pending, and is deleted otherwise, as is any item of a closed stream.
    /// `adopt` turns an item's outcome from the wire into this owner's.
    pub(crate) fn absorb(&self, items: Vec<GeneratorItem>, adopt: impl Fn(ObjectOutcome) -> Outcome) {
        for item in items {
            let Ok(task) = TaskId::from_wire(&item.task_id) else {
                continue;
            };
            let outcome = adopt(item.item.unwrap_or_default());
            let id = task.object_at(item.index + 1);
            let store = &self.objects.store;
            let Some(state) = self.get(task) else {
                store.complete(id, outcome);
                continue;
            };
            let mut progress = state.progress();
            if item.index != progress.received {
                drop(progress);
                store.complete(id, outcome);
                continue;
            }
            // Held before it completes: a waiter that wakes drops its
            // placeholder, which must not free the item.
            progress.ready.push_back(self.objects.held(id));
            store.complete(id, outcome);
            progress.received += 1;
            self.task_events.yielded(task, item.attempt, progress.received);
        }
    }
}

/// What taking the next item found.
pub(crate) enum Next {
    Item(AnyObjectRef),
    /// None is there yet: wait for `item` (a pending placeholder, held by
    /// this handle) or for the end of the stream.
    Wait(AnyObjectRef),
}

impl GeneratorState {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object that ends the stream: the call's outcome.
    pub(crate) fn end(&self) -> ObjectId {
        self.task.return_object()
    }

    /// Takes the next item if it is there, telling the worker when that
    /// makes room; otherwise a placeholder for it to wait on.
    pub(crate) fn take(&self) -> Next {
        let mut progress = self.progress();
        if let Some(item) = progress.ready.pop_front() {
            progress.taken += 1;
            self.acknowledge(&mut progress);
            return Next::Item(item);
        }
        Next::Wait(self.objects.held(self.task.object_at(progress.received + 1)))
    }

    /// Tells the worker how many items were taken, every quarter of the
    /// bound: often enough that it never waits for an acknowledgement that
    /// is due, seldom enough that fast streams send few.
    fn acknowledge(&self, progress: &mut Progress) {
        if self.backpressure == 0 || progress.taken - progress.acked < (self.backpressure / 4).max(1) {
            return;
        }
        progress.acked = progress.taken;
        if let Some(sink) = &progress.sink {
            sink(TaskBatch {
                acks: vec![GeneratorAck {
                    task_id: self.task.as_bytes().to_vec(),
                    consumed: progress.taken,
                }],
                ..TaskBatch::default()
            });
        }
    }

    /// Stops the call: the worker that runs it, if one does, is told to,
    /// and it is not sent again.
    pub(crate) fn stop(&self) {
        let mut progress = self.progress();
        progress.stopped = true;
        if let Some(sink) = &progress.sink {
            sink(TaskBatch {
                cancel: vec![CancelTask {
                    task_id: self.task.as_bytes().to_vec(),
                }],
                ..TaskBatch::default()
            });
        }
    }

    /// Items that came back so far.
    pub(crate) fn received(&self) -> u64 {
        self.progress().received
    }
}

/// The items a generator call yielded, from its outcome.
pub(crate) fn items_in(outcome: &EncodedValue) -> Option<u64> {
    match &outcome.body {
        Body::Inline(data) => raylet_common::codec::decode(data).ok(),
        Body::Stored(_) => None,
    }
}
