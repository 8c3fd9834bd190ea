//! What a train loop sees on its worker: its rank in the world, the
//! collective group, its shard of each dataset, the checkpoint to resume
//! from, and `report`, which sends metrics and checkpoints to the driver.

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;

use raylet::ObjectRef;
use serde::de::DeserializeOwned;

use crate::checkpoint::RunDirectory;
use crate::collective::CollectiveGroup;
use crate::worker_event::WorkerEvent;
use crate::{Checkpoint, Metrics, TrainError};

/// One worker's view of its run.
pub struct TrainContext {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
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

    /// The device to train on: this worker's GPU (the first it may see)
    /// when the run uses GPUs and the `cuda` feature is on, else the CPU.
    pub fn device(&self) -> burn::prelude::Device {
        #[cfg(feature = "cuda")]
        if self.use_gpu() {
            return burn::prelude::Device::cuda(0);
        }
        burn::prelude::Device::flex()
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
        raylet::proto::codec::decode(&bytes)
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
