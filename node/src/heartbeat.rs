//! Registration with the head and the heartbeat loop, which registers anew
//! when the head says this incarnation is no longer alive, after fencing the
//! old one: its workers and job drivers are killed.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use raylet_cluster_status::ResourceDemand;
use raylet_common::error::error_chain;
use raylet_placement::LaunchableNodes;
use raylet_proto::channel::HeadClient;
use raylet_proto::scheduling::{labels_from_proto, labels_to_proto};
use raylet_proto::v1::{HeartbeatReply, HeartbeatRequest, NodeResources, RegisterNodeRequest, UnregisterNodeRequest};
use raylet_proto::{NodeId, ResourceSet, Result};
use tonic::Request;

use super::stats::StatsSampler;
use super::{NodeShared, NodeView, lock};

const UNREGISTER_TIMEOUT: Duration = Duration::from_secs(1);

/// Registers this node and stores the incarnation the head gave it.
pub(crate) async fn register(head: &mut HeadClient, shared: &NodeShared) -> Result<()> {
    let config = &shared.config;
    let request = RegisterNodeRequest {
        node_id: config.node_id.as_bytes().to_vec(),
        address: shared.address.to_string(),
        hostname: sysinfo::System::host_name().unwrap_or_default(),
        is_head_node: config.is_head_node,
        total: Some(config.resources.to_proto()),
        labels: labels_to_proto(&config.labels),
        metrics_address: config.metrics_address.clone().unwrap_or_default(),
    };
    let incarnation = head.register_node(request).await?.into_inner().incarnation;
    shared.incarnation.store(incarnation, Ordering::Release);
    tracing::info!(node_id = %config.node_id, incarnation, head = %config.head_address, "registered with the head");
    Ok(())
}

/// Sends a heartbeat every interval, forever. Failures are logged once per
/// outage and retried; the head may come back.
pub(crate) async fn run(mut head: HeadClient, shared: std::sync::Arc<NodeShared>) -> Infallible {
    let interval = shared.config.heartbeat_interval;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sampler = StatsSampler::new(shared.config.gpu_detector.clone());
    let mut head_reachable = true;
    loop {
        ticker.tick().await;
        *lock(&shared.stats) = sampler.sample();
        match send_heartbeat(&mut head, &shared, interval * 2).await {
            Ok(reply) => {
                let must_reregister = reply.must_reregister;
                let launchable = LaunchableNodes::from_proto(&reply.launchable).unwrap_or_else(|error| {
                    tracing::warn!(%error, "the head's launchable node types are malformed; ignored");
                    LaunchableNodes::default()
                });
                shared
                    .leases
                    .set_cluster_view(other_nodes(&shared, reply.cluster_view), launchable);
                if !head_reachable {
                    tracing::info!("the head is reachable again");
                    head_reachable = true;
                }
                if must_reregister {
                    reregister(&mut head, &shared).await;
                }
            }
            Err(error) if head_reachable => {
                tracing::warn!(%error, "heartbeat failed; retrying every interval");
                head_reachable = false;
            }
            Err(_) => {}
        }
    }
}

/// The other alive nodes of the head's view; malformed entries are skipped.
fn other_nodes(shared: &NodeShared, view: Vec<NodeResources>) -> Vec<NodeView> {
    view.into_iter()
        .filter_map(|node| {
            Some(NodeView {
                node_id: NodeId::from_wire(&node.node_id).ok()?,
                address: node.address,
                total: ResourceSet::from_proto(&node.total?).ok()?,
                available: ResourceSet::from_proto(&node.available?).ok()?,
                labels: labels_from_proto(&node.labels).ok()?,
            })
        })
        .filter(|node| node.node_id != shared.config.node_id)
        .collect()
}

async fn send_heartbeat(head: &mut HeadClient, shared: &NodeShared, timeout: Duration) -> Result<HeartbeatReply> {
    let (total, available) = shared.leases.reported();
    let mut request = Request::new(HeartbeatRequest {
        node_id: shared.config.node_id.as_bytes().to_vec(),
        incarnation: shared.incarnation(),
        total: Some(total.to_proto()),
        available: Some(available.to_proto()),
        demands: shared.leases.demands().iter().map(ResourceDemand::to_proto).collect(),
        stats: Some(shared.stats().to_proto()),
    });
    request.set_timeout(timeout);
    Ok(head.heartbeat(request).await?.into_inner())
}

async fn reregister(head: &mut HeadClient, shared: &NodeShared) {
    tracing::warn!(
        incarnation = shared.incarnation(),
        "the head no longer counts this incarnation as alive; registering anew"
    );
    fence(shared);
    if let Err(error) = register(head, shared).await {
        tracing::warn!(error = %error_chain(&error), "registering anew failed; will retry");
    }
}

/// Ends what the old incarnation ran: the head counted it dead, so its
/// tasks were failed or retried elsewhere, its actors restarted and its
/// jobs failed. Its workers and drivers must not go on beside their
/// replacements.
fn fence(shared: &NodeShared) {
    let workers = shared.leases.kill_all_workers();
    let drivers = shared.job_drivers.kill_all();
    tracing::warn!(
        workers,
        drivers,
        "fenced the old incarnation: its workers and job drivers were killed"
    );
}

/// Tells the head this node is leaving; best effort, bounded in time.
pub(crate) async fn unregister(head: &mut HeadClient, shared: &NodeShared, reason: &str) {
    let mut request = Request::new(UnregisterNodeRequest {
        node_id: shared.config.node_id.as_bytes().to_vec(),
        incarnation: shared.incarnation(),
        reason: reason.to_string(),
    });
    request.set_timeout(UNREGISTER_TIMEOUT);
    if let Err(status) = head.unregister_node(request).await {
        tracing::warn!(error = %status.message(), "could not tell the head that this node is leaving");
    }
}
