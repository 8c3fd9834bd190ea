//! The owner's table of the objects this process owns (task results and
//! `put` values): their outcomes, waiting for them, and who holds
//! references to them. An object is freed when no handle in this process
//! and no borrowing process refers to it any more; a freed object that
//! lives in a node's store is handed to the deleter.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use raylet_proto::task_stream;
use raylet_proto::{IdMap, ObjectId};
use tokio::sync::{Notify, mpsc};

use crate::objects::object_ref::handle::{AnyObjectRef, HandleCounter, RawRef};
use crate::value::{Body, Outcome, StoredAt};
use crate::{Error, Result};

/// A freed object that the store of node `at.node` still holds.
pub(crate) type FreedObject = (ObjectId, StoredAt);
/// Called with `true` when the table gets its first object and `false` when
/// it loses its last one: a worker that owns objects must stay alive.
pub(crate) type OwningHook = Box<dyn Fn(bool) + Send + Sync>;

/// An object's state, one pointer wide, so that an owner with a million
/// pending objects keeps its table small. Async waiters' wake-ups live
/// beside the table ([`ObjectTable::waiters`]): few objects have any.
enum Slot {
    Pending,
    Ready(Box<Outcome>),
}

struct Entry {
    slot: Slot,
    /// Handles to the object in this process.
    local_refs: u32,
    /// Processes that hold references, by owner service address, with how
    /// many registrations each made.
    borrowers: Borrowers,
}

// Three words: an owner's table of a million pending objects is the
// largest part of its memory.
const _: () = assert!(size_of::<Entry>() == 24);

/// The processes that borrow one object, with their registrations: a few
/// at most, usually none, so a list, boxed so that an entry without any
/// stays one pointer wide.
#[derive(Default)]
#[allow(clippy::box_collection, reason = "one pointer wide, where a Vec is three")]
struct Borrowers(Option<Box<Vec<Registrations>>>);

/// A borrowing process and how often it registered.
type Registrations = (Arc<str>, u32);

impl Borrowers {
    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<str>> {
        self.0.iter().flat_map(|list| list.iter().map(|(borrower, _)| borrower))
    }

    /// Adds `delta` to `borrower`'s registrations; one at none is gone.
    fn update(&mut self, borrower: &str, delta: i32) {
        let list = self.0.get_or_insert_default();
        let index = match list.iter().position(|(known, _)| **known == *borrower) {
            Some(index) => index,
            None => {
                list.push((borrower.into(), 0));
                list.len() - 1
            }
        };
        let count = &mut list[index].1;
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            list.swap_remove(index);
        }
        if list.is_empty() {
            self.0 = None;
        }
    }

    /// Forgets `borrower`; says whether it was one.
    fn remove(&mut self, borrower: &str) -> bool {
        let Some(list) = &mut self.0 else {
            return false;
        };
        let Some(index) = list.iter().position(|(known, _)| **known == *borrower) else {
            return false;
        };
        list.swap_remove(index);
        if list.is_empty() {
            self.0 = None;
        }
        true
    }
}

impl Entry {
    fn new(slot: Slot) -> Self {
        Entry {
            slot,
            local_refs: 0,
            borrowers: Borrowers::default(),
        }
    }

    /// Whether its value is in a node's store, under the object's own id.
    fn holds_stored_value(&self) -> bool {
        matches!(&self.slot, Slot::Ready(outcome) if matches!(&**outcome, Ok(value) if matches!(value.body, Body::Stored(_))))
    }

    fn unreferenced(&self) -> bool {
        self.local_refs == 0 && self.borrowers.is_empty()
    }
}

/// Shards of the object table: a shard's table doubles on its own, so a
/// growing table never holds an old and a new copy of all of it at once.
const SHARDS: usize = 16;

/// Entries by id, in shards by the id's first byte (ids are random).
#[derive(Default)]
struct ObjectTable {
    shards: [IdMap<ObjectId, Entry>; SHARDS],
    /// The wake-up of each pending object's async waiters, made when the
    /// first of them comes and taken when the object finishes or goes.
    waiters: IdMap<ObjectId, Arc<Notify>>,
}

impl ObjectTable {
    fn shard(id: &ObjectId) -> usize {
        usize::from(id.as_bytes()[0]) % SHARDS
    }

    fn get(&self, id: &ObjectId) -> Option<&Entry> {
        self.shards[Self::shard(id)].get(id)
    }

    fn get_mut(&mut self, id: &ObjectId) -> Option<&mut Entry> {
        self.shards[Self::shard(id)].get_mut(id)
    }

    fn insert(&mut self, id: ObjectId, entry: Entry) {
        self.shards[Self::shard(&id)].insert(id, entry);
    }

    /// Removes an entry; its async waiters wake to find it gone.
    fn remove(&mut self, id: &ObjectId) -> Option<Entry> {
        self.wake_waiters(id);
        self.shards[Self::shard(id)].remove(id)
    }

    fn wake_waiters(&mut self, id: &ObjectId) {
        if !self.waiters.is_empty()
            && let Some(notify) = self.waiters.remove(id)
        {
            notify.notify_waiters();
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.len()).sum()
    }

    fn is_empty(&self) -> bool {
        self.shards.iter().all(|shard| shard.is_empty())
    }

    fn values(&self) -> impl Iterator<Item = &Entry> {
        self.shards.iter().flat_map(|shard| shard.values())
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&ObjectId, &mut Entry)> {
        self.shards.iter_mut().flat_map(|shard| shard.iter_mut())
    }
}

/// Objects by id. Blocking waiters share one condition variable; async
/// waiters wait on their object's own `Notify`.
pub struct MemoryStore {
    objects: Mutex<ObjectTable>,
    completed: Condvar,
    freed: mpsc::UnboundedSender<FreedObject>,
    owning: Option<OwningHook>,
}

impl MemoryStore {
    /// A store that hands freed stored objects to `freed`.
    pub(crate) fn new(freed: mpsc::UnboundedSender<FreedObject>, owning: Option<OwningHook>) -> Self {
        MemoryStore {
            objects: Mutex::new(ObjectTable::default()),
            completed: Condvar::new(),
            freed,
            owning,
        }
    }

    fn add_entry(&self, id: ObjectId, entry: Entry) {
        self.add_entry_to(&mut self.objects(), id, entry);
    }

    fn add_entry_to(&self, objects: &mut ObjectTable, id: ObjectId, entry: Entry) {
        objects.insert(id, entry);
        if objects.len() == 1
            && let Some(owning) = &self.owning
        {
            owning(true);
        }
    }

    fn objects(&self) -> MutexGuard<'_, ObjectTable> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an object whose value is not there yet.
    pub fn add_pending(&self, id: ObjectId) {
        self.add_entry(id, Entry::new(Slot::Pending));
    }

    /// Stores a finished object and wakes its waiters. The first outcome
    /// wins: a cancelled task's late result does not replace `Cancelled`.
    /// A late value in a node's store is deleted there, unless it is the
    /// very object the first outcome put there.
    pub fn complete(&self, id: ObjectId, outcome: Outcome) {
        self.complete_many(std::iter::once((id, outcome)));
    }

    /// Stores several finished objects under one lock and one wake-up of
    /// blocked waiters.
    pub fn complete_many(&self, outcomes: impl IntoIterator<Item = (ObjectId, Outcome)>) {
        let mut objects = self.objects();
        let mut any = false;
        let mut unwanted = Vec::new();
        for (id, outcome) in outcomes {
            let Some(entry) = objects.get_mut(&id).filter(|e| matches!(e.slot, Slot::Pending)) else {
                if !objects.get(&id).is_some_and(Entry::holds_stored_value) {
                    unwanted.push((id, outcome));
                }
                continue;
            };
            entry.slot = Slot::Ready(Box::new(outcome));
            objects.wake_waiters(&id);
            any = true;
        }
        drop(objects);
        if any {
            self.completed.notify_all();
        }
        for (id, outcome) in unwanted {
            self.discard(id, outcome);
        }
    }

    /// A node pulled a copy of a stored object: readers may pull from it
    /// too, and it is deleted there with the object.
    pub fn add_copy(&self, id: ObjectId, node: &str) {
        let mut objects = self.objects();
        if let Some(Entry {
            slot: Slot::Ready(outcome),
            ..
        }) = objects.get_mut(&id)
            && let Ok(value) = &mut **outcome
            && let Body::Stored(at) = &mut value.body
            && !at.holders().any(|holder| **holder == *node)
        {
            at.copies.push(node.into());
        }
    }

    /// Makes a finished object pending again, for its task to run again;
    /// its references and borrowers stay.
    pub fn reset_pending(&self, id: ObjectId) {
        if let Some(entry) = self.objects().get_mut(&id) {
            entry.slot = Slot::Pending;
        }
    }

    /// Adds a pending object unless the object is here already.
    pub fn ensure_pending(&self, id: ObjectId) {
        let mut objects = self.objects();
        if objects.get(&id).is_none() {
            self.add_entry_to(&mut objects, id, Entry::new(Slot::Pending));
        }
    }

    /// Adds a finished object, as `put` does.
    pub fn insert(&self, id: ObjectId, value: crate::value::EncodedValue) {
        self.add_entry(id, Entry::new(Slot::Ready(Box::new(Ok(value)))));
    }

    /// The outcome if the object is finished; `None` while pending;
    /// an error if this store does not have it.
    pub fn try_get(&self, id: ObjectId) -> Result<Option<Outcome>> {
        match self.objects().get(&id).map(|e| &e.slot) {
            Some(Slot::Ready(outcome)) => Ok(Some((**outcome).clone())),
            Some(Slot::Pending) => Ok(None),
            None => Err(Error::not_owned(id)),
        }
    }

    /// Blocks until the object is finished or `deadline` passes. A
    /// result that comes back on the same-node stream this thread last sent
    /// a call on is read here for a moment first (see
    /// [`task_stream::read_last_sent_until`]), before this thread sleeps.
    pub fn wait_blocking(&self, id: ObjectId, deadline: Option<Instant>) -> Result<Option<Outcome>> {
        let spin = deadline.map_or(task_stream::SPIN, |deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .min(task_stream::SPIN)
        });
        let finished = || !matches!(self.objects().get(&id).map(|e| &e.slot), Some(Slot::Pending));
        task_stream::read_last_sent_until(&finished, spin);
        let mut objects = self.objects();
        loop {
            match objects.get(&id).map(|e| &e.slot) {
                Some(Slot::Ready(outcome)) => return Ok(Some((**outcome).clone())),
                None => return Err(Error::not_owned(id)),
                Some(Slot::Pending) => {}
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
                    let done = found < wanted && !matches!(objects.get(id).map(|e| &e.slot), Some(Slot::Pending));
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
            let notify = {
                let mut objects = self.objects();
                match objects.get(&id).map(|e| &e.slot) {
                    Some(Slot::Ready(outcome)) => return Ok(Some((**outcome).clone())),
                    Some(Slot::Pending) => objects.waiters.entry(id).or_default().clone(),
                    None => return Err(Error::not_owned(id)),
                }
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.objects().get(&id).map(|e| &e.slot) {
                Some(Slot::Ready(outcome)) => return Ok(Some((**outcome).clone())),
                None => return Err(Error::not_owned(id)),
                Some(Slot::Pending) => {}
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

    /// A new handle to the object in this process.
    pub fn add_local_ref(&self, id: ObjectId) {
        if let Some(entry) = self.objects().get_mut(&id) {
            entry.local_refs += 1;
        }
    }

    /// A handle in this process is gone; frees the object if it was the
    /// last reference anywhere.
    pub fn remove_local_ref(&self, id: ObjectId) {
        let mut objects = self.objects();
        let Some(entry) = objects.get_mut(&id) else {
            return;
        };
        entry.local_refs = entry.local_refs.saturating_sub(1);
        let freed = self.take_if_unreferenced(&mut objects, id);
        drop(objects);
        self.free(id, freed);
    }

    /// Process `borrower` took (`delta > 0`) or dropped references. Returns
    /// false when the object is not (or no longer) here.
    pub fn update_borrower(&self, id: ObjectId, borrower: &str, delta: i32) -> bool {
        let mut objects = self.objects();
        let Some(entry) = objects.get_mut(&id) else {
            return false;
        };
        entry.borrowers.update(borrower, delta);
        let freed = self.take_if_unreferenced(&mut objects, id);
        drop(objects);
        self.free(id, freed);
        true
    }

    /// Every process that borrows objects owned here.
    pub fn borrowers(&self) -> Vec<Arc<str>> {
        let objects = self.objects();
        let mut borrowers: Vec<Arc<str>> = objects.values().flat_map(|e| e.borrowers.iter().cloned()).collect();
        borrowers.sort();
        borrowers.dedup();
        borrowers
    }

    /// A borrowing process is gone: its references no longer count.
    pub fn forget_borrower(&self, borrower: &str) {
        let mut objects = self.objects();
        let ids: Vec<ObjectId> = objects
            .iter_mut()
            .filter_map(|(id, entry)| entry.borrowers.remove(borrower).then_some(*id))
            .collect();
        let freed: Vec<(ObjectId, Option<Entry>)> = ids
            .into_iter()
            .map(|id| (id, self.take_if_unreferenced(&mut objects, id)))
            .collect();
        drop(objects);
        for (id, entry) in freed {
            self.free(id, entry);
        }
    }

    fn take_if_unreferenced(&self, objects: &mut ObjectTable, id: ObjectId) -> Option<Entry> {
        if !objects.get(&id).is_some_and(Entry::unreferenced) {
            return None;
        }
        let entry = objects.remove(&id);
        if objects.is_empty()
            && let Some(owning) = &self.owning
        {
            owning(false);
        }
        entry
    }

    /// The handles to the object in this process and the processes that
    /// borrow it; `None` when it is not here.
    pub fn holders(&self, id: ObjectId) -> Option<(u32, Vec<String>)> {
        let objects = self.objects();
        let entry = objects.get(&id)?;
        let mut borrowers: Vec<String> = entry.borrowers.iter().map(|b| b.to_string()).collect();
        borrowers.sort();
        Some((entry.local_refs, borrowers))
    }

    /// Drops a freed entry outside the lock (the references its value
    /// contains may free more objects) and deletes its stored copy.
    fn free(&self, id: ObjectId, entry: Option<Entry>) {
        if let Some(Entry {
            slot: Slot::Ready(outcome),
            ..
        }) = entry
        {
            self.discard(id, *outcome);
        }
    }

    /// An outcome nobody will read: its stored copy is deleted.
    fn discard(&self, id: ObjectId, outcome: Outcome) {
        if let Ok(value) = outcome
            && let Body::Stored(at) = &value.body
        {
            let _ = self.freed.send((id, at.clone()));
        }
    }
}

impl HandleCounter for MemoryStore {
    fn handle_dropped(&self, id: ObjectId) {
        self.remove_local_ref(id);
    }
}

impl AnyObjectRef {
    /// A handle to an object of this process, counted by its table.
    pub(crate) fn owned(raw: RawRef, store: &Arc<MemoryStore>) -> Self {
        store.add_local_ref(raw.id);
        let counter: Weak<dyn HandleCounter> = Arc::downgrade(store) as Weak<MemoryStore>;
        AnyObjectRef::counted(raw, counter)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::value::{EncodedValue, Expected, Format};

    /// An inline value decoded as `T`, its type checked first, as `get` does.
    fn decode<T: serde::de::DeserializeOwned>(value: &EncodedValue, id: ObjectId) -> Result<T> {
        value.check(id, Expected::of::<T>(Format::Postcard))?;
        let Body::Inline(data) = &value.body else {
            panic!("the test value is inline");
        };
        Ok(raylet_common::codec::decode(data)?)
    }

    fn store() -> (Arc<MemoryStore>, mpsc::UnboundedReceiver<FreedObject>) {
        let (freed, receiver) = mpsc::unbounded_channel();
        (Arc::new(MemoryStore::new(freed, None)), receiver)
    }

    fn stored_value() -> EncodedValue {
        let at = StoredAt::new("node:1", 1 << 20);
        EncodedValue::new::<Vec<u8>>(Format::Postcard, Body::Stored(at), Vec::new())
    }

    #[test]
    fn a_blocking_waiter_wakes_when_the_object_completes() {
        let (store, _freed) = store();
        let id = ObjectId::random();
        store.add_pending(id);
        let writer = store.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            writer.complete(id, Ok(EncodedValue::encode(&7u32).unwrap()));
        });
        let outcome = store.wait_blocking(id, None).unwrap().unwrap().unwrap();
        assert_eq!(decode::<u32>(&outcome, id).unwrap(), 7);
        thread.join().unwrap();
    }

    #[test]
    fn waiting_past_the_deadline_returns_none() {
        let (store, _freed) = store();
        let id = ObjectId::random();
        store.add_pending(id);
        let deadline = Instant::now() + Duration::from_millis(10);
        assert!(store.wait_blocking(id, Some(deadline)).unwrap().is_none());
    }

    #[tokio::test]
    async fn an_async_waiter_wakes_when_the_object_completes() {
        let (store, _freed) = store();
        let id = ObjectId::random();
        store.add_pending(id);
        let writer = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            writer.complete(id, Ok(EncodedValue::encode(&"done".to_string()).unwrap()));
        });
        let outcome = store.wait(id, None).await.unwrap().unwrap().unwrap();
        assert_eq!(decode::<String>(&outcome, id).unwrap(), "done");
    }

    #[tokio::test]
    async fn an_async_waiter_of_an_object_freed_while_pending_is_told_it_is_gone() {
        let (store, _freed) = store();
        let id = ObjectId::random();
        store.add_pending(id);
        store.add_local_ref(id);
        let waiter = tokio::spawn({
            let store = store.clone();
            async move { store.wait(id, None).await }
        });
        while store.objects().waiters.is_empty() {
            tokio::task::yield_now().await;
        }
        store.remove_local_ref(id);
        let told = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter is woken when its object goes");
        assert!(matches!(told.unwrap(), Err(Error::ObjectLost { object, .. }) if object == id));
        assert!(store.objects().waiters.is_empty());
    }

    #[test]
    fn getting_a_value_as_another_type_is_a_typed_error() {
        let id = ObjectId::random();
        let value = EncodedValue::encode(&vec![1u64, 2]).unwrap();
        match decode::<String>(&value, id) {
            Err(Error::WrongType { expected, actual, .. }) => {
                assert_eq!(expected, "alloc::string::String");
                assert_eq!(actual, "alloc::vec::Vec<u64>");
            }
            other => panic!("expected WrongType, got {other:?}"),
        }
    }

    #[test]
    fn an_object_lives_while_a_local_handle_or_a_borrower_holds_it() {
        let (store, mut freed) = store();
        let id = ObjectId::random();
        store.insert(id, stored_value());
        store.add_local_ref(id);
        assert!(store.update_borrower(id, "worker:1", 2));
        store.remove_local_ref(id);
        assert_eq!(
            store.holders(id),
            Some((0, vec!["worker:1".to_string()])),
            "the borrower still holds it"
        );
        assert!(store.update_borrower(id, "worker:1", -1));
        assert!(store.try_get(id).is_ok(), "one registration is left");
        assert!(store.update_borrower(id, "worker:1", -1));
        assert!(store.try_get(id).is_err());
        assert_eq!(freed.try_recv().unwrap().0, id, "its stored copy is deleted");
        assert!(!store.update_borrower(id, "worker:1", 1), "a freed object is gone");
    }

    #[test]
    fn a_borrower_that_is_gone_no_longer_keeps_objects() {
        let (store, mut freed) = store();
        let (kept, dropped) = (ObjectId::random(), ObjectId::random());
        store.insert(kept, stored_value());
        store.insert(dropped, stored_value());
        store.update_borrower(kept, "worker:1", 1);
        store.update_borrower(kept, "worker:2", 1);
        store.update_borrower(dropped, "worker:1", 3);
        assert_eq!(store.borrowers(), vec![Arc::from("worker:1"), Arc::from("worker:2")]);
        store.forget_borrower("worker:1");
        assert_eq!(freed.try_recv().unwrap().0, dropped);
        assert!(freed.try_recv().is_err(), "worker:2 still holds the other");
        assert_eq!(store.borrowers(), vec![Arc::from("worker:2")]);
    }

    #[test]
    fn a_late_result_nobody_wants_is_deleted_from_the_store() {
        let (store, mut freed) = store();
        let id = ObjectId::random();
        store.add_pending(id);
        store.add_local_ref(id);
        store.remove_local_ref(id);
        store.complete(id, Ok(stored_value()));
        assert_eq!(freed.try_recv().unwrap().0, id);
    }
}
