//! The tasks that made objects now in nodes' stores, kept (with their
//! arguments pinned) to run again when a node dies and an object is lost.
//! A task with several stored objects (returns, or a generator's items) is
//! kept once, until all of them are freed.

use raylet_proto::{IdMap, ObjectId, TaskId};

use super::queued_task::QueuedTask;

/// One of a task's objects: its id and its index among the task's objects.
pub(super) type TaskObject = (ObjectId, u64);

#[derive(Default)]
pub(super) struct Lineage {
    /// Each kept task with those of its objects it is kept for.
    tasks: IdMap<TaskId, (QueuedTask, Vec<TaskObject>)>,
    by_object: IdMap<ObjectId, TaskId>,
}

impl Lineage {
    /// Keeps `task`, which made the stored `objects`.
    pub(super) fn keep(&mut self, task: QueuedTask, objects: Vec<TaskObject>) {
        if objects.is_empty() {
            return;
        }
        for (object, _) in &objects {
            self.by_object.insert(*object, task.task_id);
        }
        self.tasks.insert(task.task_id, (task, objects));
    }

    /// `object` was freed: its task is dropped once none of its objects is kept.
    pub(super) fn forget(&mut self, object: ObjectId) {
        let Some(task_id) = self.by_object.remove(&object) else {
            return;
        };
        if let Some((_, objects)) = self.tasks.get_mut(&task_id) {
            objects.retain(|(kept, _)| *kept != object);
            if objects.is_empty() {
                self.tasks.remove(&task_id);
            }
        }
    }

    /// The task that made `object`, to run again, with the objects it was
    /// kept for; it is kept again when that run is done.
    pub(super) fn take(&mut self, object: ObjectId) -> Option<(QueuedTask, Vec<TaskObject>)> {
        let task_id = self.by_object.get(&object)?;
        let (task, objects) = self.tasks.remove(task_id)?;
        for (kept, _) in &objects {
            self.by_object.remove(kept);
        }
        Some((task, objects))
    }
}
