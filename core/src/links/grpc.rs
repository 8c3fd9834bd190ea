//! The links over the network: gRPC to node managers and the head, task
//! streams to workers, on the process's shared channels.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use raylet_proto::task_stream::{self, StreamClosed, TaskSender};
use raylet_proto::v1::actor_service_client::ActorServiceClient;
use raylet_proto::v1::head_service_client::HeadServiceClient;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{
    ActorWatchEvent, GetWorkerExitRequest, LeaseSessionEvent, LeaseSessionRequest, TaskBatch, WatchActorRequest,
    WatchNodeDeathsRequest, WorkerExit,
};
use raylet_proto::{NodeId, WorkerId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{EventHandler, HeadLink, Incoming, Links, NodeDeath, NodeManagerLink, Reply, TaskOutlet, WorkerLink};
use crate::links::channels::Channels;

/// A leased worker listens already when its lease is granted.
const WORKER_CONNECT_PATIENCE: Duration = Duration::from_secs(2);

/// Links over the network, on `channels`, to the head at `head`.
pub(crate) fn grpc_links(channels: Arc<Channels>, head: String) -> Links {
    let links = Arc::new(GrpcLinks { channels, head });
    Links {
        nodes: links.clone(),
        head: links.clone(),
        workers: links,
    }
}

/// gRPC to node managers and the head, task streams to workers.
struct GrpcLinks {
    channels: Arc<Channels>,
    head: String,
}

impl NodeManagerLink for GrpcLinks {
    fn lease_session(
        &self,
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    ) -> Reply<Incoming<LeaseSessionEvent>> {
        let channels = self.channels.clone();
        Box::pin(async move {
            let channel = channels.get(&node).await?;
            let reply = NodeManagerServiceClient::new(channel)
                .lease_session(UnboundedReceiverStream::new(requests))
                .await;
            let inbound = reply.map_err(raylet_proto::Error::from)?.into_inner();
            Ok(messages(inbound, Some))
        })
    }

    fn worker_exit(&self, node: Arc<str>, worker: WorkerId) -> Reply<WorkerExit> {
        let channels = self.channels.clone();
        Box::pin(async move {
            let channel = channels.get(&node).await?;
            let request = GetWorkerExitRequest {
                worker_id: worker.as_bytes().to_vec(),
            };
            let reply = NodeManagerServiceClient::new(channel).get_worker_exit(request).await;
            Ok(reply.map_err(raylet_proto::Error::from)?.into_inner())
        })
    }
}

impl HeadLink for GrpcLinks {
    fn node_deaths(&self) -> Reply<Incoming<NodeDeath>> {
        let (channels, head) = (self.channels.clone(), self.head.clone());
        Box::pin(async move {
            let channel = channels.get(&head).await?;
            let reply = HeadServiceClient::new(channel)
                .watch_node_deaths(WatchNodeDeathsRequest {})
                .await;
            let deaths = reply.map_err(raylet_proto::Error::from)?.into_inner();
            Ok(messages(deaths, |death| {
                Some(NodeDeath {
                    node_id: NodeId::from_wire(&death.node_id).ok()?,
                    incarnation: death.incarnation,
                    address: death.address,
                    reason: death.reason,
                })
            }))
        })
    }

    fn watch_actors(&self, requests: mpsc::UnboundedReceiver<WatchActorRequest>) -> Reply<Incoming<ActorWatchEvent>> {
        let (channels, head) = (self.channels.clone(), self.head.clone());
        Box::pin(async move {
            let channel = channels.get(&head).await?;
            let reply = ActorServiceClient::new(channel)
                .watch_actors(UnboundedReceiverStream::new(requests))
                .await;
            Ok(messages(reply.map_err(raylet_proto::Error::from)?.into_inner(), Some))
        })
    }
}

impl WorkerLink for GrpcLinks {
    fn task_stream(&self, address: String, events: EventHandler) -> Reply<Box<dyn TaskOutlet>> {
        let channels = self.channels.clone();
        Box::pin(async move {
            let (tasks, reader) = task_stream::open(&address, channels.token(), WORKER_CONNECT_PATIENCE).await?;
            reader.deliver(events);
            Ok(Box::new(tasks) as Box<dyn TaskOutlet>)
        })
    }
}

impl TaskOutlet for TaskSender {
    fn send(&self, batch: &TaskBatch) -> std::result::Result<(), StreamClosed> {
        TaskSender::send(self, batch)
    }
}

/// A gRPC stream's messages, each turned by `convert` (those it gives
/// `None` for are skipped), until the stream ends or fails.
fn messages<M: Send + 'static, T: Send + 'static>(
    inbound: tonic::Streaming<M>,
    convert: fn(M) -> Option<T>,
) -> Incoming<T> {
    stream::unfold(Some(inbound), move |inbound| async move {
        let mut inbound = inbound?;
        loop {
            match inbound.message().await {
                Ok(Some(message)) => match convert(message) {
                    Some(converted) => return Some((Ok(converted), Some(inbound))),
                    None => continue,
                },
                Ok(None) => return None,
                Err(status) => return Some((Err(raylet_proto::Error::from(status).into()), None)),
            }
        }
    })
    .boxed()
}
