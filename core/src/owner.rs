//! A process as an owner: the objects it owns, those it borrows, and the
//! states of its tasks on their way to the head, with its context. The
//! submitter, the actor clients and the background work on these tables
//! take this, not the whole core.

use std::sync::{Arc, Weak};

use crate::borrows::Borrows;
use crate::context::Context;
use crate::memory_store::MemoryStore;
use crate::object_ref::handle::{AnyObjectRef, HandleCounter, RawRef};
use crate::task_events::TaskEvents;

pub(crate) struct Owner {
    pub(crate) ctx: Arc<Context>,
    pub(crate) store: Arc<MemoryStore>,
    pub(crate) borrows: Arc<Borrows>,
    pub(crate) task_events: Arc<TaskEvents>,
}

impl Owner {
    pub(crate) fn owns(&self, object: &AnyObjectRef) -> bool {
        *object.raw().owner == *self.ctx.address
    }

    /// A handle that keeps the object alive in this process, whoever owns
    /// it; `preregistered` when the sender registered us with the owner.
    pub(crate) fn adopt(&self, raw: RawRef, preregistered: bool) -> AnyObjectRef {
        if *raw.owner == *self.ctx.address {
            return AnyObjectRef::owned(raw, &self.store);
        }
        self.borrows.take(&raw, preregistered);
        let counter: Weak<dyn HandleCounter> = Arc::downgrade(&self.borrows) as Weak<Borrows>;
        AnyObjectRef::counted(raw, counter)
    }
}
