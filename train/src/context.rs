//! What a train loop sees on its worker: its rank in the world, the
//! collective group, its shard of each dataset, the checkpoint to resume
//! from, and `report`, which sends metrics and checkpoints to the driver.

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;

use raylet::ObjectRef;
use serde::de::DeserializeOwned;

use crate::checkpoint::RunDirectory;
use crate::collective::CollectiveGroup;
use crate::schedule::scaled_learning_rate;
use crate::worker_event::WorkerEvent;
use crate::{BatchScaling, Checkpoint, Metrics, TrainError};

/// One worker's view of its run.
pub struct TrainContext {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) max_workers: usize,
    pub(crate) batch_scaling: BatchScaling,
    pub(crate) attempt: u32,
    pub(crate) use_gpu: bool,
    pub(crate) group: CollectiveGroup,
    pub(crate) resume_from: Option<Checkpoint>,
    pub(crate) next_report: u64,
    pub(crate) shards: BTreeMap<String, ObjectRef<Vec<u8>>>,
    pub(crate) run_directory: RunDirectory,
    pub(crate) events: Sender<WorkerEvent>,
}

impl TrainContext {
    /// This worker's rank: 0 to `world_size() - 1`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The most workers the run may have: `world_size()` unless the group
    /// is elastic, whose tries may have fewer.
    pub fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// This worker's batch for a run configured with `global_batch_size`
    /// over [`TrainContext::max_workers`] workers, by the run's
    /// [`BatchScaling`]: its share of the global batch, or with a scaled
    /// global batch the share it would have with every worker.
    pub fn local_batch_size(&self, global_batch_size: usize) -> usize {
        let workers = match self.batch_scaling {
            BatchScaling::FixedGlobalBatch => self.world_size,
            BatchScaling::ScaledGlobalBatch(_) => self.max_workers,
        };
        (global_batch_size / workers.max(1)).max(1)
    }

    /// The learning rate for this try when `base_lr` suits
    /// `global_batch_size`: unchanged with a fixed global batch, else scaled
    /// to the global batch this try's workers make.
    pub fn learning_rate(&self, base_lr: f64, global_batch_size: usize) -> f64 {
        match self.batch_scaling {
            BatchScaling::FixedGlobalBatch => base_lr,
            BatchScaling::ScaledGlobalBatch(rule) => {
                let global = self.local_batch_size(global_batch_size) * self.world_size;
                scaled_learning_rate(base_lr, global_batch_size, global, rule)
            }
        }
    }

    /// Which try of the run this is: 0, then one more after each failure.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The group of every worker of this try of the run.
    pub fn group(&mut self) -> &mut CollectiveGroup {
        &mut self.group
    }

    /// The latest checkpoint of the run when this try began: resume from
    /// it. `None` on a fresh run.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.resume_from.as_ref()
    }

    /// Whether the run gave this worker a GPU (`ScalingConfig::use_gpu`).
    pub fn use_gpu(&self) -> bool {
        self.use_gpu
    }

    /// The device to train on: this worker's GPU when the run uses GPUs and
    /// the `cuda` feature (the first GPU `CUDA_VISIBLE_DEVICES` shows it)
    /// or the `vulkan` feature (the discrete GPU whose index is its first
    /// GPU id: Vulkan ignores `CUDA_VISIBLE_DEVICES`) is on, else the CPU
    /// (with libtorch's kernels under the `libtorch` feature).
    #[cfg(feature = "burn")]
    pub fn device(&self) -> burn::prelude::Device {
        #[cfg(feature = "cuda")]
        if self.use_gpu() {
            return burn::prelude::Device::cuda(0);
        }
        #[cfg(feature = "vulkan")]
        if self.use_gpu() {
            let gpu = raylet::gpu_ids().first().map_or(0, |&id| id as usize);
            return burn::prelude::Device::vulkan(burn::tensor::DeviceKind::DiscreteGpu(gpu));
        }
        cpu_device()
    }

    /// This worker's shard of the dataset `name`: an equal part of its rows
    /// for every worker.
    pub fn dataset_shard<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>, TrainError> {
        let Some(shard) = self.shards.get(name) else {
            let known: Vec<&str> = self.shards.keys().map(String::as_str).collect();
            return Err(TrainError::UnknownDataset {
                name: name.to_string(),
                known: known.join(", "),
            });
        };
        let bytes = shard.get()?;
        raylet::codec::decode(&bytes)
            .map_err(|e| TrainError::Loop(format!("dataset `{name}` does not decode as the rows asked for: {e}")))
    }

    /// An empty checkpoint directory to write into, then pass to
    /// [`TrainContext::report`].
    pub fn new_checkpoint(&self) -> Result<Checkpoint, TrainError> {
        self.run_directory.stage(self.rank)
    }

    /// Sends `metrics`, and a checkpoint written since
    /// [`TrainContext::new_checkpoint`], to the driver. Every rank may call
    /// it; rank 0's reports are the run's, and other ranks' are dropped.
    pub fn report(&mut self, metrics: Metrics, checkpoint: Option<Checkpoint>) -> Result<(), TrainError> {
        if self.rank != 0 {
            if let Some(staged) = checkpoint {
                std::fs::remove_dir_all(staged.path()).map_err(|e| TrainError::checkpoint(staged.path(), e))?;
            }
            return Ok(());
        }
        let index = self.next_report;
        let checkpoint = match checkpoint {
            Some(staged) => Some(self.run_directory.commit(&staged, index, &metrics)?),
            None => None,
        };
        self.next_report += 1;
        let event = WorkerEvent::Report {
            index,
            metrics,
            checkpoint,
        };
        self.events
            .send(event)
            .map_err(|_| TrainError::Loop("the worker stopped taking reports".into()))
    }
}

/// The CPU device raylet trains and infers on without a GPU: burn's flex
/// backend, or libtorch's kernels under the `libtorch` feature (burn 0.22
/// deprecates its tch backend; it is still the fastest of its CPU backends,
/// as measured in BENCHMARKS.md).
#[cfg_attr(feature = "libtorch", allow(deprecated))]
#[cfg(feature = "burn")]
pub fn cpu_device() -> burn::prelude::Device {
    #[cfg(feature = "libtorch")]
    return burn::prelude::Device::libtorch();
    #[cfg(not(feature = "libtorch"))]
    burn::prelude::Device::flex()
}
