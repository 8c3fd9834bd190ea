//! An actor as `raylet list actors` and `Cluster::list_actors` show it.

use raylet_proto::v1::{self, ActorRecord};
use raylet_proto::{ActorId, NodeId};
use serde::Serialize;

use crate::Result;

/// Where an actor is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActorState {
    /// Being placed or constructed for the first time.
    Pending,
    Alive,
    /// Its process died; it is being placed and constructed again.
    Restarting,
    Dead,
}

impl std::fmt::Display for ActorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActorState::Pending => "PENDING",
            ActorState::Alive => "ALIVE",
            ActorState::Restarting => "RESTARTING",
            ActorState::Dead => "DEAD",
        })
    }
}

/// One actor of the cluster.
#[derive(Clone, Debug, Serialize)]
pub struct ActorInfo {
    pub id: ActorId,
    pub class_name: String,
    pub name: String,
    pub namespace: String,
    pub state: ActorState,
    /// The node it runs on, while it is alive.
    pub node_id: Option<NodeId>,
    pub pid: u32,
    pub restarts: u32,
    /// Why it is dead, or why it last restarted.
    pub death_cause: String,
    pub owner_address: String,
    pub detached: bool,
}

impl ActorInfo {
    pub(crate) fn from_record(record: ActorRecord) -> Result<Self> {
        let state = match record.state() {
            v1::ActorState::Alive => ActorState::Alive,
            v1::ActorState::Restarting => ActorState::Restarting,
            v1::ActorState::Dead => ActorState::Dead,
            v1::ActorState::Pending | v1::ActorState::Unspecified => ActorState::Pending,
        };
        Ok(ActorInfo {
            id: ActorId::from_wire(&record.actor_id)?,
            node_id: NodeId::from_wire(&record.node_id).ok(),
            class_name: record.class_name,
            name: record.name,
            namespace: record.namespace,
            state,
            pid: record.pid,
            restarts: record.restarts,
            death_cause: record.death_cause,
            owner_address: record.owner_address,
            detached: record.detached,
        })
    }
}
