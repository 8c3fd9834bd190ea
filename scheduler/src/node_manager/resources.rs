//! Detects a machine's resources (CPUs and memory with sysinfo, GPUs with
//! `nvidia-smi -L`) and applies the user's overrides and custom resources.

use std::process::Command;

use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::{Amount, ResourceSet, Result};
use sysinfo::{CpuRefreshKind, System};

/// Share of the machine's memory given to the object store by default.
const OBJECT_STORE_SHARE: f64 = 0.3;

/// What the user asked for; anything left `None` is detected.
#[derive(Clone, Debug, Default)]
pub struct ResourceOverrides {
    pub num_cpus: Option<f64>,
    pub num_gpus: Option<f64>,
    /// Bytes of memory for tasks and actors.
    pub memory: Option<f64>,
    /// Bytes of object store.
    pub object_store_memory: Option<f64>,
    pub custom: ResourceSet,
}

/// Resolves the node's total resources: overrides first, then detection.
/// Every amount is validated, so bad input fails here with a clear message.
pub fn resolve(overrides: &ResourceOverrides) -> Result<ResourceSet> {
    let machine_memory = machine_memory_bytes() as f64;
    let object_store = overrides
        .object_store_memory
        .unwrap_or((machine_memory * OBJECT_STORE_SHARE).floor());
    let memory = overrides
        .memory
        .unwrap_or((machine_memory - object_store).max(0.0).floor());
    let cpus = overrides.num_cpus.unwrap_or_else(|| detect_cpus() as f64);
    let gpus = overrides.num_gpus.unwrap_or_else(|| detect_gpus() as f64);
    let mut total = overrides.custom.clone();
    for (name, value) in [
        (CPU, cpus),
        (GPU, gpus),
        (MEMORY, memory),
        (OBJECT_STORE_MEMORY, object_store),
    ] {
        total.set(name, Amount::parse(name, value)?);
    }
    Ok(total)
}

fn detect_cpus() -> usize {
    let mut system = System::new();
    system.refresh_cpu_list(CpuRefreshKind::nothing());
    system.cpus().len().max(1)
}

/// Physical memory, or the cgroup's limit when that is lower.
fn machine_memory_bytes() -> u64 {
    let mut system = System::new();
    system.refresh_memory();
    let physical = system.total_memory();
    match system.cgroup_limits() {
        Some(limits) if limits.total_memory > 0 => physical.min(limits.total_memory),
        _ => physical,
    }
}

/// Counts the lines `nvidia-smi -L` prints for GPUs; 0 when it is absent.
fn detect_gpus() -> usize {
    match Command::new("nvidia-smi").arg("-L").output() {
        Ok(output) if output.status.success() => count_gpu_lines(&String::from_utf8_lossy(&output.stdout)),
        _ => 0,
    }
}

fn count_gpu_lines(listing: &str) -> usize {
    listing.lines().filter(|line| line.starts_with("GPU ")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_and_the_rest_is_detected() {
        let overrides = ResourceOverrides {
            num_cpus: Some(3.0),
            num_gpus: Some(0.5),
            custom: ResourceSet::parse_custom_json(r#"{"TPU": 4}"#).unwrap(),
            ..Default::default()
        };
        let total = resolve(&overrides).unwrap();
        assert_eq!(total.get(CPU).to_string(), "3.0");
        assert_eq!(total.get(GPU).to_string(), "0.5");
        assert_eq!(total.get("TPU").to_string(), "4.0");
        let memory = total.get(MEMORY).as_f64();
        let store = total.get(OBJECT_STORE_MEMORY).as_f64();
        let ratio = store / (memory + store);
        assert!((ratio - OBJECT_STORE_SHARE).abs() < 0.01, "object store share {ratio}");
    }

    #[test]
    fn detection_finds_at_least_one_cpu() {
        let total = resolve(&ResourceOverrides::default()).unwrap();
        assert!(total.get(CPU) >= Amount::whole(1));
    }

    #[test]
    fn bad_overrides_are_errors() {
        for overrides in [
            ResourceOverrides {
                num_cpus: Some(-2.0),
                ..Default::default()
            },
            ResourceOverrides {
                num_gpus: Some(f64::NAN),
                ..Default::default()
            },
            ResourceOverrides {
                memory: Some(1e300),
                ..Default::default()
            },
        ] {
            assert!(resolve(&overrides).is_err(), "{overrides:?}");
        }
    }

    #[test]
    fn gpu_lines_of_nvidia_smi_are_counted() {
        let listing = "GPU 0: NVIDIA H100 (UUID: GPU-1)\nGPU 1: NVIDIA H100 (UUID: GPU-2)\n";
        assert_eq!(count_gpu_lines(listing), 2);
        assert_eq!(count_gpu_lines("No devices found.\n"), 0);
    }
}
