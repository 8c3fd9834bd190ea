//! Objects from their owner's side and their borrowers': the `ObjectRef`
//! users hold (`object_ref/`, with `archived.rs` for values read in place),
//! the owner's table of the objects it owns (`memory_store.rs`) and the
//! service that other processes fetch them from (`owner_service.rs`,
//! `owner_error.rs`), large values in the node's shared-memory store
//! (`shared_objects.rs`), and reference counting across processes: the
//! references borrowed from other owners (`borrows.rs`), the watch over
//! borrowers that die (`borrower_watch.rs`) and the objects lent with a
//! task (`lent_objects.rs`). `owner.rs` holds these tables together.

pub(crate) mod archived;
pub(crate) mod borrower_watch;
pub(crate) mod borrows;
pub(crate) mod lent_objects;
pub(crate) mod memory_store;
pub(crate) mod object_ref;
pub(crate) mod owner;
pub(crate) mod owner_error;
pub(crate) mod owner_service;
pub(crate) mod shared_objects;
