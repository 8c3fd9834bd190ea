//! The tasks that made objects now in nodes' stores, kept (with their
//! arguments pinned) to run again when a node dies and an object is lost.
//! A task with several stored returns is kept once, until all are freed.

use raylet_proto::{IdMap, ObjectId, TaskId};

use super::queued_task::QueuedTask;

#[derive(Default)]
pub(super) struct Lineage {
    /// Each kept task with those of its objects it is kept for.
    tasks: IdMap<TaskId, (QueuedTask, Vec<ObjectId>)>,
    by_object: IdMap<ObjectId, TaskId>,
}

impl Lineage {
    /// Keeps `task`, which made the stored `objects`.
    pub(super) fn keep(&mut self, task: QueuedTask, objects: Vec<ObjectId>) {
        if objects.is_empty() {
            return;
        }
        for object in &objects {
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
            objects.retain(|kept| *kept != object);
            if objects.is_empty() {
                self.tasks.remove(&task_id);
            }
        }
    }

    /// The task that made `object`, to run again; it is kept again when
    /// that run is done.
    pub(super) fn take(&mut self, object: ObjectId) -> Option<QueuedTask> {
        let task_id = self.by_object.get(&object)?;
        let (task, objects) = self.tasks.remove(task_id)?;
        for kept in objects {
            self.by_object.remove(&kept);
        }
        Some(task)
    }
}
