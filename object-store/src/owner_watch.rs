//! A node store's watch over the owners of objects that it holds for
//! processes on other nodes: when such an owner stops answering, nobody is
//! left to free its objects, so the store frees them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::DescribeObjectsRequest;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;

use crate::service::SharedStore;

/// How often each remote owner is asked whether it is alive.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Checks in a row an owner may miss before it counts as gone.
const MISSES_ALLOWED: u32 = 3;

/// The owners being watched: a connection to each and its misses in a row.
#[derive(Default)]
struct Watched {
    channels: HashMap<Arc<str>, AuthedChannel>,
    misses: HashMap<Arc<str>, u32>,
}

/// Checks the remote owners of the store's objects until the store ends.
pub async fn run(store: Arc<SharedStore>, token: AuthToken) -> ! {
    let mut watched = Watched::default();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let owners = store.lock().remote_owners();
        watched.channels.retain(|owner, _| owners.contains(owner));
        watched.misses.retain(|owner, _| owners.contains(owner));
        for owner in owners {
            if watched.answers(&owner, &token).await {
                watched.misses.remove(&owner);
                continue;
            }
            let missed = watched.misses.entry(owner.clone()).or_default();
            *missed += 1;
            if *missed >= MISSES_ALLOWED {
                let freed = store.delete_owned_by(&owner);
                tracing::warn!(%owner, freed, "the owner of objects in this store is gone; they are freed");
                watched.misses.remove(&owner);
            }
        }
    }
}

impl Watched {
    /// Whether the owner's service answers a call that asks nothing.
    async fn answers(&mut self, owner: &Arc<str>, token: &AuthToken) -> bool {
        let channel = self.channels.get(owner).cloned();
        let ping = async {
            let channel = match channel {
                Some(channel) => channel,
                None => raylet_proto::channel::connect(owner, token, CHECK_EVERY).await?,
            };
            OwnerServiceClient::new(channel.clone())
                .describe_objects(DescribeObjectsRequest::default())
                .await
                .map_err(raylet_proto::Error::from)?;
            Ok::<_, raylet_proto::Error>(channel)
        };
        match tokio::time::timeout(CHECK_EVERY, ping).await {
            Ok(Ok(channel)) => {
                self.channels.insert(owner.clone(), channel);
                true
            }
            _ => {
                self.channels.remove(owner);
                false
            }
        }
    }
}
