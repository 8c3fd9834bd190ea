//! Samples this machine's CPU and memory utilization with sysinfo.

use sysinfo::System;

use crate::status::NodeStats;

/// Keeps a sysinfo handle between samples, since CPU usage is a difference
/// between two readings.
pub(crate) struct StatsSampler {
    system: System,
}

impl StatsSampler {
    pub(crate) fn new() -> Self {
        StatsSampler { system: System::new() }
    }

    pub(crate) fn sample(&mut self) -> NodeStats {
        self.system.refresh_cpu_usage();
        self.system.refresh_memory();
        NodeStats {
            cpu_percent: f64::from(self.system.global_cpu_usage()),
            memory_used_bytes: self.system.used_memory(),
            memory_total_bytes: self.system.total_memory(),
        }
    }
}
