//! The owner's watch over the processes that borrow its objects: one that
//! stops answering is taken for dead and its references stop counting, so a
//! borrower that dies without saying so leaks nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::v1::DescribeObjectsRequest;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;

use crate::core_worker::CoreWorker;

/// How often each borrower is asked whether it is alive.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Checks in a row a borrower may miss before it counts as dead.
const MISSES_ALLOWED: u32 = 3;

/// Checks the borrowers of this process's objects until the process ends.
pub(crate) async fn watch_borrowers(core: Arc<CoreWorker>) {
    let mut misses: HashMap<Arc<str>, u32> = HashMap::new();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let borrowers = core.store.borrowers();
        misses.retain(|borrower, _| borrowers.contains(borrower));
        for borrower in borrowers {
            if answers(&core, &borrower).await {
                misses.remove(&borrower);
                continue;
            }
            let missed = misses.entry(borrower.clone()).or_default();
            *missed += 1;
            if *missed >= MISSES_ALLOWED {
                tracing::warn!(%borrower, "a process that borrowed objects is gone; its references no longer count");
                core.store.forget_borrower(&borrower);
                misses.remove(&borrower);
            }
        }
    }
}

/// Whether the borrower's owner service answers a call that asks nothing.
async fn answers(core: &CoreWorker, borrower: &str) -> bool {
    let ping = async {
        let channel = core.channel(borrower).await?;
        OwnerServiceClient::new(channel)
            .describe_objects(DescribeObjectsRequest::default())
            .await
            .map_err(raylet_proto::Error::from)?;
        Ok::<_, crate::Error>(())
    };
    match tokio::time::timeout(CHECK_EVERY, ping).await {
        Ok(Ok(())) => true,
        _ => {
            core.forget_channel(borrower);
            false
        }
    }
}
