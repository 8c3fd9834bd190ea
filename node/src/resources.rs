//! Detects a machine's resources (CPUs and memory with sysinfo, GPUs with a
//! [`GpuDetector`]) and applies the user's overrides and custom resources.

use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::{Amount, ResourceSet, Result};
use sysinfo::{CpuRefreshKind, System};

use super::gpu_devices::GpuDetector;

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

/// Resolves the node's total resources: overrides first, then detection
/// (GPUs through `gpus`). Every amount is validated, so bad input fails here
/// with a clear message.
pub fn resolve(overrides: &ResourceOverrides, gpus: &dyn GpuDetector) -> Result<ResourceSet> {
    let machine_memory = machine_memory_bytes() as f64;
    let object_store = overrides
        .object_store_memory
        .unwrap_or((machine_memory * OBJECT_STORE_SHARE).floor());
    let memory = overrides
        .memory
        .unwrap_or((machine_memory - object_store).max(0.0).floor());
    let cpus = overrides.num_cpus.unwrap_or_else(|| detect_cpus() as f64);
    let gpus = overrides.num_gpus.unwrap_or_else(|| gpus.read().len() as f64);
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

#[cfg(test)]
mod tests {
    use super::super::gpu_devices::FakeGpus;
    use super::*;

    #[test]
    fn overrides_win_and_the_rest_is_detected() {
        let overrides = ResourceOverrides {
            num_cpus: Some(3.0),
            num_gpus: Some(0.5),
            custom: ResourceSet::parse_custom_json(r#"{"TPU": 4}"#).unwrap(),
            ..Default::default()
        };
        let total = resolve(&overrides, &FakeGpus::new(0)).unwrap();
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
        let total = resolve(&ResourceOverrides::default(), &FakeGpus::new(0)).unwrap();
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
            assert!(resolve(&overrides, &FakeGpus::new(0)).is_err(), "{overrides:?}");
        }
    }

    #[test]
    fn gpus_are_counted_by_the_detector_unless_overridden() {
        for count in [0, 1, 8] {
            let total = resolve(&ResourceOverrides::default(), &FakeGpus::new(count)).unwrap();
            assert_eq!(total.get(GPU), Amount::whole(count.into()), "{count} GPUs");
        }
        let overrides = ResourceOverrides {
            num_gpus: Some(2.0),
            ..Default::default()
        };
        assert_eq!(
            resolve(&overrides, &FakeGpus::new(8)).unwrap().get(GPU),
            Amount::whole(2)
        );
    }
}
