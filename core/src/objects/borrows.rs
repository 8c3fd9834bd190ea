//! The references this process holds to objects that other processes own,
//! and the messages that tell those owners: a process registers as a
//! borrower when it first holds a reference and unregisters when it drops
//! the last one, so an owner frees an object only when nobody refers to it.
//!
//! A registration must reach the owner before the reference that carried
//! it can be dropped elsewhere: a `get` and a task's result wait for
//! [`Borrows::settled`] first.
//!
//! A task may arrive with the finished values of objects that references
//! in its arguments name, lent by its caller (see [`crate::objects::lent_objects`]):
//! they are kept while the task runs, and with each reference taken
//! meanwhile for as long as this process holds it, so its gets need not
//! ask the owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use raylet_proto::owner_calls::LocalOwners;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;
use raylet_proto::v1::{BorrowerChange, UpdateBorrowersRequest};
use raylet_proto::{IdMap, ObjectId};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::context::Context;
use crate::objects::object_ref::handle::{HandleCounter, RawRef};
use crate::value::Outcome;

/// One change of a borrower's count at an owner.
pub(crate) struct Change {
    owner: Arc<str>,
    object: ObjectId,
    borrower: Arc<str>,
    delta: i32,
}

struct Borrowed {
    owner: Arc<str>,
    /// Handles in this process.
    handles: u32,
    /// How often the owner counted this process as a borrower.
    registrations: u32,
    /// The object's outcome, when a task's caller lent it.
    value: Option<Outcome>,
}

/// An outcome lent with the tasks that run here now.
struct Lent {
    outcome: Outcome,
    /// Running tasks that came with it.
    tasks: u32,
}

#[derive(Default)]
struct Table {
    borrowed: IdMap<ObjectId, Borrowed>,
    lent: IdMap<ObjectId, Lent>,
}

/// Borrowed references by object, and the channel to their owners.
pub(crate) struct Borrows {
    address: Arc<str>,
    table: Mutex<Table>,
    changes: mpsc::UnboundedSender<Change>,
    /// Registrations sent but not yet acknowledged.
    unacknowledged: watch::Sender<usize>,
}

impl Borrows {
    /// Borrows of the process whose owner service is at `address`; changes
    /// go to `changes`, which [`send_changes`] delivers.
    pub(crate) fn new(address: Arc<str>, changes: mpsc::UnboundedSender<Change>) -> Self {
        Borrows {
            address,
            table: Mutex::new(Table::default()),
            changes,
            unacknowledged: watch::Sender::new(0),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps outcomes a task's caller lent until the returned guard drops,
    /// when the task is done.
    pub(crate) fn lend(self: &Arc<Self>, outcomes: Vec<(ObjectId, Outcome)>) -> LentForTask {
        let mut ids = Vec::with_capacity(outcomes.len());
        if !outcomes.is_empty() {
            let mut table = self.table();
            for (id, outcome) in outcomes {
                table.lent.entry(id).or_insert(Lent { outcome, tasks: 0 }).tasks += 1;
                ids.push(id);
            }
        }
        LentForTask {
            borrows: self.clone(),
            ids,
        }
    }

    /// The outcome of a borrowed object, when its caller lent it.
    pub(crate) fn lent_outcome(&self, id: ObjectId) -> Option<Outcome> {
        let table = self.table();
        match table.borrowed.get(&id).and_then(|b| b.value.as_ref()) {
            Some(outcome) => Some(outcome.clone()),
            None => table.lent.get(&id).map(|lent| lent.outcome.clone()),
        }
    }

    /// A new handle to a borrowed object. The first one registers this
    /// process with the owner, unless the sender of the reference did so
    /// for us already (`preregistered`).
    pub(crate) fn take(&self, raw: &RawRef, preregistered: bool) {
        let mut table = self.table();
        let Table { borrowed, lent } = &mut *table;
        let borrowed = borrowed.entry(raw.id).or_insert_with(|| Borrowed {
            owner: raw.owner.clone(),
            handles: 0,
            registrations: 0,
            value: None,
        });
        if borrowed.value.is_none() {
            borrowed.value = lent.get(&raw.id).map(|lent| lent.outcome.clone());
        }
        borrowed.handles += 1;
        let register = borrowed.registrations == 0 && !preregistered;
        if preregistered || register {
            borrowed.registrations += 1;
        }
        drop(table);
        if register {
            self.send(raw.owner.clone(), raw.id, self.address.clone(), 1);
        }
    }

    /// A handle is gone; the last one unregisters this process.
    pub(crate) fn drop_handle(&self, id: ObjectId) {
        let mut table = self.table();
        let Some(borrowed) = table.borrowed.get_mut(&id) else {
            return;
        };
        borrowed.handles -= 1;
        if borrowed.handles > 0 {
            return;
        }
        let Some(gone) = table.borrowed.remove(&id) else {
            return;
        };
        drop(table);
        let change = Change {
            owner: gone.owner,
            object: id,
            borrower: self.address.clone(),
            delta: -(gone.registrations as i32),
        };
        let _ = self.changes.send(change);
    }

    /// Registers `borrower` with the owner of `raw`, on its behalf: a task
    /// returns a reference that it does not own to its caller.
    pub(crate) fn register_for(&self, raw: &RawRef, borrower: &str) {
        self.send(raw.owner.clone(), raw.id, borrower.into(), 1);
    }

    fn send(&self, owner: Arc<str>, object: ObjectId, borrower: Arc<str>, delta: i32) {
        self.unacknowledged.send_modify(|count| *count += 1);
        let change = Change {
            owner,
            object,
            borrower,
            delta,
        };
        if self.changes.send(change).is_err() {
            self.unacknowledged.send_modify(|count| *count -= 1);
        }
    }

    pub(crate) fn is_settled(&self) -> bool {
        *self.unacknowledged.borrow() == 0
    }

    /// Waits until every registration sent so far was acknowledged.
    pub(crate) async fn settled(&self) {
        let mut receiver = self.unacknowledged.subscribe();
        let _ = receiver.wait_for(|count| *count == 0).await;
    }
}

/// The outcomes lent with one running task; dropping it ends their loan,
/// except to the references taken meanwhile.
pub(crate) struct LentForTask {
    borrows: Arc<Borrows>,
    ids: Vec<ObjectId>,
}

impl Drop for LentForTask {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut table = self.borrows.table();
        for id in &self.ids {
            if let Some(lent) = table.lent.get_mut(id) {
                lent.tasks -= 1;
                if lent.tasks == 0 {
                    table.lent.remove(id);
                }
            }
        }
    }
}

/// Delivers borrower changes to their owners, in batches: one call per
/// owner for everything that queued up meanwhile, through the owner's
/// same-node socket when it runs on this machine (`local`), else gRPC.
pub(crate) async fn send_changes(
    ctx: Arc<Context>,
    borrows: Arc<Borrows>,
    mut changes: mpsc::UnboundedReceiver<Change>,
    local: Option<Arc<LocalOwners>>,
) {
    while let Some(first) = changes.recv().await {
        let mut batch = vec![first];
        while let Ok(next) = changes.try_recv() {
            batch.push(next);
        }
        let registrations = batch.iter().filter(|c| c.delta > 0).count();
        let mut calls = JoinSet::new();
        for (owner, request) in by_owner(batch) {
            let (ctx, local) = (ctx.clone(), local.clone());
            calls.spawn(async move {
                if let Some(request) = update_owner_here(local, &owner, request).await {
                    update_owner(&ctx, &owner, request).await;
                }
            });
        }
        calls.join_all().await;
        borrows
            .unacknowledged
            .send_modify(|count| *count = count.saturating_sub(registrations));
    }
}

/// Groups changes by owner, summing those of one object and borrower.
fn by_owner(batch: Vec<Change>) -> HashMap<Arc<str>, UpdateBorrowersRequest> {
    let mut sums: HashMap<(Arc<str>, ObjectId, Arc<str>), i32> = HashMap::new();
    for change in batch {
        *sums.entry((change.owner, change.object, change.borrower)).or_default() += change.delta;
    }
    let mut requests: HashMap<Arc<str>, UpdateBorrowersRequest> = HashMap::new();
    for ((owner, object, borrower), delta) in sums.into_iter().filter(|(_, delta)| *delta != 0) {
        requests.entry(owner).or_default().changes.push(BorrowerChange {
            object_id: object.as_bytes().to_vec(),
            borrower_address: borrower.to_string(),
            delta,
        });
    }
    requests
}

/// Delivers `request` through the owner's same-node socket, on a blocking
/// thread; it comes back when it is to be sent over gRPC.
async fn update_owner_here(
    local: Option<Arc<LocalOwners>>,
    owner: &Arc<str>,
    request: UpdateBorrowersRequest,
) -> Option<UpdateBorrowersRequest> {
    let Some(local) = local else {
        return Some(request);
    };
    let owner = owner.clone();
    let updated = tokio::task::spawn_blocking(move || local.update_borrowers(&owner, request)).await;
    match updated {
        Ok(sent) => sent.err(),
        Err(error) => {
            tracing::warn!(%error, "a borrower update was lost with its thread");
            None
        }
    }
}

async fn update_owner(ctx: &Context, owner: &str, request: UpdateBorrowersRequest) {
    let sent = async {
        let channel = ctx.channel(owner).await?;
        OwnerServiceClient::new(channel)
            .update_borrowers(request)
            .await
            .map_err(raylet_proto::Error::from)?;
        Ok::<_, crate::Error>(())
    };
    if let Err(error) = sent.await {
        tracing::debug!(%owner, %error, "cannot update the borrowers of objects; their owner may be gone");
    }
}

impl HandleCounter for Borrows {
    fn handle_dropped(&self, id: ObjectId) {
        self.drop_handle(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{Body, EncodedValue, Format};

    fn value(byte: u8) -> Outcome {
        Ok(EncodedValue::new::<u8>(
            Format::Postcard,
            Body::Inline(vec![byte].into()),
            Vec::new(),
        ))
    }

    fn lent_byte(borrows: &Borrows, id: ObjectId) -> Option<u8> {
        match borrows.lent_outcome(id)?.ok()?.body {
            Body::Inline(data) => Some(data[0]),
            Body::Stored(_) => None,
        }
    }

    #[test]
    fn a_lent_value_lives_with_its_task_and_with_the_references_taken_meanwhile() {
        let (changes, _receiver) = mpsc::unbounded_channel();
        let borrows = Arc::new(Borrows::new("127.0.0.1:2".into(), changes));
        let (kept, passed) = (ObjectId::random(), ObjectId::random());
        let owner: Arc<str> = "127.0.0.1:1".into();
        let task = borrows.lend(vec![(kept, value(1)), (passed, value(2))]);
        let second_task = borrows.lend(vec![(passed, value(2))]);
        borrows.take(&RawRef { id: kept, owner }, true);
        assert_eq!(
            (lent_byte(&borrows, kept), lent_byte(&borrows, passed)),
            (Some(1), Some(2))
        );
        drop(task);
        assert_eq!(
            (lent_byte(&borrows, kept), lent_byte(&borrows, passed)),
            (Some(1), Some(2))
        );
        drop(second_task);
        assert_eq!(
            (lent_byte(&borrows, kept), lent_byte(&borrows, passed)),
            (Some(1), None)
        );
        borrows.drop_handle(kept);
        assert_eq!(lent_byte(&borrows, kept), None);
    }
}
