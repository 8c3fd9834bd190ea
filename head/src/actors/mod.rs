//! The head's actors: the table of every actor, the life of each one (place,
//! construct, restart, die), the lease sessions that host them, and the
//! gRPC service that creates, finds, watches, lists and kills them.

mod error;
mod leases;
mod lifecycle;
mod service;
mod table;

pub use error::ActorError;
pub use leases::{Grant, HeadLeases, LeaseAnswer, LeaseError};
pub use table::{ActorSpec, ActorTable, KillOrder, RecoveredActor};

pub(crate) use lifecycle::{ActorRuntime, resume_actors};
pub(crate) use service::ActorServiceImpl;
