//! What the placement group service answers a refused or failed call
//! with, with the gRPC code of each answer, and why a node manager did not
//! do a bundle operation.

use raylet_proto::PlacementGroupId;
use tonic::Code;

use crate::state_store::StateError;
use crate::wire::{Coded, TextTooLong, on_the_wire};

#[derive(Debug, thiserror::Error)]
pub enum PlacementGroupError {
    #[error("placement group call {call_id} names no operation")]
    NoOperation { call_id: u64 },
    #[error("a placement group may have at most {limit} bundles, got {count}")]
    TooManyBundles { count: usize, limit: usize },
    #[error("placement group {group_id} exists already")]
    Exists { group_id: PlacementGroupId },
    #[error("placement group {group_id} does not exist")]
    UnknownGroup { group_id: PlacementGroupId },
    #[error(transparent)]
    TextTooLong(#[from] TextTooLong),
    /// A field of the request does not decode, or its bundles are not a
    /// group's (empty, or one of them empty).
    #[error("{}", .0.message())]
    Malformed(#[from] raylet_proto::Error),
    /// The change could not be written to the head's state.
    #[error(transparent)]
    State(#[from] StateError),
}

impl Coded for PlacementGroupError {
    fn code(&self) -> Code {
        match self {
            PlacementGroupError::NoOperation { .. }
            | PlacementGroupError::TooManyBundles { .. }
            | PlacementGroupError::TextTooLong(_) => Code::InvalidArgument,
            PlacementGroupError::Exists { .. } => Code::AlreadyExists,
            PlacementGroupError::UnknownGroup { .. } => Code::NotFound,
            PlacementGroupError::Malformed(error) => error.code(),
            PlacementGroupError::State(error) => error.code(),
        }
    }
}

on_the_wire!(PlacementGroupError);

/// Why a node manager did not do a bundle operation; the group waits and
/// is placed again.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BundleCallError {
    /// The node refused it: it lacks the resources, or does not hold the
    /// bundles.
    #[error("{reason}")]
    Refused { reason: String },
    /// The node could not be reached, or the call failed.
    #[error(transparent)]
    Unreachable(#[from] raylet_proto::Error),
    /// The head's sender to the node is gone.
    #[error("the sender to node {address} has stopped")]
    SenderStopped { address: String },
    #[error("node {address} answered {answered} results for {asked} bundle operations")]
    WrongAnswerCount {
        address: String,
        answered: usize,
        asked: usize,
    },
}
