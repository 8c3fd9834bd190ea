//! What every part of a process's core needs to reach the cluster: where
//! its own owner service, the head and its node manager listen, the binary
//! its workers run, the cluster token and channels, the links, and the
//! runtime. `CoreWorker::start` makes it once; the parts take an
//! `Arc<Context>` instead of the whole core.

use std::future::Future;
use std::sync::Arc;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::WorkerBinary;

use crate::Result;
use crate::links::Links;
use crate::links::channels::Channels;

pub(crate) struct Context {
    /// Where this process's owner service listens.
    pub(crate) address: Arc<str>,
    pub(crate) token: AuthToken,
    /// The cluster's head: actors are created and found there.
    pub(crate) head_address: String,
    pub(crate) node_manager: String,
    pub(crate) binary: WorkerBinary,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) log_to_driver: bool,
    /// How tasks reach node managers, the head and workers.
    pub(crate) links: Links,
    channels: Arc<Channels>,
}

/// Where a process listens and whom it reaches.
pub(crate) struct Addresses {
    pub(crate) address: String,
    pub(crate) head_address: String,
    pub(crate) node_manager: String,
}

impl Context {
    /// A context whose links are `links`, or gRPC over its channels.
    pub(crate) fn new(
        addresses: Addresses,
        token: AuthToken,
        binary: WorkerBinary,
        log_to_driver: bool,
        links: Option<Links>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let channels = Arc::new(Channels::new(token.clone()));
        let links = links.unwrap_or_else(|| crate::links::grpc_links(channels.clone(), addresses.head_address.clone()));
        Context {
            address: addresses.address.into(),
            token,
            head_address: addresses.head_address,
            node_manager: addresses.node_manager,
            binary,
            runtime,
            log_to_driver,
            links,
            channels,
        }
    }

    /// An authenticated channel to `address`, reused across calls.
    pub(crate) async fn channel(&self, address: &str) -> Result<AuthedChannel> {
        self.channels.get(address).await
    }

    pub(crate) fn has_channel(&self, address: &str) -> bool {
        self.channels.has(address)
    }

    /// Drops the channel to `address`: the process there may be gone.
    pub(crate) fn forget_channel(&self, address: &str) {
        self.channels.forget(address);
    }

    /// Runs `future` on the cluster's runtime and blocks this thread for its
    /// output; works from any thread, including runtime threads.
    pub(crate) fn block_on<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = sender.send(future.await);
        });
        receiver.recv().expect("the cluster runtime dropped a blocking call")
    }
}
