//! The real [`BundleNodes`]: bundle operations sent to node managers. Each
//! node has one sender task and at most one call in flight; operations that
//! queue up meanwhile go together in the next call, so a burst of groups
//! costs a few round trips rather than one each. Releases, which nobody
//! waits for, linger a moment to gather the ones that follow.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{Bundle, BundleOp, BundleOpKind, BundleOpsRequest};
use raylet_proto::{PlacementGroupId, ResourceSet};
use tokio::sync::{mpsc, oneshot};

use super::error::BundleCallError;
use super::manager::BundleNodes;

type Result<T, E = BundleCallError> = std::result::Result<T, E>;

/// How long a node manager may take to answer a connection.
const NODE_PATIENCE: Duration = Duration::from_secs(2);
/// A bundle call that takes longer than this fails; the node is likely gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The most operations sent in one call.
const MAX_OPS_PER_CALL: usize = 1024;
/// How long a call of releases alone waits for more operations.
const RELEASE_LINGER: Duration = Duration::from_millis(1);

/// An operation waiting for its node's sender task, with where its answer goes.
struct QueuedOp {
    op: BundleOp,
    answer: oneshot::Sender<Result<()>>,
}

/// Calls node managers for the head's placement groups.
pub struct NodeManagerBundles {
    token: AuthToken,
    queues: Mutex<HashMap<String, mpsc::UnboundedSender<QueuedOp>>>,
}

impl NodeManagerBundles {
    pub fn new(token: AuthToken) -> Self {
        NodeManagerBundles {
            token,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Queues `op` for the node at `address` and waits for its answer.
    async fn call(&self, address: &str, op: BundleOp) -> Result<()> {
        let stopped = || BundleCallError::SenderStopped {
            address: address.to_string(),
        };
        let (answer, answered) = oneshot::channel();
        if self.queue(address).send(QueuedOp { op, answer }).is_err() {
            return Err(stopped());
        }
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The queue of the node's sender task, started on first use.
    fn queue(&self, address: &str) -> mpsc::UnboundedSender<QueuedOp> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = queues.entry(address.to_string()).or_insert_with(|| {
            let (queue, queued) = mpsc::unbounded_channel();
            tokio::spawn(send_batches(address.to_string(), self.token.clone(), queued));
            queue
        });
        queue.clone()
    }
}

/// Sends what is queued for one node, a batch per call, and answers each
/// operation; a failed connection is dropped and made anew for the next.
async fn send_batches(address: String, token: AuthToken, mut queued: mpsc::UnboundedReceiver<QueuedOp>) {
    let mut client = None;
    let mut batch = Vec::new();
    while queued.recv_many(&mut batch, MAX_OPS_PER_CALL).await > 0 {
        linger_while_releasing(&mut queued, &mut batch).await;
        let (ops, answers): (Vec<BundleOp>, Vec<_>) = batch.drain(..).map(|q| (q.op, q.answer)).unzip();
        let count = ops.len();
        let results = match send_batch(&mut client, &address, &token, ops).await {
            Ok(results) => results,
            Err(error) => {
                client = None;
                vec![Err(error); count]
            }
        };
        for (answer, result) in answers.into_iter().zip(results) {
            let _ = answer.send(result);
        }
    }
}

/// Gathers more operations for up to [`RELEASE_LINGER`] while the batch
/// holds releases alone; any other operation is sent at once.
async fn linger_while_releasing(queued: &mut mpsc::UnboundedReceiver<QueuedOp>, batch: &mut Vec<QueuedOp>) {
    let releases_only = |batch: &[QueuedOp]| batch.iter().all(|q| q.op.kind() == BundleOpKind::Release);
    let deadline = tokio::time::Instant::now() + RELEASE_LINGER;
    while releases_only(batch) && batch.len() < MAX_OPS_PER_CALL {
        let room = MAX_OPS_PER_CALL - batch.len();
        match tokio::time::timeout_at(deadline, queued.recv_many(batch, room)).await {
            Ok(received) if received > 0 => {}
            _ => break,
        }
    }
}

/// One call with `ops`; the answers, one per operation.
async fn send_batch(
    client: &mut Option<NodeManagerServiceClient<AuthedChannel>>,
    address: &str,
    token: &AuthToken,
    ops: Vec<BundleOp>,
) -> Result<Vec<Result<()>>> {
    let count = ops.len();
    let client = match client {
        Some(client) => client,
        None => {
            let channel = raylet_proto::channel::connect(address, token, NODE_PATIENCE).await?;
            client.insert(NodeManagerServiceClient::new(channel))
        }
    };
    let mut request = tonic::Request::new(BundleOpsRequest { ops });
    request.set_timeout(CALL_TIMEOUT);
    let reply = client
        .apply_bundle_ops(request)
        .await
        .map_err(raylet_proto::Error::from)?;
    let results = reply.into_inner().results;
    if results.len() != count {
        return Err(BundleCallError::WrongAnswerCount {
            address: address.to_string(),
            answered: results.len(),
            asked: count,
        });
    }
    let answer = |reason: String| {
        if reason.is_empty() {
            return Ok(());
        }
        Err(BundleCallError::Refused { reason })
    };
    Ok(results.into_iter().map(|result| answer(result.error)).collect())
}

/// Bundles named by index alone, as commits and releases name them.
fn by_index(indexes: Vec<u32>) -> Vec<Bundle> {
    indexes
        .into_iter()
        .map(|index| Bundle { index, resources: None })
        .collect()
}

fn operation(kind: BundleOpKind, group: PlacementGroupId, bundles: Vec<Bundle>, commit: bool) -> BundleOp {
    BundleOp {
        kind: kind as i32,
        placement_group_id: group.as_bytes().to_vec(),
        bundles,
        commit,
    }
}

impl BundleNodes for NodeManagerBundles {
    async fn reserve(
        &self,
        address: &str,
        group: PlacementGroupId,
        bundles: Vec<(u32, ResourceSet)>,
        commit: bool,
    ) -> Result<()> {
        let bundles = bundles
            .into_iter()
            .map(|(index, resources)| Bundle {
                index,
                resources: Some(resources.to_proto()),
            })
            .collect();
        let op = operation(BundleOpKind::Reserve, group, bundles, commit);
        self.call(address, op).await
    }

    async fn commit(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<()> {
        let op = operation(BundleOpKind::Commit, group, by_index(indexes), false);
        self.call(address, op).await
    }

    async fn release(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<()> {
        let op = operation(BundleOpKind::Release, group, by_index(indexes), false);
        self.call(address, op).await
    }
}
