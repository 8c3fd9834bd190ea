//! The controller's view of the HTTP proxies: one per alive node, named
//! `proxy:<node id>`, with what it last reported (its address, the routing
//! table version it installed, the requests waiting in its routers).
//!
//! **A proxy that fails to start** (its port is taken, say) is started
//! again after a back-off that doubles from [`FIRST_RETRY`] to
//! [`MAX_RETRY`] (jittered), never at once: every start leaves a dead
//! actor record and a worker's log files behind. Its failures, last error
//! and next try are in the status until it starts.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use raylet_common::Backoff;

use crate::proxy::HttpProxyHandle;
use crate::routes::QueueReport;
use crate::status::{ProxyFailureStatus, ProxyStatus};

/// The delay before starting a proxy again after its first failed start.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest delay between two starts of a failing proxy.
pub(super) const MAX_RETRY: Duration = Duration::from_secs(30);

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

    pub(super) fn status(&self) -> Option<ProxyStatus> {
        self.address.map(|address| ProxyStatus {
            node_id: self.node_id.clone(),
            address: address.to_string(),
        })
    }
}

/// A node whose proxy failed to start, in a row.
pub(super) struct ProxyFailure {
    pub failures: u32,
    pub last_error: String,
    /// No new proxy is started on the node before.
    pub retry_at: Instant,
}

impl ProxyFailure {
    /// The failures of a node's proxy once another start failed at `now`
    /// with `error`, after the `previous` ones in a row.
    pub(super) fn after(previous: Option<&ProxyFailure>, error: String, now: Instant) -> ProxyFailure {
        let failures = previous.map_or(1, |failure| failure.failures + 1);
        let delay = Backoff::delay_for_attempt(FIRST_RETRY, MAX_RETRY, failures - 1);
        ProxyFailure {
            failures,
            last_error: error,
            retry_at: now + delay,
        }
    }

    /// Whether a proxy may be started on the node at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.retry_at
    }

    pub(super) fn status(&self, node_id: &str, now: Instant) -> ProxyFailureStatus {
        ProxyFailureStatus {
            node_id: node_id.to_string(),
            failures: self.failures,
            last_error: self.last_error.clone(),
            retry_in_ms: self.retry_at.saturating_duration_since(now).as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_proxy_is_retried_after_growing_delays_up_to_the_cap() {
        let now = Instant::now();
        let mut failure: Option<ProxyFailure> = None;
        let mut delays = Vec::new();
        for _ in 0..12 {
            let recorded = ProxyFailure::after(failure.as_ref(), "address in use".into(), now);
            let delay = recorded.retry_at - now;
            assert!(!recorded.due(now) && recorded.due(now + delay));
            delays.push(delay);
            failure = Some(recorded);
        }
        let failure = failure.unwrap();
        assert_eq!(failure.failures, 12);
        assert!(delays[0] <= FIRST_RETRY, "{delays:?}");
        assert!(delays.iter().all(|delay| *delay <= MAX_RETRY), "{delays:?}");
        let in_eleven_minutes = delays.iter().scan(Duration::ZERO, |sum, delay| {
            *sum += *delay;
            Some(*sum)
        });
        assert!(
            in_eleven_minutes
                .take_while(|sum| *sum < Duration::from_secs(60))
                .count()
                <= 7,
            "a handful of starts in the first minute, not 60: {delays:?}"
        );
        let status = failure.status("ab12", now);
        assert_eq!((status.failures, status.last_error.as_str()), (12, "address in use"));
        assert!(status.retry_in_ms <= MAX_RETRY.as_millis() as u64);
    }
}
