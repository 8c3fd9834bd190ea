//! What the autoscaler tells the world each round: a report kept in the
//! head's key-value store for `raylet status` (managed nodes and what
//! becomes of them, launches, demand left waiting and why, recent
//! decisions), and counters and gauges on the head process's `/metrics`.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use prometheus::{IntCounterVec, IntGaugeVec};
use raylet_cluster_status::unix_ms;
use raylet_common::auth::AuthToken;
use raylet_proto::v1::kv_service_client::KvServiceClient;
use raylet_proto::v1::{KvGetRequest, KvPutRequest};
use raylet_proto::{Error, Result};
use serde::{Deserialize, Serialize};

/// The key-value namespace and key the report is kept under.
pub const REPORT_NAMESPACE: &str = "_raylet_autoscaler";
pub const REPORT_KEY: &str = "report";
/// How many decisions the report keeps.
const RECENT_EVENTS: usize = 50;
const PATIENCE: Duration = Duration::from_secs(5);

/// The autoscaler's state as `raylet status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoscalerReport {
    pub updated_unix_ms: u64,
    /// The provider's kind, e.g. `local` or `slurm`.
    pub provider: String,
    pub nodes: Vec<ManagedNode>,
    /// What the last round launched.
    pub launched: Vec<String>,
    /// Demand no launch holds, each with the reason.
    pub waiting: Vec<String>,
    /// Node types held back after failed launches.
    pub backing_off: Vec<String>,
    /// The latest decisions, oldest first.
    pub events: VecDeque<Event>,
}

/// One node the autoscaler launched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManagedNode {
    pub instance: String,
    pub node_type: String,
    /// `launching`, `running`, `idle` or `draining`.
    pub state: String,
    /// The node's id once it joined.
    pub node_id: Option<String>,
    /// Seconds in its state: launching, idle or draining.
    pub for_s: f64,
    /// Seconds until an idle node is removed, while its type is above its
    /// min_count.
    pub removed_in_s: Option<f64>,
}

/// A decision with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub unix_ms: u64,
    pub message: String,
}

impl AutoscalerReport {
    /// Logs `message` and keeps it among the recent decisions.
    pub(crate) fn event(&mut self, message: String) {
        tracing::info!(target: "raylet::autoscaler", "{message}");
        if self.events.len() == RECENT_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            unix_ms: unix_ms(SystemTime::now()),
            message,
        });
    }

    /// Writes the report to the head's key-value store.
    pub(crate) async fn publish(&mut self, head: &str, token: &AuthToken) -> Result<()> {
        self.updated_unix_ms = unix_ms(SystemTime::now());
        let value = serde_json::to_vec(self).map_err(|e| Error::Internal(format!("encoding the report: {e}")))?;
        let channel = raylet_proto::channel::connect(head, token, PATIENCE).await?;
        KvServiceClient::new(channel)
            .kv_put(KvPutRequest {
                namespace: REPORT_NAMESPACE.into(),
                key: REPORT_KEY.into(),
                value,
                overwrite: true,
            })
            .await?;
        Ok(())
    }

    /// The report the cluster's autoscaler last wrote, if it runs one.
    pub async fn fetch(head: &str, token: &AuthToken) -> Result<Option<Self>> {
        let channel = raylet_proto::channel::connect(head, token, PATIENCE).await?;
        let reply = KvServiceClient::new(channel)
            .kv_get(KvGetRequest {
                namespace: REPORT_NAMESPACE.into(),
                key: REPORT_KEY.into(),
            })
            .await?
            .into_inner();
        match reply.value {
            Some(value) => serde_json::from_slice(&value)
                .map(Some)
                .map_err(|e| Error::Internal(format!("the autoscaler's report is malformed: {e}"))),
            None => Ok(None),
        }
    }
}

/// Nodes launched, by type.
pub(crate) static LAUNCHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    raylet_common::metrics::counter(
        "raylet_autoscaler_launches_total",
        "Nodes the autoscaler asked its provider for, by node type",
        &["node_type"],
    )
});

/// Launches that failed, and nodes that did not join in time, by type.
pub(crate) static LAUNCH_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    raylet_common::metrics::counter(
        "raylet_autoscaler_launch_failures_total",
        "Launches that failed or whose node did not join in time, by node type",
        &["node_type"],
    )
});

/// Nodes removed, by type and cause (idle, did_not_join, failed).
pub(crate) static REMOVALS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    raylet_common::metrics::counter(
        "raylet_autoscaler_removals_total",
        "Nodes the autoscaler removed, by node type and cause",
        &["node_type", "cause"],
    )
});

/// Managed nodes now, by type and state.
pub(crate) static NODES: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    raylet_common::metrics::gauge(
        "raylet_autoscaler_nodes",
        "Nodes the autoscaler manages, by node type and state (launching, running, idle, draining)",
        &["node_type", "state"],
    )
});

/// Tasks, actors and bundles no launch holds.
pub(crate) static WAITING: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    raylet_common::metrics::gauge(
        "raylet_autoscaler_waiting_demand",
        "Tasks, actors and placement groups that no node or launch holds, by reason",
        &["reason"],
    )
});
