//! How a search is set up: its objective and size, where its results go,
//! and what each trial holds while it runs.

use std::path::PathBuf;

use crate::Mode;

pub use raylet_train::WorkerResources as TrialResources;

/// The search: what to optimize and how many trials to run at once.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    /// The reported metric that searchers and schedulers optimize.
    pub metric: Option<String>,
    pub mode: Mode,
    /// How many trials (for the basic variant searcher: how many times
    /// the grid is walked).
    pub num_samples: usize,
    /// At most this many trials run at once; by default as many as the
    /// cluster's resources hold.
    pub max_concurrent_trials: Option<usize>,
    /// Run the next trial on the actor of a finished one instead of
    /// starting a new actor.
    pub reuse_actors: bool,
}

impl Default for TuneConfig {
    fn default() -> Self {
        TuneConfig {
            metric: None,
            mode: Mode::Max,
            num_samples: 1,
            max_concurrent_trials: None,
            reuse_actors: true,
        }
    }
}

/// Where the experiment keeps its results, and how it treats failures.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The experiment's name: its directory under `storage_path`.
    pub name: String,
    /// Where experiments are kept: a directory, or object storage
    /// (`"s3://bucket/prefix".into()`, opened with
    /// [`Tuner::storage_options`](crate::Tuner::storage_options)), where
    /// the experiment's files, its trials' results and their checkpoints
    /// are mirrored from a local copy on each node, in the same layout.
    /// Trial actors write checkpoints here, so on a cluster of several nodes
    /// a directory must be shared storage.
    pub storage_path: PathBuf,
    /// How many times a trial may fail (its trainable errs or its actor
    /// dies) and restart from its latest checkpoint.
    pub max_failures: u32,
    /// 0: silent; 1: the trial table; 2: also a line per result.
    pub verbose: u8,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            name: "tune".to_string(),
            storage_path: raylet_train::default_storage_path(),
            max_failures: 0,
            verbose: 1,
        }
    }
}
