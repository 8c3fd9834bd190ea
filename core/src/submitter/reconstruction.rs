//! Lost objects made again by running their task once more. A task whose
//! value is stored in a node's store is kept as lineage (with its arguments
//! pinned) until its stored objects are freed; when one is lost, the task
//! runs again as its next attempt, if its retries allow, and makes that
//! object again with those stored only on the nodes that held it. A
//! generator sends only the lost items; an item the new run does not yield
//! fails.

use raylet_proto::ObjectId;

use super::lineage::TaskObject;
use super::queued_task::QueuedTask;
use super::{NotRebuilt, Submitter};
use crate::generator::table::items_in;
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{Body, EncodedValue, StoredAt};

impl Submitter {
    /// Keeps `task`, whose attempt made `value`, for the objects of it
    /// that are stored.
    pub(super) fn keep_lineage(&mut self, task: QueuedTask, value: &EncodedValue) {
        let objects = match task.options().generator {
            true => {
                let yielded = items_in(value).unwrap_or(0);
                self.fail_items_not_rebuilt(&task, yielded);
                1..yielded + 1
            }
            false => 0..u64::from(task.options().num_returns),
        };
        let stored = objects
            .map(|index| (task.task_id.object_at(index), index))
            .filter(|(id, _)| self.stored_at(*id).is_some())
            .collect();
        self.lineage.keep(task.done(), stored);
    }

    /// A generator's run that made lost items again is done: an item it
    /// did not make (it yielded only `yielded` items this time) fails.
    fn fail_items_not_rebuilt(&self, task: &QueuedTask, yielded: u64) {
        let missing: Vec<ObjectId> = self
            .owner
            .generators
            .rebuilt(task.task_id)
            .into_iter()
            .filter(|item| *item >= yielded)
            .map(|item| task.task_id.object_at(item + 1))
            .collect();
        if missing.is_empty() {
            return;
        }
        let message = format!("it ran again to make its lost items, and yielded only {yielded} items this time");
        let error = TaskError::new(TaskErrorKind::Application, &task.options().shown_name(), message);
        self.owner.fail_all(missing, error);
    }

    /// Where this process's `object` is stored, if it has it and it is.
    fn stored_at(&self, object: ObjectId) -> Option<StoredAt> {
        match self.owner.store.try_get(object) {
            Ok(Some(Ok(value))) => match value.body {
                Body::Stored(at) => Some(at),
                Body::Inline(_) => None,
            },
            _ => None,
        }
    }

    /// Queues the task that made `object` again, if its retries allow; a
    /// task that may not run again stays kept, to say so again.
    pub(super) fn reconstruct(&mut self, object: ObjectId) -> Result<(), NotRebuilt> {
        let Some((task, kept)) = self.lineage.take(object) else {
            return match self.owner.store.try_get(object) {
                Ok(None) => Ok(()),
                _ => Err(NotRebuilt::Put),
            };
        };
        if !task.can_retry() {
            let spent = NotRebuilt::RetriesSpent {
                function: task.options().shown_name(),
                runs: task.attempt + 1,
                max_retries: task.options().max_retries,
            };
            self.lineage.keep(task, kept);
            return Err(spent);
        }
        let lost = self.lost_with(object, kept);
        for (id, _) in &lost {
            self.owner.store.reset_pending(*id);
        }
        if task.options().generator {
            let items = lost.iter().map(|(_, index)| index - 1).collect();
            self.owner.generators.rebuild(task.task_id, items);
        }
        let template = task.template.clone();
        self.requeue(task);
        self.dispatch(&template.class);
        Ok(())
    }

    /// The objects of `kept` lost with `object`: it, and those stored only
    /// on nodes that held it, which one run makes again together.
    fn lost_with(&self, object: ObjectId, kept: Vec<TaskObject>) -> Vec<TaskObject> {
        let Some(lost_at) = self.stored_at(object) else {
            return kept.into_iter().filter(|(id, _)| *id == object).collect();
        };
        let on_lost_nodes = |at: &StoredAt| at.holders().all(|holder| lost_at.holders().any(|lost| lost == holder));
        kept.into_iter()
            .filter(|(id, _)| *id == object || self.stored_at(*id).is_some_and(|at| on_lost_nodes(&at)))
            .collect()
    }
}
