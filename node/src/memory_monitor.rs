//! The out-of-memory monitor: it reads the machine's memory use (or its
//! cgroup's, when that is smaller) every interval, and above the threshold
//! ends the worker of the newest lease, retriable work first, so that the
//! node manager and the other workers live on. The work's owner sees the
//! worker die of it and retries the work.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use sysinfo::System;

use super::leasing::LeaseManager;

/// How long to wait for an ended worker to be gone before checking again.
const EXIT_PATIENCE: Duration = Duration::from_secs(5);

/// When the monitor acts, and how often it looks.
#[derive(Clone, Copy, Debug)]
pub struct MemoryMonitorConfig {
    /// The share of memory in use above which a worker is ended.
    pub threshold: f64,
    /// How often memory is read; zero turns the monitor off.
    pub interval: Duration,
}

impl Default for MemoryMonitorConfig {
    fn default() -> Self {
        MemoryMonitorConfig {
            threshold: 0.95,
            interval: Duration::from_millis(250),
        }
    }
}

impl MemoryMonitorConfig {
    /// Checks that the threshold is a share of memory.
    pub fn validate(&self) -> raylet_proto::Result<()> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(raylet_proto::Error::InvalidArgument(format!(
                "the memory usage threshold must be above 0 and at most 1, got {}",
                self.threshold
            )));
        }
        Ok(())
    }
}

/// Watches memory until the node stops.
pub(crate) async fn run(leases: Arc<LeaseManager>, config: MemoryMonitorConfig) -> Infallible {
    if config.interval.is_zero() {
        return std::future::pending().await;
    }
    let mut system = System::new();
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let (used, total) = memory_use(&mut system);
        let share = used as f64 / total.max(1) as f64;
        if share <= config.threshold {
            continue;
        }
        let usage = format!(
            "the node's memory was {:.1}% used ({:.2} of {:.2} GiB), above the threshold of {:.1}%",
            share * 100.0,
            gib(used),
            gib(total),
            config.threshold * 100.0
        );
        if let Some(worker) = leases.end_newest_for_memory(&usage) {
            leases.worker_exit(worker, EXIT_PATIENCE).await;
        }
    }
}

/// Bytes in use and in all: the machine's, or its cgroup's when that limit is lower.
fn memory_use(system: &mut System) -> (u64, u64) {
    system.refresh_memory();
    let total = system.total_memory();
    let used = system.used_memory();
    match system.cgroup_limits() {
        Some(limits) if limits.total_memory > 0 && limits.total_memory < total => (
            limits.total_memory.saturating_sub(limits.free_memory),
            limits.total_memory,
        ),
        _ => (used, total),
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
