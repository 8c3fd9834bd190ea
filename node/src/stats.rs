//! Samples this machine's CPU and memory utilization with sysinfo, and its
//! GPUs' through the node's [`GpuDetector`].

use std::sync::Arc;

use raylet_cluster_status::NodeStats;
use sysinfo::System;

use super::gpu_devices::GpuDetector;

/// Keeps a sysinfo handle between samples, since CPU usage is a difference
/// between two readings.
pub(crate) struct StatsSampler {
    system: System,
    gpus: Arc<dyn GpuDetector>,
}

impl StatsSampler {
    pub(crate) fn new(gpus: Arc<dyn GpuDetector>) -> Self {
        StatsSampler {
            system: System::new(),
            gpus,
        }
    }

    pub(crate) fn sample(&mut self) -> NodeStats {
        self.system.refresh_cpu_usage();
        self.system.refresh_memory();
        NodeStats {
            cpu_percent: f64::from(self.system.global_cpu_usage()),
            memory_used_bytes: self.system.used_memory(),
            memory_total_bytes: self.system.total_memory(),
            gpus: self.gpus.read(),
        }
    }
}
