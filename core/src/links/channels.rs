//! Authenticated gRPC channels to other processes of the cluster, one per
//! address, reused across calls.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;

use crate::Result;

const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

pub(crate) struct Channels {
    token: AuthToken,
    open: Mutex<HashMap<String, AuthedChannel>>,
}

impl Channels {
    pub(crate) fn new(token: AuthToken) -> Self {
        Channels {
            token,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The cluster's token, which every channel presents.
    pub(crate) fn token(&self) -> &AuthToken {
        &self.token
    }

    /// A channel to `address`, opened on first use.
    pub(crate) async fn get(&self, address: &str) -> Result<AuthedChannel> {
        if let Some(channel) = self.lock().get(address) {
            return Ok(channel.clone());
        }
        let channel = raylet_proto::channel::connect(address, &self.token, CONNECT_PATIENCE).await?;
        self.lock().insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    pub(crate) fn has(&self, address: &str) -> bool {
        self.lock().contains_key(address)
    }

    /// Drops the channel to `address`: the process there may be gone.
    pub(crate) fn forget(&self, address: &str) {
        self.lock().remove(address);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AuthedChannel>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
