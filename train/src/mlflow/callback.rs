//! [`MlflowCallback`]: the tracker's settings, the MLflow runs it has open
//! (each under a key: a Train run's, a Tune trial's id), the steps that
//! the Train and Tune callbacks are made of, and the Train callback.

use std::collections::BTreeMap;

use raylet_storage::Storage;

use super::client::{MlflowClient, RunHandle, RunStatus};
use super::{MlflowError, flatten_params};
use crate::{Checkpoint, Metrics, Report, RunStart, TrainCallback, TrainError, TrainResult};

/// The key of a Train run among a callback's runs.
const TRAIN_RUN: &str = "train";
/// The tag that makes a run the child of another.
const PARENT_TAG: &str = "mlflow.parentRunId";
/// The artifact folder of checkpoints.
const CHECKPOINTS: &str = "checkpoints";

/// Tracks a Train run, or a Tune experiment and its trials, on an MLflow
/// tracking server (see the [module](super)).
///
/// ```no_run
/// # fn main() -> Result<(), raylet_train::TrainError> {
/// use raylet_train::digits::DigitsTraining;
/// use raylet_train::mlflow::MlflowCallback;
/// use raylet_train::Trainer;
///
/// let mlflow = MlflowCallback::new("http://127.0.0.1:5000")?
///     .experiment_name("digits")
///     .tag("team", "vision")
///     .save_artifact(true);
/// Trainer::new(DigitsTraining::default()).callback(mlflow).fit()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MlflowCallback {
    client: MlflowClient,
    experiment_name: Option<String>,
    tags: BTreeMap<String, String>,
    save_artifact: bool,
    strict: bool,
    /// The open runs by key.
    runs: BTreeMap<String, OpenRun>,
}

/// A run the callback started and has not ended.
#[derive(Debug)]
struct OpenRun {
    handle: RunHandle,
    /// The key of its parent run.
    parent: Option<String>,
}

/// Where a new run goes.
#[derive(Clone, Copy, Debug)]
pub enum RunPlace<'a> {
    /// A run of its own, in the callback's experiment or else in the
    /// experiment of this name.
    Experiment(&'a str),
    /// A child of the open run of this key, in its experiment.
    ChildOf(&'a str),
}

/// A run to start.
#[derive(Clone, Debug)]
pub struct NewRun<'a> {
    /// Its MLflow run name.
    pub name: &'a str,
    pub place: RunPlace<'a>,
    /// Tags besides the callback's own.
    pub tags: Vec<(String, String)>,
    pub params: Vec<(String, String)>,
}

impl MlflowCallback {
    /// A tracker of the server at `tracking_uri` (`http://host:5000`);
    /// refused unless it is an http(s) URL. Nothing is sent until a run
    /// starts.
    pub fn new(tracking_uri: &str) -> Result<Self, MlflowError> {
        Ok(MlflowCallback {
            client: MlflowClient::new(tracking_uri)?,
            experiment_name: None,
            tags: BTreeMap::new(),
            save_artifact: false,
            strict: false,
            runs: BTreeMap::new(),
        })
    }

    /// The experiment runs go in (made if missing); by default the Train
    /// run's or the Tune experiment's name.
    pub fn experiment_name(mut self, name: impl Into<String>) -> Self {
        self.experiment_name = Some(name.into());
        self
    }

    /// A tag set on every run.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// Upload each reported checkpoint's files as artifacts, under
    /// `checkpoints/<its directory's name>/` (off by default, as Ray's).
    pub fn save_artifact(mut self, save: bool) -> Self {
        self.save_artifact = save;
        self
    }

    /// Make a failed tracking call end the run with its error, instead of
    /// a warning and going on without it (off by default).
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Sends `token` as a bearer token (what `MLFLOW_TRACKING_TOKEN` holds).
    pub fn tracking_token(mut self, token: impl Into<String>) -> Self {
        self.client = self.client.bearer_token(token);
        self
    }

    /// The MLflow run open under `key`, if any.
    pub fn run(&self, key: &str) -> Option<&RunHandle> {
        self.runs.get(key).map(|run| &run.handle)
    }

    /// Starts a run under `key` and logs its params, unless one is open
    /// under that key already. A child of a run that is not open (its
    /// start failed) is not started.
    pub fn start_run(&mut self, key: &str, run: NewRun<'_>) -> Result<(), MlflowError> {
        if self.runs.contains_key(key) {
            return Ok(());
        }
        let created = self.create(&run);
        let Some(Some(started)) = self.settle(created, "starting a run: it is not tracked")? else {
            return Ok(());
        };
        let logged = self.client.log_params(&started.handle.run_id, &run.params);
        self.runs.insert(key.to_string(), started);
        self.settle(logged, "logging params").map(drop)
    }

    /// Logs `metrics` at `step` to the run of `key`, if it is open.
    pub fn log_metrics(&self, key: &str, step: u64, metrics: &Metrics) -> Result<(), MlflowError> {
        let Some(run) = self.run(key) else {
            return Ok(());
        };
        let logged = self.client.log_metrics(&run.run_id, step, metrics);
        self.settle(logged, "logging metrics").map(drop)
    }

    /// Uploads `checkpoint`'s files to the run of `key`, if it is open and
    /// the callback saves artifacts.
    pub fn log_checkpoint(&self, key: &str, checkpoint: &Checkpoint) -> Result<(), MlflowError> {
        let Some(run) = self.run(key).filter(|_| self.save_artifact) else {
            return Ok(());
        };
        let uploaded = upload_checkpoint(&self.client, run, checkpoint);
        self.settle(uploaded, "uploading a checkpoint").map(drop)
    }

    /// Ends the run of `key` with `status`, if it is open, after ending
    /// its open children as killed.
    pub fn end_run(&mut self, key: &str, status: RunStatus) -> Result<(), MlflowError> {
        let children: Vec<String> = self
            .runs
            .iter()
            .filter(|(_, run)| run.parent.as_deref() == Some(key))
            .map(|(child, _)| child.clone())
            .collect();
        for child in children {
            self.end_run(&child, RunStatus::Killed)?;
        }
        let Some(run) = self.runs.remove(key) else {
            return Ok(());
        };
        let ended = self.client.end_run(&run.handle.run_id, status);
        self.settle(ended, "ending a run").map(drop)
    }

    /// Makes the run; `None` for a child whose parent is not open.
    fn create(&self, run: &NewRun<'_>) -> Result<Option<OpenRun>, MlflowError> {
        let mut tags: Vec<(String, String)> = self.tags.clone().into_iter().chain(run.tags.clone()).collect();
        let (experiment_id, parent) = match run.place {
            RunPlace::Experiment(default) => {
                let name = self.experiment_name.as_deref().unwrap_or(default);
                (self.client.experiment_id(name)?, None)
            }
            RunPlace::ChildOf(parent) => {
                let Some(parent_run) = self.run(parent) else {
                    return Ok(None);
                };
                tags.push((PARENT_TAG.to_string(), parent_run.run_id.clone()));
                (parent_run.experiment_id.clone(), Some(parent.to_string()))
            }
        };
        let handle = self.client.create_run(&experiment_id, run.name, &tags)?;
        Ok(Some(OpenRun { handle, parent }))
    }

    /// A call's outcome under the callback's strictness: its error when
    /// strict, else a warning and `None`.
    fn settle<T>(&self, outcome: Result<T, MlflowError>, doing: &str) -> Result<Option<T>, MlflowError> {
        match outcome {
            Ok(value) => Ok(Some(value)),
            Err(error) if self.strict => Err(error),
            Err(error) => {
                tracing::warn!("MLflow tracking failed ({doing}); training goes on without it: {error}");
                Ok(None)
            }
        }
    }
}

/// Uploads every file of `checkpoint` under `checkpoints/<its name>/`.
fn upload_checkpoint(client: &MlflowClient, run: &RunHandle, checkpoint: &Checkpoint) -> Result<(), MlflowError> {
    let unreadable = |message: String| MlflowError::Checkpoint {
        path: checkpoint.path().to_path_buf(),
        message,
    };
    checkpoint.ensure_local().map_err(|e| unreadable(e.to_string()))?;
    let name = checkpoint
        .path()
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .ok_or_else(|| unreadable("it has no directory name".into()))?;
    let files = Storage::Local(checkpoint.path().to_path_buf());
    for (file, _) in files.list().map_err(|e| unreadable(e.to_string()))? {
        let bytes = files.read(&file).map_err(|e| unreadable(e.to_string()))?;
        client.upload_artifact(run, &format!("{CHECKPOINTS}/{name}/{file}"), bytes)?;
    }
    Ok(())
}

/// A Train run is one MLflow run: params are the train loop's config and
/// the scaling, metrics every report's at its index, artifacts its
/// checkpoints.
impl TrainCallback for MlflowCallback {
    fn on_start(&mut self, run: &RunStart<'_>) -> Result<(), TrainError> {
        let mut params = flatten_params(&run.config);
        params.push(("scaling.num_workers".into(), run.scaling.num_workers.to_string()));
        params.push(("scaling.use_gpu".into(), run.scaling.use_gpu.to_string()));
        let new_run = NewRun {
            name: run.name,
            place: RunPlace::Experiment(run.name),
            tags: Vec::new(),
            params,
        };
        Ok(self.start_run(TRAIN_RUN, new_run)?)
    }

    fn on_report(&mut self, report: &Report) -> Result<(), TrainError> {
        Ok(self.log_metrics(TRAIN_RUN, report.index, &report.metrics)?)
    }

    fn on_checkpoint(&mut self, _index: u64, checkpoint: &Checkpoint) -> Result<(), TrainError> {
        Ok(self.log_checkpoint(TRAIN_RUN, checkpoint)?)
    }

    fn on_end(&mut self, outcome: Result<&TrainResult, &TrainError>) -> Result<(), TrainError> {
        let status = match outcome {
            Ok(_) => RunStatus::Finished,
            Err(_) => RunStatus::Failed,
        };
        Ok(self.end_run(TRAIN_RUN, status)?)
    }
}
