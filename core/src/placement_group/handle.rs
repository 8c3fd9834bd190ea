//! The placement group handle: the group's id and size, and what its
//! creator learned of the creation; how it travels inside values. Waiting
//! for and removing the group are in `mod.rs`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use raylet_proto::PlacementGroupId;
use raylet_proto::v1;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// A placement group. It is `Clone` and `Serialize`: tasks and actors that
/// get it can run work in it too.
#[derive(Clone, Debug)]
pub struct PlacementGroup {
    pub(super) id: PlacementGroupId,
    pub(super) bundle_count: u32,
    /// The head's answer to the creation, in the handle that created the
    /// group: `ready()` and `remove()` wait for it first.
    pub(super) creation: Option<watch::Receiver<Option<Creation>>>,
    /// Set once `remove()` was called on this handle or a clone of it.
    pub(super) removed: Arc<AtomicBool>,
}

/// How the head answered the creation: the group's state then, or why it refused.
pub(super) type Creation = Result<v1::PlacementGroupState, raylet_proto::Error>;

impl PartialEq for PlacementGroup {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for PlacementGroup {}

/// How a placement group handle travels.
#[derive(Serialize, Deserialize)]
struct WireGroup {
    #[serde(with = "serde_bytes")]
    id: Vec<u8>,
    bundle_count: u32,
}

impl Serialize for PlacementGroup {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = WireGroup {
            id: self.id.as_bytes().to_vec(),
            bundle_count: self.bundle_count,
        };
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PlacementGroup {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireGroup::deserialize(deserializer)?;
        let id = PlacementGroupId::from_wire(&wire.id).map_err(serde::de::Error::custom)?;
        Ok(PlacementGroup {
            id,
            bundle_count: wire.bundle_count,
            creation: None,
            removed: Arc::default(),
        })
    }
}

impl PlacementGroup {
    pub fn id(&self) -> PlacementGroupId {
        self.id
    }

    pub fn bundle_count(&self) -> u32 {
        self.bundle_count
    }
}
