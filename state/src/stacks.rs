//! `raylet stack`: every thread's backtrace of the cluster's workers, as
//! `ray stack` prints with py-spy, asked of each alive node's manager (or
//! one node's, or one worker's by pid). The workers run on while they are
//! dumped: each thread stops only to record its return addresses.

use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;
use raylet_proto::v1::DumpWorkerStacksRequest;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::{NodeId, WorkerId};
use tonic::Code;

use crate::error::{Result, StateError};

/// How long a lookup waits for the head or a node to connect.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// One worker's dump.
#[derive(Clone, Debug)]
pub struct WorkerStackDump {
    pub node_id: NodeId,
    pub worker_id: Option<WorkerId>,
    pub pid: u32,
    /// Each thread's name and frames.
    pub text: String,
    /// Why there is no dump.
    pub error: Option<String>,
}

/// The dumps of the workers of `node` (every alive node when `None`), or of
/// the worker whose pid is `pid`.
pub async fn dump_worker_stacks(
    head: &str,
    token: &AuthToken,
    node: Option<NodeId>,
    pid: Option<u32>,
) -> Result<Vec<WorkerStackDump>> {
    let status = ClusterStatus::fetch(head, token, PATIENCE).await?;
    let nodes: Vec<_> = status
        .alive()
        .filter(|candidate| node.is_none_or(|node| candidate.node_id == node))
        .collect();
    if let (Some(node), true) = (node, nodes.is_empty()) {
        return Err(StateError::NoAliveNode(node));
    }
    let mut dumps = Vec::new();
    for candidate in nodes {
        let channel = raylet_proto::channel::connect(&candidate.address, token, PATIENCE).await?;
        let request = DumpWorkerStacksRequest {
            pid: pid.unwrap_or_default(),
        };
        let stacks = match NodeManagerServiceClient::new(channel).dump_worker_stacks(request).await {
            Ok(reply) => reply.into_inner(),
            Err(status) if pid.is_some() && status.code() == Code::NotFound => continue,
            Err(status) => return Err(raylet_proto::Error::from(status).into()),
        };
        dumps.extend(stacks.workers.into_iter().map(|stack| WorkerStackDump {
            node_id: candidate.node_id,
            worker_id: WorkerId::from_wire(&stack.worker_id).ok(),
            pid: stack.pid,
            text: stack.text,
            error: Some(stack.error).filter(|error| !error.is_empty()),
        }));
    }
    match pid {
        Some(pid) if dumps.is_empty() => Err(StateError::NotAWorker {
            pid,
            place: match node {
                Some(node) => format!("of node {node}"),
                None => "of any alive node".to_string(),
            },
        }),
        _ => Ok(dumps),
    }
}
