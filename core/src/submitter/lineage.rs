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

#[cfg(test)]
mod tests {
    use raylet_proto::TaskId;

    use super::{Lineage, TaskObject};
    use crate::submitter::queued_task::QueuedTask;
    use crate::submitter::task::TaskOptions;
    use crate::submitter::tests::harness::queued;

    fn task() -> QueuedTask {
        queued(TaskOptions::new("tests::work").num_returns(3))
    }

    /// `task`'s objects at `indexes`.
    fn objects(task: TaskId, indexes: &[u64]) -> Vec<TaskObject> {
        indexes.iter().map(|index| (task.object_at(*index), *index)).collect()
    }

    #[test]
    fn a_kept_task_is_taken_by_any_of_its_objects_with_all_of_them() {
        let task = task();
        let task_id = task.task_id;
        let mut lineage = Lineage::default();
        lineage.keep(task, objects(task_id, &[0, 2]));
        let (taken, kept) = lineage.take(task_id.object_at(2)).expect("the task is kept");
        assert_eq!(taken.task_id, task_id);
        assert_eq!(kept, objects(task_id, &[0, 2]));
        assert!(lineage.take(task_id.object_at(0)).is_none(), "taken once");
    }

    #[test]
    fn a_task_with_no_stored_object_is_not_kept() {
        let task = task();
        let task_id = task.task_id;
        let mut lineage = Lineage::default();
        lineage.keep(task, Vec::new());
        assert!(lineage.take(task_id.object_at(0)).is_none());
    }

    #[test]
    fn a_task_is_dropped_once_all_its_objects_are_freed() {
        let task = task();
        let task_id = task.task_id;
        let mut lineage = Lineage::default();
        lineage.keep(task, objects(task_id, &[0, 1]));
        lineage.forget(task_id.object_at(0));
        let (_, kept) = lineage.take(task_id.object_at(1)).expect("kept for object 1");
        assert_eq!(kept, objects(task_id, &[1]), "object 0 is no longer kept");
        let task = self::task();
        let task_id = task.task_id;
        lineage.keep(task, objects(task_id, &[0, 1]));
        lineage.forget(task_id.object_at(0));
        lineage.forget(task_id.object_at(1));
        assert!(lineage.take(task_id.object_at(1)).is_none());
        assert!(
            lineage.tasks.is_empty() && lineage.by_object.is_empty(),
            "nothing is left"
        );
    }

    #[test]
    fn freeing_an_object_of_another_task_leaves_a_kept_task() {
        let (first, second) = (task(), task());
        let (first_id, second_id) = (first.task_id, second.task_id);
        let mut lineage = Lineage::default();
        lineage.keep(first, objects(first_id, &[0]));
        lineage.keep(second, objects(second_id, &[0]));
        lineage.forget(second_id.object_at(0));
        lineage.forget(first_id.object_at(1));
        assert!(lineage.take(first_id.object_at(0)).is_some());
        assert!(lineage.take(second_id.object_at(0)).is_none());
    }
}
