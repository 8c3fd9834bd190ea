//! The driver of a data-parallel run: `Trainer::new(train_loop)`, its
//! workers (`scaling`), where its results go (`run_config`), its datasets,
//! then `fit()`, which trains, restarts the workers from the latest
//! checkpoint when one fails, and returns every report and checkpoint.

mod attempt;
mod dashboard;
mod progress;
mod result;
mod run_state;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Instant;

use raylet::{Cluster, ObjectRef};
use serde::Serialize;

use raylet_storage::StorageOptions;

use crate::checkpoint::RunDirectory;
use crate::train_loop::{TrainLoop, registered_name};
use crate::{RunConfig, ScalingConfig, TrainError};
use attempt::{AttemptError, Plan};
use dashboard::RunBoard;
use progress::Progress;
use run_state::RunState;

pub use result::{Report, TrainResult};

/// Cuts a dataset into a given number of equal shards, each encoded.
type SplitDataset = Box<dyn Fn(usize) -> Result<Vec<Vec<u8>>, TrainError> + Send>;

/// A data-parallel training run.
pub struct Trainer<L: TrainLoop> {
    train_loop: L,
    scaling: ScalingConfig,
    run: RunConfig,
    storage_options: StorageOptions,
    datasets: BTreeMap<String, SplitDataset>,
}

impl<L: TrainLoop> Trainer<L> {
    /// A run of `train_loop` on one worker, until configured otherwise.
    pub fn new(train_loop: L) -> Self {
        Trainer {
            train_loop,
            scaling: ScalingConfig::default(),
            run: RunConfig::default(),
            storage_options: StorageOptions::default(),
            datasets: BTreeMap::new(),
        }
    }

    pub fn scaling(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = scaling;
        self
    }

    pub fn run_config(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// How a `storage_path` in object storage (`s3://bucket/prefix`) is
    /// opened, over the `AWS_*` variables of each process that opens it.
    pub fn storage_options(mut self, options: StorageOptions) -> Self {
        self.storage_options = options;
        self
    }

    /// A dataset that every worker gets an equal shard of, through
    /// [`TrainContext::dataset_shard`](crate::TrainContext::dataset_shard):
    /// contiguous runs of rows, with the last `rows % workers` rows left out
    /// so that every rank takes the same number of steps.
    pub fn dataset<T: Serialize + Send + 'static>(mut self, name: &str, rows: Vec<T>) -> Self {
        let split: SplitDataset = Box::new(move |shards| split_rows(&rows, shards));
        self.datasets.insert(name.to_string(), split);
        self
    }

    /// Trains on the current cluster (see [`raylet::init`]).
    pub fn fit(self) -> Result<TrainResult, TrainError> {
        let cluster = raylet::current()?;
        self.fit_on(&cluster, &mut |_| ControlFlow::Continue(()))
    }

    /// Like [`Trainer::fit`], calling `on_report` with each of rank 0's
    /// reports as it comes; a `Break` ends the run there, as finished (a
    /// Tune trial that runs a Train run forwards its reports this way, and
    /// stops when its scheduler says so).
    pub fn fit_with_reports(
        self,
        mut on_report: impl FnMut(&Report) -> ControlFlow<()>,
    ) -> Result<TrainResult, TrainError> {
        let cluster = raylet::current()?;
        self.fit_on(&cluster, &mut on_report)
    }

    /// Trains on `cluster`: starts the workers, streams their reports, and
    /// restarts them from the latest checkpoint up to `max_failures` times.
    pub fn fit_on(
        self,
        cluster: &Cluster,
        on_report: &mut dyn FnMut(&Report) -> ControlFlow<()>,
    ) -> Result<TrainResult, TrainError> {
        let started = Instant::now();
        let train_loop = registered_name::<L>()?;
        self.check()?;
        let directory = RunDirectory::for_run(&self.run.storage_path, &self.run.name, &self.storage_options)?;
        let mut state = RunState::resume(directory, self.run.checkpoint.clone())?;
        let progress = Progress::new(
            &self.run.name,
            self.train_loop.reports(),
            state.next_report(),
            self.run.verbose,
        );
        if let Some(checkpoint) = state.latest() {
            progress.line(&format!("resuming from {}", checkpoint.path().display()));
        }
        let plan = self.plan(cluster, train_loop, &state)?;
        let mut board = RunBoard::start(cluster, &self.run.name, self.scaling.num_workers);
        let mut on_report = |report: &Report| {
            board.report(report);
            on_report(report)
        };
        let failures = self.run_tries(cluster, &plan, &mut state, &progress, &mut on_report);
        board.finish(failures.is_ok());
        progress.finish();
        let failures = failures?;
        Ok(state.into_result(failures, started.elapsed()))
    }

    fn check(&self) -> Result<(), TrainError> {
        let invalid = |why: &str| Err(TrainError::InvalidConfig(why.to_string()));
        if self.scaling.num_workers == 0 {
            return invalid("num_workers must be at least 1");
        }
        let name = &self.run.name;
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return invalid("the run's name must be a plain directory name: not empty, no '/', no leading '.'");
        }
        let resources = &self.scaling.resources_per_worker;
        let amounts = [resources.num_cpus, resources.num_gpus, resources.memory];
        if amounts
            .into_iter()
            .chain(resources.custom.values().copied())
            .any(|a| a.is_nan() || a < 0.0)
        {
            return invalid("resources_per_worker must not be negative");
        }
        Ok(())
    }

    /// Encodes the train loop and puts every rank's dataset shards in the
    /// object store, once for every try.
    fn plan(&self, cluster: &Cluster, train_loop: &'static str, state: &RunState) -> Result<Plan, TrainError> {
        let config = raylet::proto::codec::encode(&self.train_loop)
            .map_err(|e| TrainError::InvalidConfig(format!("encoding the train loop: {e}")))?;
        let workers = self.scaling.num_workers;
        let mut shards = vec![BTreeMap::new(); workers];
        for (name, split) in &self.datasets {
            for (rank, shard) in split(workers)?.into_iter().enumerate() {
                let stored: ObjectRef<Vec<u8>> = cluster.put(&shard)?;
                shards[rank].insert(name.clone(), stored);
            }
        }
        Ok(Plan {
            train_loop,
            config,
            scaling: self.scaling.clone(),
            group_prefix: format!("raylet-train/{}/{:016x}", self.run.name, rand::random::<u64>()),
            collective_timeout: self.run.failure.collective_timeout,
            run_directory: state.directory().clone(),
            shards,
        })
    }

    /// Runs tries until one finishes; returns how many failed.
    fn run_tries(
        &self,
        cluster: &Cluster,
        plan: &Plan,
        state: &mut RunState,
        progress: &Progress,
        on_report: &mut dyn FnMut(&Report) -> ControlFlow<()>,
    ) -> Result<u32, TrainError> {
        let max_failures = self.run.failure.max_failures;
        let mut failures = 0;
        loop {
            let why = match attempt::run(cluster, plan, failures, state, progress, on_report) {
                Ok(()) | Err(AttemptError::Stopped) => return Ok(failures),
                Err(AttemptError::Fatal(error)) => return Err(error),
                Err(AttemptError::Failed(why)) => why,
            };
            failures += 1;
            if failures > max_failures {
                return Err(TrainError::TooManyFailures {
                    failures,
                    max_failures,
                    last: why,
                });
            }
            let from = state
                .latest()
                .map(|c| c.path().display().to_string())
                .unwrap_or_else(|| "the start (no checkpoint yet)".into());
            progress.line(&format!(
                "try {} failed ({failures} of {max_failures} allowed): {why}; restarting from {from}",
                failures - 1
            ));
        }
    }
}

/// `rows` cut into `shards` equal, contiguous parts, each encoded.
fn split_rows<T: Serialize>(rows: &[T], shards: usize) -> Result<Vec<Vec<u8>>, TrainError> {
    let per_shard = rows.len() / shards;
    (0..shards)
        .map(|shard| {
            let part = &rows[shard * per_shard..(shard + 1) * per_shard];
            raylet::proto::codec::encode(part)
                .map_err(|e| TrainError::InvalidConfig(format!("encoding a dataset shard: {e}")))
        })
        .collect()
}
