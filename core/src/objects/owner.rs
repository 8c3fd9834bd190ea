//! A process as an owner: the objects it owns, those it borrows, the
//! states of its tasks on their way to the head and the streams of its
//! generator calls, with its context. The
//! submitter, the actor clients and the background work on these tables
//! take this, not the whole core.

use std::sync::{Arc, Weak};

use raylet_proto::{ObjectId, v1};

use crate::context::Context;
use crate::generator::table::Generators;
use crate::objects::borrows::Borrows;
use crate::objects::memory_store::MemoryStore;
use crate::objects::object_ref::handle::{AnyObjectRef, HandleCounter, RawRef};
use crate::observability::task_events::TaskEvents;
use crate::task_error::TaskError;
use crate::value::{Outcome, outcome_from_proto};

pub(crate) struct Owner {
    pub(crate) ctx: Arc<Context>,
    pub(crate) store: Arc<MemoryStore>,
    pub(crate) borrows: Arc<Borrows>,
    pub(crate) task_events: Arc<TaskEvents>,
    /// The generator calls whose streams are open.
    pub(crate) generators: Generators,
}

impl Owner {
    pub(crate) fn owns(&self, object: &AnyObjectRef) -> bool {
        *object.raw().owner == *self.ctx.address
    }

    /// Fails every object that `returns` names with `error`.
    pub(crate) fn fail_all(&self, returns: impl IntoIterator<Item = ObjectId>, error: TaskError) {
        self.store
            .complete_many(returns.into_iter().map(|id| (id, Err(error.clone()))));
    }

    /// A finished object's outcome from the wire; references inside a
    /// value, which the sender registered us for, are held as long as the
    /// value is.
    pub(crate) fn adopt_outcome(&self, outcome: v1::ObjectOutcome) -> Outcome {
        let (mut outcome, contained) = outcome_from_proto(outcome);
        if let Ok(value) = &mut outcome
            && !contained.is_empty()
        {
            value.contained = contained.into_iter().map(|raw| self.adopt(raw, true)).collect();
        }
        outcome
    }

    /// Takes in the items of generator calls that a worker sent.
    pub(crate) fn absorb_items(&self, items: Vec<v1::GeneratorItem>) {
        if !items.is_empty() {
            self.generators.absorb(items, |outcome| self.adopt_outcome(outcome));
        }
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
