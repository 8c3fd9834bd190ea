//! What the actor service answers a refused or failed call with, and the
//! gRPC code of each answer.

use raylet_proto::ActorId;
use tonic::Code;

use crate::state_store::StateError;
use crate::wire::{Coded, TextTooLong, on_the_wire};

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error("an actor needs the binary that hosts it")]
    NoBinary,
    #[error("max_concurrency must be at least 1")]
    NoConcurrency,
    #[error("an owner session must start with the owner's address")]
    NoOwnerAddress,
    #[error("actor {actor_id} exists already")]
    Exists { actor_id: ActorId },
    /// A live actor of the namespace has the name.
    #[error("an actor named '{name}' lives in namespace '{namespace}' already")]
    NameTaken { name: String, namespace: String },
    #[error("no actor {actor_id}")]
    UnknownActor { actor_id: ActorId },
    #[error("no live actor named '{name}' in namespace '{namespace}'")]
    NoLiveActorNamed { name: String, namespace: String },
    #[error(transparent)]
    TextTooLong(#[from] TextTooLong),
    /// A field of the request does not decode (an id, resources, a
    /// strategy), or the caller's stream failed.
    #[error("{}", .0.message())]
    Malformed(#[from] raylet_proto::Error),
    /// The change could not be written to the head's state.
    #[error(transparent)]
    State(#[from] StateError),
}

impl Coded for ActorError {
    fn code(&self) -> Code {
        match self {
            ActorError::NoBinary
            | ActorError::NoConcurrency
            | ActorError::NoOwnerAddress
            | ActorError::TextTooLong(_) => Code::InvalidArgument,
            ActorError::Exists { .. } | ActorError::NameTaken { .. } => Code::AlreadyExists,
            ActorError::UnknownActor { .. } | ActorError::NoLiveActorNamed { .. } => Code::NotFound,
            ActorError::Malformed(error) => error.code(),
            ActorError::State(error) => error.code(),
        }
    }
}

on_the_wire!(ActorError);
