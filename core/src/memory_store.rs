//! The owner's in-memory object store: the values of the objects this
//! process owns (task results and `put` values), and waiting for them.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use raylet_proto::ObjectId;
use raylet_proto::v1;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::task::TaskError;
use crate::{Error, Result};

/// An encoded value with the name of its type, so that getting it as
/// another type is a clear error rather than garbage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedValue {
    pub type_name: Arc<str>,
    pub data: Bytes,
}

impl EncodedValue {
    pub fn encode<T: Serialize>(value: &T) -> Result<Self> {
        Ok(EncodedValue {
            type_name: std::any::type_name::<T>().into(),
            data: raylet_proto::codec::encode(value)?.into(),
        })
    }

    /// Decodes as `T`, checking the type name first.
    pub fn decode<T: DeserializeOwned>(&self, object: ObjectId) -> Result<T> {
        let expected = std::any::type_name::<T>();
        if *self.type_name != *expected {
            return Err(Error::WrongType {
                object,
                expected: expected.to_string(),
                actual: self.type_name.to_string(),
            });
        }
        Ok(raylet_proto::codec::decode(&self.data)?)
    }

    pub(crate) fn from_proto(value: v1::EncodedValue) -> Self {
        EncodedValue {
            type_name: value.type_name.into(),
            data: value.data,
        }
    }

    pub(crate) fn to_proto(&self) -> v1::EncodedValue {
        v1::EncodedValue {
            type_name: self.type_name.to_string(),
            data: self.data.clone(),
        }
    }
}

/// A finished object: its value or why it has none.
pub type Outcome = std::result::Result<EncodedValue, TaskError>;

pub(crate) fn outcome_to_proto(outcome: &Outcome) -> v1::ObjectOutcome {
    use v1::object_outcome::Outcome as Proto;
    let outcome = match outcome {
        Ok(value) => Proto::Value(value.to_proto()),
        Err(error) => Proto::Failure(error.to_proto()),
    };
    v1::ObjectOutcome { outcome: Some(outcome) }
}

pub(crate) fn outcome_from_proto(outcome: v1::ObjectOutcome) -> Outcome {
    use v1::object_outcome::Outcome as Proto;
    match outcome.outcome {
        Some(Proto::Value(value)) => Ok(EncodedValue::from_proto(value)),
        Some(Proto::Failure(failure)) => Err(TaskError::from_proto(failure)),
        None => Err(TaskError::new(
            crate::TaskErrorKind::Argument,
            "",
            "an empty object outcome",
        )),
    }
}

enum Slot {
    Pending(Arc<Notify>),
    Ready(Outcome),
}

struct Entry {
    slot: Slot,
    /// A reference left this process, so it may be used after every local
    /// handle is gone; such objects are kept.
    escaped: bool,
}

/// Objects by id. Blocking waiters share one condition variable; async
/// waiters wait on their object's own `Notify`.
#[derive(Default)]
pub struct MemoryStore {
    objects: Mutex<HashMap<ObjectId, Entry>>,
    completed: Condvar,
}

impl MemoryStore {
    fn objects(&self) -> MutexGuard<'_, HashMap<ObjectId, Entry>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an object whose value is not there yet.
    pub fn add_pending(&self, id: ObjectId) {
        let entry = Entry {
            slot: Slot::Pending(Arc::new(Notify::new())),
            escaped: false,
        };
        self.objects().insert(id, entry);
    }

    /// Stores a finished object and wakes its waiters. The first outcome
    /// wins: a cancelled task's late result does not replace `Cancelled`.
    /// An object nobody refers to any more is dropped.
    pub fn complete(&self, id: ObjectId, outcome: Outcome) {
        self.complete_many(std::iter::once((id, outcome)));
    }

    /// Stores several finished objects under one lock and one wake-up of
    /// blocked waiters.
    pub fn complete_many(&self, outcomes: impl IntoIterator<Item = (ObjectId, Outcome)>) {
        let mut objects = self.objects();
        let mut any = false;
        for (id, outcome) in outcomes {
            let Some(entry) = objects.get_mut(&id).filter(|e| matches!(e.slot, Slot::Pending(_))) else {
                continue;
            };
            if let Slot::Pending(notify) = std::mem::replace(&mut entry.slot, Slot::Ready(outcome)) {
                notify.notify_waiters();
            }
            any = true;
        }
        drop(objects);
        if any {
            self.completed.notify_all();
        }
    }

    /// Adds a finished object, as `put` does.
    pub fn insert(&self, id: ObjectId, value: EncodedValue) {
        self.objects().insert(
            id,
            Entry {
                slot: Slot::Ready(Ok(value)),
                escaped: false,
            },
        );
    }

    #[cfg(test)]
    pub fn contains(&self, id: ObjectId) -> bool {
        self.objects().contains_key(&id)
    }

    /// The outcome if the object is finished; `None` while pending;
    /// an error if this store does not have it.
    pub fn try_get(&self, id: ObjectId) -> Result<Option<Outcome>> {
        match self.objects().get(&id).map(|e| &e.slot) {
            Some(Slot::Ready(outcome)) => Ok(Some(outcome.clone())),
            Some(Slot::Pending(_)) => Ok(None),
            None => Err(Error::ObjectLost(id)),
        }
    }

    /// Blocks until the object is finished or `deadline` passes.
    pub fn wait_blocking(&self, id: ObjectId, deadline: Option<Instant>) -> Result<Option<Outcome>> {
        let mut objects = self.objects();
        loop {
            match objects.get(&id).map(|e| &e.slot) {
                Some(Slot::Ready(outcome)) => return Ok(Some(outcome.clone())),
                None => return Err(Error::ObjectLost(id)),
                Some(Slot::Pending(_)) => {}
            }
            objects = match deadline {
                None => self.completed.wait(objects).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return Ok(None);
                    };
                    self.completed
                        .wait_timeout(objects, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// Blocks until `wanted` of `ids` are finished or `deadline` passes;
    /// says which are, scanning no further than the `wanted`-th finished
    /// one. Ids this store lacks count as finished.
    pub fn wait_many_blocking(&self, ids: &[ObjectId], wanted: usize, deadline: Option<Instant>) -> Vec<bool> {
        let mut objects = self.objects();
        loop {
            let mut found = 0;
            let finished: Vec<bool> = ids
                .iter()
                .map(|id| {
                    let done = found < wanted && !matches!(objects.get(id).map(|e| &e.slot), Some(Slot::Pending(_)));
                    found += usize::from(done);
                    done
                })
                .collect();
            if found >= wanted {
                return finished;
            }
            objects = match deadline {
                None => self.completed.wait(objects).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) => {
                        self.completed
                            .wait_timeout(objects, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                    None => return finished,
                },
            };
        }
    }

    /// Waits until the object is finished or `deadline` passes.
    pub async fn wait(&self, id: ObjectId, deadline: Option<tokio::time::Instant>) -> Result<Option<Outcome>> {
        loop {
            let notify = match self.objects().get(&id).map(|e| &e.slot) {
                Some(Slot::Ready(outcome)) => return Ok(Some(outcome.clone())),
                Some(Slot::Pending(notify)) => notify.clone(),
                None => return Err(Error::ObjectLost(id)),
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(Slot::Ready(outcome)) = self.objects().get(&id).map(|e| &e.slot) {
                return Ok(Some(outcome.clone()));
            }
            match deadline {
                None => notified.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Marks that a reference to the object left this process.
    pub fn mark_escaped(&self, id: ObjectId) {
        if let Some(entry) = self.objects().get_mut(&id) {
            entry.escaped = true;
        }
    }

    /// The last local handle is gone: drops the object unless it escaped.
    pub fn release(&self, id: ObjectId) {
        let mut objects = self.objects();
        if objects.get(&id).is_some_and(|e| !e.escaped) {
            objects.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_blocking_waiter_wakes_when_the_object_completes() {
        let store = Arc::new(MemoryStore::default());
        let id = ObjectId::random();
        store.add_pending(id);
        let writer = store.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            writer.complete(id, Ok(EncodedValue::encode(&7u32).unwrap()));
        });
        let outcome = store.wait_blocking(id, None).unwrap().unwrap().unwrap();
        assert_eq!(outcome.decode::<u32>(id).unwrap(), 7);
        thread.join().unwrap();
    }

    #[test]
    fn waiting_past_the_deadline_returns_none() {
        let store = MemoryStore::default();
        let id = ObjectId::random();
        store.add_pending(id);
        let deadline = Instant::now() + Duration::from_millis(10);
        assert!(store.wait_blocking(id, Some(deadline)).unwrap().is_none());
    }

    #[tokio::test]
    async fn an_async_waiter_wakes_when_the_object_completes() {
        let store = Arc::new(MemoryStore::default());
        let id = ObjectId::random();
        store.add_pending(id);
        let writer = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            writer.complete(id, Ok(EncodedValue::encode(&"done".to_string()).unwrap()));
        });
        let outcome = store.wait(id, None).await.unwrap().unwrap().unwrap();
        assert_eq!(outcome.decode::<String>(id).unwrap(), "done");
    }

    #[test]
    fn getting_a_value_as_another_type_is_a_typed_error() {
        let id = ObjectId::random();
        let value = EncodedValue::encode(&vec![1u64, 2]).unwrap();
        match value.decode::<String>(id) {
            Err(Error::WrongType { expected, actual, .. }) => {
                assert_eq!(expected, "alloc::string::String");
                assert_eq!(actual, "alloc::vec::Vec<u64>");
            }
            other => panic!("expected WrongType, got {other:?}"),
        }
    }

    #[test]
    fn released_objects_are_dropped_unless_they_escaped() {
        let store = MemoryStore::default();
        let (kept, dropped) = (ObjectId::random(), ObjectId::random());
        store.insert(kept, EncodedValue::encode(&1u8).unwrap());
        store.insert(dropped, EncodedValue::encode(&2u8).unwrap());
        store.mark_escaped(kept);
        store.release(kept);
        store.release(dropped);
        assert!(store.contains(kept));
        assert!(!store.contains(dropped));
    }
}
