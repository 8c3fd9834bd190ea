//! Watches the head for node deaths on behalf of the submitter, so that work
//! leased on a node that died or was cut off runs again elsewhere as soon as
//! the head counts it dead, instead of when its connections break (a cut-off
//! node's never do). The watch is opened again, with backoff, while the head
//! is down; the head repeats every death it knows, and the submitter acts on
//! each incarnation's death once.

use std::sync::Arc;
use std::time::Duration;

use raylet_proto::v1::WatchNodeDeathsRequest;
use raylet_proto::v1::head_service_client::HeadServiceClient;
use raylet_proto::{Backoff, NodeId};
use tokio::sync::mpsc;

use crate::core_worker::CoreWorker;
use crate::submitter::SubmitterEvent;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A node incarnation the head counts dead.
pub(crate) struct NodeDeath {
    pub(crate) node_id: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) address: String,
    pub(crate) reason: String,
}

/// Forwards node deaths to the submitter until it stops.
pub(crate) fn spawn(core: Arc<CoreWorker>, events: mpsc::UnboundedSender<SubmitterEvent>) {
    tokio::spawn(async move {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            tokio::select! {
                () = events.closed() => return,
                result = forward_deaths(&core, &events) => match result {
                    Ok(()) => backoff.reset(),
                    Err(error) => tracing::debug!(%error, "watching node deaths; will watch again"),
                },
            }
            backoff.wait().await;
        }
    });
}

/// Reads one watch of the head until it ends.
async fn forward_deaths(core: &CoreWorker, events: &mpsc::UnboundedSender<SubmitterEvent>) -> crate::Result<()> {
    let channel = core.channel(&core.head_address).await?;
    let reply = HeadServiceClient::new(channel)
        .watch_node_deaths(WatchNodeDeathsRequest {})
        .await;
    let mut deaths = reply.map_err(raylet_proto::Error::from)?.into_inner();
    while let Some(death) = deaths.message().await.map_err(raylet_proto::Error::from)? {
        let Ok(node_id) = NodeId::from_wire(&death.node_id) else {
            continue;
        };
        let death = NodeDeath {
            node_id,
            incarnation: death.incarnation,
            address: death.address,
            reason: death.reason,
        };
        let _ = events.send(SubmitterEvent::NodeDied(death));
    }
    Ok(())
}
