//! The overview's charts: the dashboard samples each alive node's CPU and
//! memory use, its GPUs in use and how busy they are every few seconds, and
//! keeps the last ten minutes in memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raylet_cluster_status::{ClusterStatus, GpuStats};
use raylet_common::auth::AuthToken;
use serde::Serialize;

/// How often the nodes are sampled.
pub(super) const SAMPLE_PERIOD: Duration = Duration::from_secs(2);
/// Samples kept: ten minutes' worth.
const KEPT: usize = 300;

/// One node at one moment.
#[derive(Clone, Debug, Serialize)]
pub(super) struct NodeSample {
    node_id: String,
    cpu_percent: f64,
    memory_percent: f64,
    /// GPUs leased out as a share of the node's GPUs (0 without GPUs):
    /// what the scheduler knows.
    gpu_percent: f64,
    /// The node's GPUs' mean utilization, as their driver reports it (0
    /// without GPUs).
    gpu_utilization_percent: f64,
}

/// Every alive node at one moment.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Sample {
    unix_ms: u64,
    nodes: Vec<NodeSample>,
}

fn mean_gpu_utilization(gpus: &[GpuStats]) -> f64 {
    match gpus.len() {
        0 => 0.0,
        count => gpus.iter().map(|gpu| gpu.utilization_percent).sum::<f64>() / count as f64,
    }
}

/// The samples so far, oldest first.
pub(super) type History = Arc<Mutex<VecDeque<Sample>>>;

fn sample(status: &ClusterStatus) -> Sample {
    let nodes = status
        .alive()
        .map(|node| {
            let gpus = node.total.get("GPU").as_f64();
            let gpus_free = node.available.get("GPU").as_f64();
            let memory_total = node.stats.memory_total_bytes.max(1) as f64;
            NodeSample {
                node_id: node.node_id.to_string(),
                cpu_percent: node.stats.cpu_percent,
                memory_percent: 100.0 * node.stats.memory_used_bytes as f64 / memory_total,
                gpu_percent: match gpus > 0.0 {
                    true => 100.0 * (gpus - gpus_free) / gpus,
                    false => 0.0,
                },
                gpu_utilization_percent: mean_gpu_utilization(&node.stats.gpus),
            }
        })
        .collect();
    Sample {
        unix_ms: status.now_unix_ms,
        nodes,
    }
}

/// Samples the cluster of the head at `head` into `history`, forever.
pub(super) async fn keep_sampling(head: String, token: AuthToken, history: History) {
    let mut ticker = tokio::time::interval(SAMPLE_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Ok(status) = ClusterStatus::fetch(&head, &token, SAMPLE_PERIOD).await else {
            continue;
        };
        let mut samples = history.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample(&status));
    }
}
