//! MLflow tracking of an experiment: raylet-train's [`MlflowCallback`] as
//! a Tune [`Callback`]. The experiment is a run named after it (params:
//! its metric and mode); each trial a child run of it (tag
//! `mlflow.parentRunId`), named by the trial's id and tagged `trial_id`
//! and `trial_name`, with the trial's sampled config as params, every
//! result's metrics at step `training_iteration`, and its checkpoints as
//! artifacts when the callback saves them. A trial's run is made when it
//! first starts (later starts log to the same run; a config PBT changes
//! later is not logged again, as MLflow params are written once), and ends
//! `FINISHED` or `FAILED` with the trial; trials still open when the
//! experiment ends are ended `KILLED`, then the experiment's run.

use raylet_train::mlflow::{MlflowCallback, NewRun, RunPlace, RunStatus, flatten_params};
use raylet_train::{Checkpoint, Metrics};

use crate::{Callback, ExperimentStart, Mode, TrialView, TuneError};

/// The key of the experiment's run among the callback's runs (a trial's
/// is its id, `trial_00000`).
const EXPERIMENT_RUN: &str = "experiment";

impl Callback for MlflowCallback {
    fn on_experiment_start(&mut self, experiment: &ExperimentStart<'_>) -> Result<(), TuneError> {
        let mode = match experiment.mode {
            Mode::Max => "max",
            Mode::Min => "min",
        };
        let params = experiment
            .metric
            .map(|metric| vec![("metric".to_string(), metric.to_string()), ("mode".into(), mode.into())])
            .unwrap_or_default();
        let run = NewRun {
            name: experiment.name,
            place: RunPlace::Experiment(experiment.name),
            tags: Vec::new(),
            params,
        };
        Ok(self.start_run(EXPERIMENT_RUN, run)?)
    }

    fn on_trial_start(&mut self, trial: &TrialView) -> Result<(), TuneError> {
        let config = serde_json::to_value(&trial.config).unwrap_or_default();
        let run = NewRun {
            name: &trial.id,
            place: RunPlace::ChildOf(EXPERIMENT_RUN),
            tags: vec![
                ("trial_id".to_string(), trial.id.clone()),
                ("trial_name".to_string(), trial.id.clone()),
            ],
            params: flatten_params(&config),
        };
        Ok(self.start_run(&trial.id, run)?)
    }

    fn on_trial_result(&mut self, trial: &TrialView, result: &Metrics) -> Result<(), TuneError> {
        Ok(self.log_metrics(&trial.id, trial.iteration, result)?)
    }

    fn on_checkpoint(&mut self, trial: &TrialView, checkpoint: &Checkpoint) -> Result<(), TuneError> {
        Ok(self.log_checkpoint(&trial.id, checkpoint)?)
    }

    fn on_trial_complete(&mut self, trial: &TrialView) -> Result<(), TuneError> {
        Ok(self.end_run(&trial.id, RunStatus::Finished)?)
    }

    fn on_trial_error(&mut self, trial: &TrialView, _error: &str) -> Result<(), TuneError> {
        Ok(self.end_run(&trial.id, RunStatus::Failed)?)
    }

    fn on_experiment_end(&mut self, _trials: &[&TrialView], error: Option<&TuneError>) -> Result<(), TuneError> {
        let status = match error {
            Some(_) => RunStatus::Failed,
            None => RunStatus::Finished,
        };
        Ok(self.end_run(EXPERIMENT_RUN, status)?)
    }
}
