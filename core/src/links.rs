//! The edges where a process reaches other processes to run its tasks: node
//! managers (lease sessions, worker exits), the head (node deaths) and
//! leased workers (task streams). [`GrpcLinks`] crosses the network; the
//! submitter's unit tests put in-process virtual links in its place
//! (core/src/submitter/tests/harness.rs), so that leasing, retries and
//! lineage run without processes or sockets.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};
use raylet_proto::task_stream::{self, StreamClosed, TaskSender};
use raylet_proto::v1::head_service_client::HeadServiceClient;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{
    GetWorkerExitRequest, LeaseSessionEvent, LeaseSessionRequest, TaskBatch, WatchNodeDeathsRequest, WorkerEvents,
    WorkerExit,
};
use raylet_proto::{NodeId, WorkerId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::Result;
use crate::channels::Channels;

/// A leased worker listens already when its lease is granted.
const WORKER_CONNECT_PATIENCE: Duration = Duration::from_secs(2);

/// An answer from another process.
pub(crate) type Reply<T> = BoxFuture<'static, Result<T>>;
/// What another process sends until it ends the stream.
pub(crate) type Incoming<T> = BoxStream<'static, Result<T>>;

/// A node incarnation the head counts dead.
pub(crate) struct NodeDeath {
    pub(crate) node_id: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) address: String,
    pub(crate) reason: String,
}

/// Reaching node managers for leases, and the head for which nodes died.
pub(crate) trait NodeManagerLink: Send + Sync {
    /// Opens a lease session with the node manager at `node`: `requests`
    /// go to it, its events come back.
    fn lease_session(
        &self,
        node: Arc<str>,
        requests: mpsc::UnboundedReceiver<LeaseSessionRequest>,
    ) -> Reply<Incoming<LeaseSessionEvent>>;

    /// How worker `worker` of the node manager at `node` exited.
    fn worker_exit(&self, node: Arc<str>, worker: WorkerId) -> Reply<WorkerExit>;

    /// The node incarnations the head counts dead: those it knows, then
    /// each new one.
    fn node_deaths(&self) -> Reply<Incoming<NodeDeath>>;
}

/// Where tasks for one worker go; a frame is sent from any thread.
pub(crate) trait TaskOutlet: Send + Sync {
    fn send(&self, batch: &TaskBatch) -> std::result::Result<(), StreamClosed>;
}

/// Reaching a worker's task stream: tasks out, results in.
pub(crate) trait WorkerLink: Send + Sync {
    fn task_stream(&self, address: String) -> Reply<(Box<dyn TaskOutlet>, Incoming<WorkerEvents>)>;
}

/// The links a process's core reaches the cluster through.
#[derive(Clone)]
pub(crate) struct Links {
    pub(crate) nodes: Arc<dyn NodeManagerLink>,
    pub(crate) workers: Arc<dyn WorkerLink>,
}

impl Links {
    /// Links over the network, on `channels`, to the head at `head`.
    pub(crate) fn grpc(channels: Arc<Channels>, head: String) -> Self {
        let links = Arc::new(GrpcLinks { channels, head });
        Links {
            nodes: links.clone(),
            workers: links,
        }
    }
}

/// gRPC to node managers and the head, task streams to workers.
pub(crate) struct GrpcLinks {
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
}

impl WorkerLink for GrpcLinks {
    fn task_stream(&self, address: String) -> Reply<(Box<dyn TaskOutlet>, Incoming<WorkerEvents>)> {
        let channels = self.channels.clone();
        Box::pin(async move {
            let (tasks, events) = task_stream::open(&address, channels.token(), WORKER_CONNECT_PATIENCE).await?;
            let events = stream::unfold(Some(events), |reader| async move {
                let mut reader = reader?;
                match reader.message().await {
                    Ok(Some(message)) => Some((Ok(message), Some(reader))),
                    Ok(None) => None,
                    Err(error) => Some((Err(error.into()), None)),
                }
            });
            Ok((Box::new(tasks) as Box<dyn TaskOutlet>, events.boxed()))
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
