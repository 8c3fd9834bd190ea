//! The controller's view of the HTTP proxies: one per alive node, named
//! `proxy:<node id>`, with what it last reported (its address, the routing
//! table version it installed, the requests waiting in its routers).

use std::net::SocketAddr;
use std::time::Instant;

use crate::proxy::HttpProxyHandle;
use crate::routes::QueueReport;
use crate::status::ProxyStatus;

/// What every proxy's actor name starts with.
pub(super) const PROXY_PREFIX: &str = "proxy:";

/// The actor name of the proxy on `node_id`.
pub(super) fn proxy_name(node_id: &str) -> String {
    format!("{PROXY_PREFIX}{node_id}")
}

/// One node's proxy.
pub(super) struct ProxySlot {
    pub node_id: String,
    pub handle: HttpProxyHandle,
    /// Known once it has answered.
    pub address: Option<SocketAddr>,
    /// The newest routing table version it has installed.
    pub acked: u64,
    /// A probe is out: no second one is sent.
    pub probing: bool,
    pub last_probe: Instant,
    /// Requests waiting in its routers, by application and deployment.
    pub queues: Vec<QueueReport>,
}

impl ProxySlot {
    pub(super) fn new(node_id: String, handle: HttpProxyHandle) -> Self {
        ProxySlot {
            node_id,
            handle,
            address: None,
            acked: 0,
            probing: false,
            last_probe: Instant::now(),
            queues: Vec::new(),
        }
    }

    /// Requests of `deployment` of `app` waiting in its routers.
    pub(super) fn queued(&self, app: &str, deployment: &str) -> u32 {
        self.queues
            .iter()
            .filter(|queue| queue.app == app && queue.deployment == deployment)
            .map(|queue| queue.waiting)
            .sum()
    }

    pub(super) fn status(&self) -> Option<ProxyStatus> {
        self.address.map(|address| ProxyStatus {
            node_id: self.node_id.clone(),
            address: address.to_string(),
        })
    }
}
