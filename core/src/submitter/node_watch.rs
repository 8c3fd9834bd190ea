//! Watches the head for node deaths on behalf of the submitter, so that work
//! leased on a node that died or was cut off runs again elsewhere as soon as
//! the head counts it dead, instead of when its connections break (a cut-off
//! node's never do). The watch is opened again, with backoff, while the head
//! is down; the head repeats every death it knows, and the submitter acts on
//! each incarnation's death once.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use raylet_common::Backoff;
use tokio::sync::mpsc;

use crate::links::HeadLink;
use crate::submitter::SubmitterEvent;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Forwards node deaths to the submitter until it stops.
pub(crate) fn spawn(head: Arc<dyn HeadLink>, events: mpsc::UnboundedSender<SubmitterEvent>) {
    tokio::spawn(async move {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            tokio::select! {
                () = events.closed() => return,
                result = forward_deaths(head.as_ref(), &events) => match result {
                    Ok(()) => backoff.reset(),
                    Err(error) => tracing::debug!(%error, "watching node deaths; will watch again"),
                },
            }
            backoff.wait().await;
        }
    });
}

/// Reads one watch of the head until it ends.
async fn forward_deaths(head: &dyn HeadLink, events: &mpsc::UnboundedSender<SubmitterEvent>) -> crate::Result<()> {
    let mut deaths = head.node_deaths().await?;
    while let Some(death) = deaths.next().await {
        let _ = events.send(SubmitterEvent::NodeDied(death?));
    }
    Ok(())
}
