//! The gRPC face of the head: decode, validate, call the node table, encode.
//! A call that changes the table is answered once the change is on disk.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use raylet_cluster_status::{NodeStats, ResourceDemand};
use raylet_proto::scheduling::{labels_from_proto, labels_to_proto};
use raylet_proto::v1::head_service_server::HeadService;
use raylet_proto::v1::{
    ClusterStatus, DrainNodeReply, DrainNodeRequest, GetClusterStatusRequest, HeartbeatReply, HeartbeatRequest,
    NodeDeath, NodeResources, RegisterNodeReply, RegisterNodeRequest, UnregisterNodeReply, UnregisterNodeRequest,
    WatchNodeDeathsRequest,
};
use raylet_proto::{NodeId, ResourceSet};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use super::node_table::{Heartbeat, HeartbeatOutcome, NodeResourcesView, NodeTable, Registration};
use super::placement_groups::{GroupManager, NodeManagerBundles};
use super::state_store::StateError;
use super::wire::{Coded, TextTooLong, bounded_text, on_the_wire};

/// What the head service answers a refused or failed call with.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// Only an alive node can be drained.
    #[error("node {node_id} is not alive")]
    NodeNotAlive { node_id: NodeId },
    #[error(transparent)]
    TextTooLong(#[from] TextTooLong),
    /// A field of the request does not decode: an id, resources, labels or
    /// an address.
    #[error("{}", .0.message())]
    Malformed(#[from] raylet_proto::Error),
    /// The change could not be written to the head's state.
    #[error(transparent)]
    State(#[from] StateError),
}

impl Coded for HeadError {
    fn code(&self) -> Code {
        match self {
            HeadError::NodeNotAlive { .. } => Code::NotFound,
            HeadError::TextTooLong(_) => Code::InvalidArgument,
            HeadError::Malformed(error) => error.code(),
            HeadError::State(error) => error.code(),
        }
    }
}

on_the_wire!(HeadError);

type Result<T, E = HeadError> = std::result::Result<T, E>;

/// Serves [`HeadService`] over a shared [`NodeTable`].
pub(crate) struct HeadServiceImpl {
    pub(crate) table: Arc<Mutex<NodeTable>>,
    pub(crate) groups: Arc<GroupManager<NodeManagerBundles>>,
    /// Set when the head stops: death watches end.
    pub(crate) stopping: watch::Receiver<bool>,
}

impl HeadServiceImpl {
    fn table(&self) -> std::sync::MutexGuard<'_, NodeTable> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[tonic::async_trait]
impl HeadService for HeadServiceImpl {
    type WatchNodeDeathsStream = ReceiverStream<Result<NodeDeath, Status>>;

    async fn register_node(
        &self,
        request: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeReply>, Status> {
        let registration = decode_registration(request.into_inner())?;
        let (incarnation, stored) = {
            let mut table = self.table();
            (table.register(registration, Instant::now()), table.flushed())
        };
        stored.await?;
        Ok(Response::new(RegisterNodeReply { incarnation }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatReply>, Status> {
        let heartbeat = decode_heartbeat(request.into_inner())?;
        let mut table = self.table();
        let outcome = table.heartbeat(heartbeat, Instant::now());
        let must_reregister = outcome == HeartbeatOutcome::MustReregister;
        let cluster_view = table.alive_resources().into_iter().map(encode_node_resources).collect();
        Ok(Response::new(HeartbeatReply {
            must_reregister,
            cluster_view,
            launchable: table.launchable().to_proto(),
        }))
    }

    async fn unregister_node(
        &self,
        request: Request<UnregisterNodeRequest>,
    ) -> Result<Response<UnregisterNodeReply>, Status> {
        let request = request.into_inner();
        let node_id = NodeId::from_wire(&request.node_id)?;
        let reason = bounded_text("reason", request.reason)?;
        let stored = {
            let mut table = self.table();
            table.unregister(node_id, request.incarnation, &reason);
            table.flushed()
        };
        stored.await?;
        Ok(Response::new(UnregisterNodeReply {}))
    }

    async fn get_cluster_status(
        &self,
        _request: Request<GetClusterStatusRequest>,
    ) -> Result<Response<ClusterStatus>, Status> {
        let mut status = self.table().snapshot();
        status.placement_groups = self.groups.demands();
        Ok(Response::new(status.to_proto()))
    }

    async fn drain_node(&self, request: Request<DrainNodeRequest>) -> Result<Response<DrainNodeReply>, Status> {
        let request = request.into_inner();
        let node_id = NodeId::from_wire(&request.node_id)?;
        let reason = bounded_text("reason", request.reason)?;
        let (drained, stored) = {
            let mut table = self.table();
            (table.drain(node_id, &reason), table.flushed())
        };
        if !drained {
            return Err(HeadError::NodeNotAlive { node_id }.into());
        }
        stored.await?;
        Ok(Response::new(DrainNodeReply {}))
    }

    async fn watch_node_deaths(
        &self,
        _request: Request<WatchNodeDeathsRequest>,
    ) -> Result<Response<Self::WatchNodeDeathsStream>, Status> {
        let (deaths, stream) = mpsc::channel(64);
        tokio::spawn(send_node_deaths(self.table.clone(), deaths, self.stopping.clone()));
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// Sends each dead incarnation once, those dead already first, while it is
/// its node's latest, until the watcher goes or the head stops.
async fn send_node_deaths(
    table: Arc<Mutex<NodeTable>>,
    deaths: mpsc::Sender<Result<NodeDeath, Status>>,
    mut stopping: watch::Receiver<bool>,
) {
    let lock = || table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut changed = lock().watch_deaths();
    let mut sent = std::collections::HashSet::new();
    loop {
        let dead = lock().latest_deaths();
        for node in dead {
            if sent.insert((node.node_id, node.incarnation)) {
                let death = NodeDeath {
                    node_id: node.node_id.as_bytes().to_vec(),
                    incarnation: node.incarnation,
                    address: node.address,
                    reason: node.death_reason.unwrap_or_default(),
                };
                if deaths.send(Ok(death)).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            changed = changed.changed() => if changed.is_err() { return },
            () = deaths.closed() => return,
            _ = stopping.wait_for(|stopping| *stopping) => return,
        }
    }
}

fn decode_registration(request: RegisterNodeRequest) -> Result<Registration> {
    let address = bounded_text("address", request.address)?;
    raylet_proto::channel::endpoint(&address)?;
    Ok(Registration {
        node_id: NodeId::from_wire(&request.node_id)?,
        address,
        hostname: bounded_text("hostname", request.hostname)?,
        is_head_node: request.is_head_node,
        total: ResourceSet::from_proto(&request.total.unwrap_or_default())?,
        labels: labels_from_proto(&request.labels)?,
        metrics_address: match request.metrics_address.is_empty() {
            true => None,
            false => Some(bounded_text("metrics_address", request.metrics_address)?),
        },
    })
}

fn decode_heartbeat(request: HeartbeatRequest) -> Result<Heartbeat> {
    Ok(Heartbeat {
        node_id: NodeId::from_wire(&request.node_id)?,
        incarnation: request.incarnation,
        total: ResourceSet::from_proto(&request.total.unwrap_or_default())?,
        available: ResourceSet::from_proto(&request.available.unwrap_or_default())?,
        stats: NodeStats::from_proto(request.stats.unwrap_or_default()),
        demands: request
            .demands
            .iter()
            .take(MAX_DEMANDS)
            .map(ResourceDemand::from_proto)
            .collect::<Result<_, raylet_proto::Error>>()?,
    })
}

fn encode_node_resources(node: NodeResourcesView) -> NodeResources {
    NodeResources {
        node_id: node.node_id.as_bytes().to_vec(),
        address: node.address,
        total: Some(node.total.to_proto()),
        available: Some(node.available.to_proto()),
        labels: labels_to_proto(&node.labels),
    }
}

/// The most demand shapes one heartbeat may carry.
const MAX_DEMANDS: usize = 100;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use raylet_common::auth::AuthToken;

    use super::*;

    fn service() -> HeadServiceImpl {
        let table = Arc::new(Mutex::new(NodeTable::new(Duration::from_secs(5))));
        let bundles = NodeManagerBundles::new(AuthToken::generate());
        HeadServiceImpl {
            groups: Arc::new(GroupManager::new(table.clone(), bundles)),
            table,
            stopping: watch::channel(false).1,
        }
    }

    async fn drain(service: &HeadServiceImpl, node_id: Vec<u8>, reason: &str) -> Status {
        let request = DrainNodeRequest {
            node_id,
            reason: reason.into(),
        };
        service.drain_node(Request::new(request)).await.unwrap_err()
    }

    #[tokio::test]
    async fn a_drain_answers_each_refusal_with_its_code_and_its_text_once() {
        let service = service();
        let node_id = NodeId::random();
        let unknown = drain(&service, node_id.as_bytes().to_vec(), "idle").await;
        assert_eq!(unknown.code(), Code::NotFound);
        assert_eq!(unknown.message(), format!("node {node_id} is not alive"));
        let long = drain(&service, node_id.as_bytes().to_vec(), &"x".repeat(2000)).await;
        assert_eq!(long.code(), Code::InvalidArgument);
        assert_eq!(long.message(), "reason is 2000 bytes long; the limit is 1024");
        let malformed = drain(&service, vec![1, 2, 3], "idle").await;
        assert_eq!(malformed.code(), Code::InvalidArgument);
        assert!(!malformed.message().starts_with("invalid argument"), "{malformed:?}");
    }
}
