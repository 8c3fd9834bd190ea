//! `Tuner`: runs a trainable over a search space, one trial per
//! configuration, trials in parallel on actors, under a searcher, a
//! scheduler and stoppers; returns a [`ResultGrid`](crate::ResultGrid).

mod actor_pool;
mod config;
mod controller;
mod dashboard;
mod experiment_state;
mod progress;
mod trial_state;

use std::fmt::Display;
use std::path::Path;
use std::time::Instant;

use raylet::Cluster;
use raylet_storage::{Storage, StorageOptions};
use raylet_train::RunDirectory;

use self::actor_pool::ActorPool;
pub use self::config::{RunConfig, TrialResources, TuneConfig};
use self::controller::{Controller, Plan};
use self::experiment_state::ExperimentState;
use self::progress::Progress;
use self::trial_state::Trial;
use crate::callback::{Callback, Callbacks};
use crate::schedulers::{Fifo, TrialScheduler};
use crate::search::{BasicVariant, SearchSetup, SearchSpace, Searcher};
use crate::stopper::Stopper;
use crate::trainable::registered_name;
use crate::{ResultGrid, TrialConfig, TrialContext, TrialResult, TuneError};

/// A hyperparameter search.
pub struct Tuner {
    trainable: Result<&'static str, TuneError>,
    space: SearchSpace,
    tune_config: TuneConfig,
    run_config: RunConfig,
    storage_options: StorageOptions,
    resources: TrialResources,
    searcher: Box<dyn Searcher>,
    scheduler: Box<dyn TrialScheduler>,
    stopper: Option<Box<dyn Stopper>>,
    callbacks: Callbacks,
    restoring: bool,
}

impl Tuner {
    /// A search over `trainable`, a function registered with
    /// [`register_trainable!`](crate::register_trainable). By default: one
    /// trial, random and grid search, FIFO, one CPU per trial.
    pub fn new<F, E>(trainable: F) -> Self
    where
        F: Fn(&TrialConfig, &mut TrialContext) -> Result<(), E>,
        E: Display,
    {
        Tuner {
            trainable: registered_name(&trainable),
            space: SearchSpace::new(),
            tune_config: TuneConfig::default(),
            run_config: RunConfig::default(),
            storage_options: StorageOptions::default(),
            resources: TrialResources::default(),
            searcher: Box::new(BasicVariant::new()),
            scheduler: Box::new(Fifo),
            stopper: None,
            callbacks: Callbacks::default(),
            restoring: false,
        }
    }

    /// Finishes the interrupted experiment in `path` (a directory, or a
    /// folder in object storage: `s3://bucket/prefix/name`, with
    /// [`Tuner::storage_options`]): its finished trials are kept and not run
    /// again; the others resume from their latest checkpoints, read from
    /// object storage where this node has no copy. Give it the same space,
    /// configs, searcher and scheduler as the first run (they are code, not
    /// saved state).
    pub fn restore<F, E>(path: impl AsRef<Path>, trainable: F) -> Self
    where
        F: Fn(&TrialConfig, &mut TrialContext) -> Result<(), E>,
        E: Display,
    {
        let path = path.as_ref();
        let mut tuner = Tuner::new(trainable);
        tuner.run_config.name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        tuner.run_config.storage_path = path.parent().map(Path::to_path_buf).unwrap_or_default();
        tuner.restoring = true;
        tuner
    }

    pub fn param_space(mut self, space: SearchSpace) -> Self {
        self.space = space;
        self
    }

    pub fn tune_config(mut self, config: TuneConfig) -> Self {
        self.tune_config = config;
        self
    }

    /// Where results go; on a restore, only `max_failures` and `verbose` are taken.
    pub fn run_config(mut self, config: RunConfig) -> Self {
        match self.restoring {
            true => {
                self.run_config.max_failures = config.max_failures;
                self.run_config.verbose = config.verbose;
            }
            false => self.run_config = config,
        }
        self
    }

    /// How a `storage_path` in object storage (`s3://bucket/prefix`) is
    /// opened: `aws_endpoint`, credentials, ... over the `AWS_*` variables.
    pub fn storage_options(mut self, options: StorageOptions) -> Self {
        self.storage_options = options;
        self
    }

    /// What each trial's actor holds (fractions allowed: `num_gpus: 0.5`).
    pub fn resources_per_trial(mut self, resources: TrialResources) -> Self {
        self.resources = resources;
        self
    }

    pub fn searcher(mut self, searcher: impl Searcher + 'static) -> Self {
        self.searcher = Box::new(searcher);
        self
    }

    pub fn scheduler(mut self, scheduler: impl TrialScheduler + 'static) -> Self {
        self.scheduler = Box::new(scheduler);
        self
    }

    /// Rules that end trials or the experiment besides the scheduler.
    pub fn stop(mut self, stopper: impl Stopper + 'static) -> Self {
        self.stopper = Some(Box::new(stopper));
        self
    }

    /// Adds a callback told of the experiment's and each trial's progress
    /// (such as [`MlflowCallback`](crate::MlflowCallback)), as Ray's
    /// `RunConfig(callbacks=[...])`; a builder call so that [`RunConfig`]
    /// stays plain data. Callbacks are called in the order they were added.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Runs the search on the current cluster (starting an embedded one if
    /// there is none) and returns every trial's outcome.
    pub fn fit(mut self) -> Result<ResultGrid, TuneError> {
        let trainable = std::mem::replace(&mut self.trainable, Ok(""))?;
        let cluster = raylet::init()?;
        let (directory, restored) = self.prepare_directory()?;
        let metric = self.tune_config.metric.as_deref();
        self.searcher.setup(&SearchSetup {
            space: &self.space,
            metric,
            mode: self.tune_config.mode,
            num_samples: self.tune_config.num_samples,
        })?;
        self.scheduler.setup(metric, self.tune_config.mode)?;
        let slots = trial_slots(&cluster, &self.resources, self.tune_config.max_concurrent_trials)?;
        let plan = Plan {
            trainable,
            directory: directory.clone(),
            name: self.run_config.name.clone(),
            metric: self.tune_config.metric.clone(),
            mode: self.tune_config.mode,
            num_samples: self.tune_config.num_samples,
            max_failures: self.run_config.max_failures,
        };
        let pool = ActorPool::new(&cluster, self.resources.clone(), self.tune_config.reuse_actors, slots);
        let progress = Progress::new(
            self.run_config.verbose,
            &self.run_config.name,
            self.tune_config.metric.clone(),
            self.tune_config.mode,
        );
        let mut controller = Controller::new(
            plan,
            self.searcher,
            self.scheduler,
            self.stopper,
            &cluster,
            pool,
            progress,
            self.callbacks,
        );
        if let Some(state) = restored {
            controller.restore(state)?;
        }
        let started = Instant::now();
        controller.run()?;
        tracing::info!(
            "experiment {} ran in {:.1?}",
            directory.location().display(),
            started.elapsed()
        );
        let grid = result_grid(controller.into_trials(), directory, &self.tune_config);
        grid.export()?;
        Ok(grid)
    }

    /// The experiment's directory (mirrored to `storage_path/name` in
    /// object storage), made here, and on a restore its state. A new
    /// experiment refuses a place that already holds one; nothing is made
    /// for a restore that finds none.
    fn prepare_directory(&self) -> Result<(RunDirectory, Option<ExperimentState>), TuneError> {
        let run = &self.run_config;
        let directory = RunDirectory::locate(&run.storage_path, &run.name, &self.storage_options);
        let state = experiment_state::load(&directory)?;
        match (self.restoring, &state) {
            (true, None) => {
                return Err(refused(
                    &directory,
                    "no experiment to restore here (it has no experiment_state.json)",
                ));
            }
            (false, Some(_)) => {
                return Err(refused(
                    &directory,
                    "an experiment of this name is already there: finish it with Tuner::restore(path, trainable), \
                     or give RunConfig another name",
                ));
            }
            (false, None) => check_reachable(&directory)?,
            (true, Some(_)) => {}
        }
        directory.prepare()?;
        Ok((directory, state))
    }
}

/// Why the experiment at `directory` cannot run as asked.
fn refused(directory: &RunDirectory, message: &str) -> TuneError {
    TuneError::Experiment {
        path: directory.location(),
        message: message.into(),
    }
}

/// Lists a new experiment's folder in object storage, so that a missing
/// bucket, bad credentials or an unreachable endpoint fail it before it
/// starts (reading its state file, which a new experiment lacks, cannot
/// tell them apart everywhere: some servers answer a missing bucket's
/// objects as missing objects).
fn check_reachable(directory: &RunDirectory) -> Result<(), TuneError> {
    let location = directory.location().to_string_lossy().into_owned();
    if raylet_storage::is_url(&location) {
        Storage::open(&location, &directory.storage_options())?.list()?;
    }
    Ok(())
}

/// How many trials run at once: as many as the alive nodes hold (summed
/// per node), at most `max_concurrent`.
fn trial_slots(
    cluster: &Cluster,
    resources: &TrialResources,
    max_concurrent: Option<usize>,
) -> Result<usize, TuneError> {
    let status = cluster.status()?;
    let mut requested: Vec<(String, f64)> = vec![
        ("CPU".into(), resources.num_cpus),
        ("GPU".into(), resources.num_gpus),
        ("memory".into(), resources.memory),
    ];
    requested.extend(resources.custom.iter().map(|(name, amount)| (name.clone(), *amount)));
    requested.retain(|(_, amount)| *amount > 0.0);
    let fitting = status.fitting(&requested);
    if fitting == 0 {
        let asked: Vec<String> = requested.iter().map(|(n, a)| format!("{n}: {a}")).collect();
        return Err(TuneError::InvalidConfig(format!(
            "no node can hold a trial's resources {{{}}}",
            asked.join(", ")
        )));
    }
    match (fitting, max_concurrent) {
        (usize::MAX, None) => Ok(status.total().get("CPU").as_f64().max(1.0) as usize),
        (fitting, Some(limit)) => Ok(fitting.min(limit.max(1))),
        (fitting, None) => Ok(fitting),
    }
}

fn result_grid(trials: Vec<Trial>, directory: RunDirectory, config: &TuneConfig) -> ResultGrid {
    let results = trials
        .into_iter()
        .map(|trial| TrialResult {
            trial_id: trial.record.view.id.clone(),
            config: trial.record.view.config.clone(),
            status: trial.record.view.status,
            metrics: trial.record.view.last_result.clone(),
            metrics_history: trial.history,
            checkpoint: trial.record.latest_checkpoint.map(|(checkpoint, _)| checkpoint),
            path: trial.directory.root().to_path_buf(),
            error: trial.record.error,
        })
        .collect();
    ResultGrid {
        results,
        directory,
        metric: config.metric.clone(),
        mode: config.mode,
    }
}
