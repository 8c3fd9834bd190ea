//! How a training run is laid out and kept: its workers and their
//! resources, where its checkpoints go and which of them are kept, and how
//! often it may fail before it gives up.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::LrScaling;

pub use raylet::PlacementStrategy as Placement;

/// The workers of a run.
#[derive(Clone, Debug)]
pub struct ScalingConfig {
    /// How many workers train together; each is one rank of the group.
    pub num_workers: usize,
    /// What each worker holds while it runs.
    pub resources_per_worker: WorkerResources,
    /// Each worker holds one GPU, and [`TrainContext::device`](crate::TrainContext::device)
    /// picks it when the `cuda` feature is on.
    pub use_gpu: bool,
    /// How the workers' bundles spread over the nodes.
    pub placement: Placement,
    /// Run with as many workers as the cluster holds, between a minimum and
    /// `num_workers` ([`ScalingConfig::elastic`]); `None`: exactly
    /// `num_workers`, waiting for room.
    pub elastic: Option<ElasticScaling>,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            num_workers: 1,
            resources_per_worker: WorkerResources::default(),
            use_gpu: false,
            placement: Placement::Pack,
            elastic: None,
        }
    }
}

impl ScalingConfig {
    /// An elastic group of `min_workers` to `max_workers`: each try starts
    /// with as many workers as the cluster has room for (waiting for
    /// `min_workers`), grows at a checkpoint when room for another appears,
    /// and after a worker's loss goes on with the workers there is room for
    /// instead of waiting for a replacement. The global batch stays fixed
    /// unless [`ElasticScaling::batch`] says otherwise.
    pub fn elastic(min_workers: usize, max_workers: usize) -> Self {
        ScalingConfig {
            num_workers: max_workers,
            elastic: Some(ElasticScaling {
                min_workers,
                batch: BatchScaling::FixedGlobalBatch,
            }),
            ..ScalingConfig::default()
        }
    }

    /// The fewest workers a try may start with.
    pub fn min_workers(&self) -> usize {
        self.elastic.as_ref().map_or(self.num_workers, |e| e.min_workers)
    }

    /// How the batch and learning rate follow the number of workers.
    pub fn batch_scaling(&self) -> BatchScaling {
        self.elastic
            .as_ref()
            .map_or(BatchScaling::FixedGlobalBatch, |e| e.batch)
    }
}

/// The bounds of an elastic group (its maximum is `num_workers`).
#[derive(Clone, Debug, PartialEq)]
pub struct ElasticScaling {
    pub min_workers: usize,
    pub batch: BatchScaling,
}

/// How a train loop's batch and learning rate follow the number of workers
/// (see [`TrainContext::local_batch_size`](crate::TrainContext::local_batch_size)
/// and [`TrainContext::learning_rate`](crate::TrainContext::learning_rate)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchScaling {
    /// The global batch and the learning rate stay as configured; each
    /// worker takes its share of the batch.
    #[default]
    FixedGlobalBatch,
    /// Each worker keeps the batch it has with `num_workers` workers, so the
    /// global batch follows the workers, and the learning rate with it, by
    /// the rule given.
    ScaledGlobalBatch(LrScaling),
}

/// The resources of one worker: its bundle in the run's placement group.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerResources {
    pub num_cpus: f64,
    pub num_gpus: f64,
    /// Bytes of memory.
    pub memory: f64,
    /// Any other resource by name, e.g. `"TPU" => 1.0`.
    pub custom: BTreeMap<String, f64>,
}

impl WorkerResources {
    /// `builder` asking for these resources.
    pub fn request<H: From<raylet::ActorHandle>>(&self, builder: raylet::ActorBuilder<H>) -> raylet::ActorBuilder<H> {
        let mut builder = builder.num_cpus(self.num_cpus).num_gpus(self.num_gpus);
        if self.memory > 0.0 {
            builder = builder.memory(self.memory);
        }
        for (name, amount) in &self.custom {
            builder = builder.resource(name, *amount);
        }
        builder
    }
}

impl Default for WorkerResources {
    fn default() -> Self {
        WorkerResources {
            num_cpus: 1.0,
            num_gpus: 0.0,
            memory: 0.0,
            custom: BTreeMap::new(),
        }
    }
}

/// Where a run keeps its results, and how it survives failures.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The run's name: its directory under `storage_path`. A run given the
    /// name of an earlier one resumes from that run's latest checkpoint.
    pub name: String,
    /// The directory of runs. Every worker writes checkpoints here, so on a
    /// cluster of several nodes it must be shared storage (e.g. NFS).
    pub storage_path: PathBuf,
    pub checkpoint: CheckpointConfig,
    pub failure: FailureConfig,
    /// Show a progress bar and a line per report on standard error.
    pub verbose: bool,
}

/// Where runs and experiments go by default: `~/raylet_results`.
pub fn default_storage_path() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join("raylet_results")
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            name: "train".to_string(),
            storage_path: default_storage_path(),
            checkpoint: CheckpointConfig::default(),
            failure: FailureConfig::default(),
            verbose: true,
        }
    }
}

/// Which checkpoints a run keeps. The latest is always kept, as the run
/// restarts from it.
#[derive(Clone, Debug, Default)]
pub struct CheckpointConfig {
    /// Keep this many besides the latest (all when `None`): the best ones by
    /// `score_metric`, or the newest ones without it.
    pub num_to_keep: Option<usize>,
    /// The reported metric that ranks checkpoints.
    pub score_metric: Option<String>,
    pub mode: ScoreMode,
}

/// Whether a higher or a lower score is better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreMode {
    #[default]
    Max,
    Min,
}

/// How a run treats failed workers.
#[derive(Clone, Debug)]
pub struct FailureConfig {
    /// How many times the whole group may fail (a worker dies, or a train
    /// loop returns an error) and restart from the latest checkpoint.
    pub max_failures: u32,
    /// How long a collective call waits for a peer before it fails.
    pub collective_timeout: Duration,
}

impl Default for FailureConfig {
    fn default() -> Self {
        FailureConfig {
            max_failures: 0,
            collective_timeout: Duration::from_secs(300),
        }
    }
}
