//! The owner's watch over the processes that borrow its objects: one that
//! stops answering is taken for dead and its references stop counting, so a
//! borrower that dies without saying so leaks nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::v1::DescribeObjectsRequest;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;

use crate::context::Context;
use crate::objects::memory_store::MemoryStore;

/// How often each borrower is asked whether it is alive.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Checks in a row a borrower may miss before it counts as dead.
const MISSES_ALLOWED: u32 = 3;

/// Checks the borrowers of this process's objects until the process ends.
pub(crate) async fn watch_borrowers(ctx: Arc<Context>, store: Arc<MemoryStore>) {
    let mut misses: HashMap<Arc<str>, u32> = HashMap::new();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let borrowers = store.borrowers();
        misses.retain(|borrower, _| borrowers.contains(borrower));
        for borrower in borrowers {
            if answers(&ctx, &borrower).await {
                misses.remove(&borrower);
                continue;
            }
            let missed = misses.entry(borrower.clone()).or_default();
            *missed += 1;
            if *missed >= MISSES_ALLOWED {
                tracing::warn!(%borrower, "a process that borrowed objects is gone; its references no longer count");
                store.forget_borrower(&borrower);
                misses.remove(&borrower);
            }
        }
    }
}

/// Whether the borrower's owner service answers a call that asks nothing.
async fn answers(ctx: &Context, borrower: &str) -> bool {
    let ping = async {
        let channel = ctx.channel(borrower).await?;
        OwnerServiceClient::new(channel)
            .describe_objects(DescribeObjectsRequest::default())
            .await
            .map_err(raylet_proto::Error::from)?;
        Ok::<_, crate::Error>(())
    };
    match tokio::time::timeout(CHECK_EVERY, ping).await {
        Ok(Ok(())) => true,
        _ => {
            ctx.forget_channel(borrower);
            false
        }
    }
}
