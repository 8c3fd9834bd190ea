//! The machine's GPU devices, what each is and how busy: read through NVML
//! (the driver's `libnvidia-ml.so.1`, loaded at run time) or, in tests, from
//! a fake that has any number of GPUs and no device. A node started with
//! `CUDA_VISIBLE_DEVICES` (as Slurm starts jobs) has only those GPUs.

use std::fmt;
use std::sync::{Mutex, OnceLock};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use raylet_cluster_status::GpuStats;

/// Finds a machine's GPUs and reads their utilization. A node manager asks
/// once at start, for how many GPUs it offers, and at every heartbeat.
pub trait GpuDetector: Send + Sync + fmt::Debug {
    /// Every GPU, by the index CUDA gives it, with its latest readings.
    fn read(&self) -> Vec<GpuStats>;
}

/// The GPUs NVML reports. A machine without the NVIDIA driver has none;
/// that is said once in the log, with what to install.
#[derive(Debug, Default)]
pub struct NvmlDetector;

impl NvmlDetector {
    pub fn new() -> Self {
        NvmlDetector
    }
}

/// NVML, started once per process however many detectors there are (a
/// `raylet start` resolves its resources, then heartbeats, with its own).
fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(load_nvml).as_ref()
}

fn load_nvml() -> Option<Nvml> {
    match Nvml::init() {
        Ok(nvml) => Some(nvml),
        Err(NvmlError::LibloadingError(_)) => {
            tracing::debug!("no NVML (libnvidia-ml.so.1, part of the NVIDIA driver): no GPUs detected");
            None
        }
        Err(error) => {
            tracing::warn!(%error, "NVML did not start, so no GPUs are detected; pass --num-gpus to offer them");
            None
        }
    }
}

impl GpuDetector for NvmlDetector {
    fn read(&self) -> Vec<GpuStats> {
        let Some(nvml) = nvml() else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or_else(|error| {
            tracing::warn!(%error, "NVML could not count the GPUs");
            0
        });
        let gpus = (0..count).map(|index| read_device(nvml, index)).collect();
        match visible_devices() {
            Some(visible) => only_visible(gpus, &visible),
            None => gpus,
        }
    }
}

/// The GPUs this process's `CUDA_VISIBLE_DEVICES` lets it use (indices or
/// UUIDs, as CUDA reads them); `None` when it is unset.
pub(crate) fn visible_devices() -> Option<Vec<String>> {
    let value = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let names = value.split(',').map(str::trim).filter(|name| !name.is_empty());
    Some(names.map(String::from).collect())
}

/// `gpus` narrowed to those `visible` names, in its order: the order CUDA
/// numbers them in for this process.
fn only_visible(gpus: Vec<GpuStats>, visible: &[String]) -> Vec<GpuStats> {
    let names = |gpu: &GpuStats, name: &str| {
        gpu.index.to_string() == name || (name.starts_with("GPU-") && gpu.uuid.starts_with(name))
    };
    visible
        .iter()
        .filter_map(|name| gpus.iter().find(|gpu| names(gpu, name)).cloned())
        .collect()
}

/// One GPU's readings; a GPU the driver lost reads as lost, not as absent,
/// so that its index still names it.
fn read_device(nvml: &Nvml, index: u32) -> GpuStats {
    let lost = |error: NvmlError| GpuStats {
        index,
        name: String::new(),
        uuid: String::new(),
        memory_total_bytes: 0,
        memory_used_bytes: 0,
        utilization_percent: 0.0,
        fault: Some(error.to_string()),
    };
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(error) => return lost(error),
    };
    let (memory, utilization) = match (device.memory_info(), device.utilization_rates()) {
        (Ok(memory), Ok(utilization)) => (memory, utilization),
        (Err(error), _) | (_, Err(error)) => return lost(error),
    };
    GpuStats {
        index,
        name: device.name().unwrap_or_default(),
        uuid: device.uuid().unwrap_or_default(),
        memory_total_bytes: memory.total,
        memory_used_bytes: memory.used,
        utilization_percent: f64::from(utilization.gpu),
        fault: None,
    }
}

/// A machine with `count` identical GPUs that exist only here: for tests of
/// discovery, placement and reporting without a device. A GPU can be made
/// to fail, as one the driver lost would.
#[derive(Debug)]
pub struct FakeGpus {
    gpus: Mutex<Vec<GpuStats>>,
}

impl FakeGpus {
    /// `count` GPUs named `Fake GPU` with 80 GiB each, idle.
    pub fn new(count: u32) -> Self {
        let gpus = (0..count)
            .map(|index| GpuStats {
                index,
                name: "Fake GPU".to_string(),
                uuid: format!("GPU-fake-{index}"),
                memory_total_bytes: 80 << 30,
                memory_used_bytes: 0,
                utilization_percent: 0.0,
                fault: None,
            })
            .collect();
        FakeGpus { gpus: Mutex::new(gpus) }
    }

    /// Sets GPU `index`'s readings, as a workload on it would.
    pub fn set_busy(&self, index: u32, utilization_percent: f64, memory_used_bytes: u64) {
        if let Some(gpu) = self.lock().get_mut(index as usize) {
            gpu.utilization_percent = utilization_percent;
            gpu.memory_used_bytes = memory_used_bytes;
        }
    }

    /// Makes GPU `index` read as the driver reports a lost one.
    pub fn lose(&self, index: u32) {
        if let Some(gpu) = self.lock().get_mut(index as usize) {
            gpu.fault = Some("the GPU fell off the bus (NVML: GPU is lost)".to_string());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<GpuStats>> {
        super::lock(&self.gpus)
    }
}

impl GpuDetector for FakeGpus {
    fn read(&self) -> Vec<GpuStats> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_the_driver_has_no_gpus() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        assert!(NvmlDetector::new().read().is_empty());
    }

    #[test]
    fn only_the_gpus_cuda_visible_devices_names_are_kept_in_its_order() {
        let gpus = FakeGpus::new(4).read();
        let visible = ["3".to_string(), "GPU-fake-1".to_string(), "7".to_string()];
        let kept: Vec<u32> = only_visible(gpus.clone(), &visible)
            .iter()
            .map(|gpu| gpu.index)
            .collect();
        assert_eq!(kept, [3, 1], "an index, a UUID, and a GPU the machine lacks");
        assert!(only_visible(gpus, &[]).is_empty(), "an empty list hides every GPU");
    }

    #[test]
    fn fake_gpus_read_as_set() {
        let gpus = FakeGpus::new(8);
        gpus.set_busy(3, 75.0, 1 << 30);
        gpus.lose(5);
        let read = gpus.read();
        assert_eq!(read.len(), 8);
        assert_eq!(
            (read[3].utilization_percent, read[3].memory_used_bytes),
            (75.0, 1 << 30)
        );
        assert!(read[5].fault.as_deref().unwrap().contains("lost"));
        assert!(FakeGpus::new(0).read().is_empty());
    }
}
