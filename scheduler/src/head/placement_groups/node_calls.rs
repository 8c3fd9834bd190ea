//! The real [`BundleNodes`]: gRPC calls to node managers over channels kept
//! per address.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use raylet_proto::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{Bundle, BundlesRequest};
use raylet_proto::{Error, PlacementGroupId, ResourceSet, Result};

use super::manager::BundleNodes;

/// How long a node manager may take to answer a connection.
const NODE_PATIENCE: Duration = Duration::from_secs(2);
/// A bundle call that takes longer than this fails; the node is likely gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Calls node managers for the head's placement groups.
pub struct NodeManagerBundles {
    token: AuthToken,
    channels: Mutex<HashMap<String, AuthedChannel>>,
}

impl NodeManagerBundles {
    pub fn new(token: AuthToken) -> Self {
        NodeManagerBundles {
            token,
            channels: Mutex::new(HashMap::new()),
        }
    }

    async fn client(&self, address: &str) -> Result<NodeManagerServiceClient<AuthedChannel>> {
        let cached = self
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .cloned();
        let channel = match cached {
            Some(channel) => channel,
            None => {
                let channel = raylet_proto::channel::connect(address, &self.token, NODE_PATIENCE).await?;
                let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
                channels.insert(address.to_string(), channel.clone());
                channel
            }
        };
        Ok(NodeManagerServiceClient::new(channel))
    }

    fn forget(&self, address: &str) {
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).remove(address);
    }

    /// Sends one bundle call; a failed connection is not kept.
    async fn call(&self, address: &str, kind: Call, request: BundlesRequest) -> Result<()> {
        let mut client = self.client(address).await?;
        let mut request = tonic::Request::new(request);
        request.set_timeout(CALL_TIMEOUT);
        let reply = match kind {
            Call::Reserve => client.reserve_bundles(request).await,
            Call::Commit => client.commit_bundles(request).await,
            Call::Release => client.release_bundles(request).await,
        };
        reply.map(drop).map_err(|status| {
            if status.code() == tonic::Code::Unavailable {
                self.forget(address);
            }
            Error::from(status)
        })
    }
}

enum Call {
    Reserve,
    Commit,
    Release,
}

/// Bundles named by index alone, as commits and releases name them.
fn by_index(indexes: Vec<u32>) -> Vec<Bundle> {
    indexes
        .into_iter()
        .map(|index| Bundle { index, resources: None })
        .collect()
}

fn request(group: PlacementGroupId, bundles: Vec<Bundle>, commit: bool) -> BundlesRequest {
    BundlesRequest {
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
        self.call(address, Call::Reserve, request(group, bundles, commit)).await
    }

    async fn commit(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<()> {
        self.call(address, Call::Commit, request(group, by_index(indexes), false))
            .await
    }

    async fn release(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<()> {
        self.call(address, Call::Release, request(group, by_index(indexes), false))
            .await
    }
}
