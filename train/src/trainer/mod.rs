//! The driver of a data-parallel run: `Trainer::new(train_loop)`, its
//! workers (`scaling`), where its results go (`run_config`), its datasets
//! and callbacks, then `fit()`, which trains, restarts the workers from the
//! latest checkpoint when one fails, and returns every report and
//! checkpoint.

mod attempt;
mod dashboard;
mod progress;
mod result;
mod room;
mod run_state;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Instant;

use raylet::{Cluster, ObjectRef};
use serde::Serialize;

use raylet_storage::StorageOptions;

use crate::callback::{Callbacks, RunStart, TrainCallback};
use crate::checkpoint::RunDirectory;
use crate::train_loop::{TrainLoop, registered_name};
use crate::{RunConfig, ScalingConfig, TrainError};
use attempt::{AttemptError, Plan, RankShards};
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
    callbacks: Callbacks,
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
            callbacks: Callbacks::default(),
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

    /// Adds a callback told of the run's start, reports, checkpoints and
    /// end (such as [`MlflowCallback`](crate::mlflow::MlflowCallback)).
    /// Callbacks are called in the order they were added.
    pub fn callback(mut self, callback: impl TrainCallback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
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
        mut self,
        cluster: &Cluster,
        on_report: &mut dyn FnMut(&Report) -> ControlFlow<()>,
    ) -> Result<TrainResult, TrainError> {
        let started = Instant::now();
        let train_loop = registered_name::<L>()?;
        self.check()?;
        let directory = RunDirectory::for_run(&self.run.storage_path, &self.run.name, &self.storage_options)?;
        let mut callbacks = std::mem::take(&mut self.callbacks);
        callbacks.start(|| self.run_start(&directory))?;
        let trained = self.train(cluster, train_loop, directory, &mut callbacks, on_report);
        callbacks.end(trained.map(|(state, failures)| state.into_result(failures, started.elapsed())))
    }

    /// The run from its directory on: its tries, each report shown, kept
    /// and given to the callbacks and to `on_report`.
    fn train(
        &self,
        cluster: &Cluster,
        train_loop: &'static str,
        directory: RunDirectory,
        callbacks: &mut Callbacks,
        on_report: &mut dyn FnMut(&Report) -> ControlFlow<()>,
    ) -> Result<(RunState, u32), TrainError> {
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
        let mut callback_error = None;
        let mut on_report = |report: &Report| {
            board.report(report);
            if let Err(error) = callbacks.report(report) {
                callback_error = Some(error);
                return ControlFlow::Break(());
            }
            on_report(report)
        };
        let failures = self.run_tries(cluster, &plan, &mut state, &progress, &mut on_report);
        let failures = callback_error.map_or(failures, Err);
        board.finish(failures.is_ok());
        progress.finish();
        Ok((state, failures?))
    }

    /// What the callbacks are told when the run starts.
    fn run_start<'a>(&'a self, directory: &'a RunDirectory) -> Result<RunStart<'a>, TrainError> {
        let config = self
            .train_loop
            .callback_config()
            .map_err(|e| TrainError::InvalidConfig(format!("the train loop as JSON, for its callbacks: {e}")))?;
        Ok(RunStart {
            name: &self.run.name,
            config,
            scaling: &self.scaling,
            directory: directory.root(),
        })
    }

    fn check(&self) -> Result<(), TrainError> {
        let invalid = |why: &str| Err(TrainError::InvalidConfig(why.to_string()));
        if self.scaling.num_workers == 0 {
            return invalid("num_workers must be at least 1");
        }
        if !(1..=self.scaling.num_workers).contains(&self.scaling.min_workers()) {
            return invalid("an elastic group's min_workers must be at least 1 and at most its max_workers");
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
    /// object store, for every size the group may have, once for every try.
    fn plan(&self, cluster: &Cluster, train_loop: &'static str, state: &RunState) -> Result<Plan, TrainError> {
        let config = raylet::codec::encode(&self.train_loop)
            .map_err(|e| TrainError::InvalidConfig(format!("encoding the train loop: {e}")))?;
        let mut shards = BTreeMap::new();
        for workers in self.scaling.min_workers()..=self.scaling.num_workers {
            shards.insert(workers, self.put_shards(cluster, workers)?);
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

    /// Each of `workers` ranks' shard of each dataset, in the object store.
    fn put_shards(&self, cluster: &Cluster, workers: usize) -> Result<RankShards, TrainError> {
        let mut shards = vec![BTreeMap::new(); workers];
        for (name, split) in &self.datasets {
            for (rank, shard) in split(workers)?.into_iter().enumerate() {
                let stored: ObjectRef<Vec<u8>> = cluster.put(&shard)?;
                shards[rank].insert(name.clone(), stored);
            }
        }
        Ok(shards)
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
        let (mut next_attempt, mut wanted) = (0, None);
        loop {
            let attempt = next_attempt;
            next_attempt += 1;
            let why = match attempt::run(cluster, plan, attempt, wanted.take(), state, progress, on_report) {
                Ok(()) | Err(AttemptError::Stopped) => return Ok(failures),
                Err(AttemptError::Fatal(error)) => return Err(error),
                Err(AttemptError::Grow { workers, why }) => {
                    progress.line(&format!("try {attempt} ends at its checkpoint to grow: {why}"));
                    wanted = Some(workers);
                    continue;
                }
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
                "try {attempt} failed ({failures} of {max_failures} allowed): {why}; restarting from {from}"
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
            raylet::codec::encode(part).map_err(|e| TrainError::InvalidConfig(format!("encoding a dataset shard: {e}")))
        })
        .collect()
}
