//! The driver's record of one trial: its public view, its directory and
//! results, where it restarts from, and what it becomes when its current
//! run stops.

use raylet_train::{Checkpoint, Metrics, RunDirectory};
use serde::{Deserialize, Serialize};

use crate::{TrialStatus, TrialView, TuneError};

/// What a running trial becomes once the scheduler's stop takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnStop {
    Terminate,
    Pause,
    /// Pending again at once (resumed, or re-seeded by PBT).
    Restart,
}

/// A donor's checkpoint that a trial restarts from.
#[derive(Clone, Debug)]
pub(crate) struct Donor {
    pub(crate) checkpoint: Checkpoint,
    pub(crate) iteration: u64,
    pub(crate) metrics: Metrics,
}

/// What the experiment's state file keeps of a trial.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TrialRecord {
    pub(crate) view: TrialView,
    pub(crate) failures: u32,
    pub(crate) error: Option<String>,
    /// The latest checkpoint and the iteration it was made at.
    pub(crate) latest_checkpoint: Option<(Checkpoint, u64)>,
}

/// One trial, as the driver tracks it.
pub(crate) struct Trial {
    pub(crate) record: TrialRecord,
    pub(crate) directory: RunDirectory,
    pub(crate) history: Vec<Metrics>,
    pub(crate) on_stop: OnStop,
    /// Stop at its next report (a scheduler stopped it while it ran).
    pub(crate) stop_requested: bool,
    pub(crate) donor: Option<Donor>,
}

impl Trial {
    pub(crate) fn new(record: TrialRecord, directory: RunDirectory, history: Vec<Metrics>) -> Self {
        Trial {
            record,
            directory,
            history,
            on_stop: OnStop::Terminate,
            stop_requested: false,
            donor: None,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.record.view.id
    }

    pub(crate) fn view(&self) -> &TrialView {
        &self.record.view
    }

    pub(crate) fn status(&self) -> TrialStatus {
        self.record.view.status
    }

    /// Its `time_total_s` so far: that of its latest result.
    pub(crate) fn time_total(&self) -> f64 {
        let last = self.record.view.last_result.as_ref();
        last.and_then(|m| m.get("time_total_s")).unwrap_or(0.0)
    }

    pub(crate) fn set_status(&mut self, status: TrialStatus) {
        self.record.view.status = status;
    }

    /// Records a result and the checkpoint that came with it.
    pub(crate) fn record_result(&mut self, metrics: &Metrics, checkpoint: Option<Checkpoint>) -> Result<(), TuneError> {
        let iteration = metrics.get("training_iteration").unwrap_or(0.0) as u64;
        self.record.view.iteration = iteration;
        self.record.view.last_result = Some(metrics.clone());
        if let Some(checkpoint) = checkpoint {
            self.record.latest_checkpoint = Some((checkpoint, iteration));
            self.record.view.has_checkpoint = true;
        }
        self.history.push(metrics.clone());
        let line = serde_json::to_value(metrics).unwrap_or_default();
        Ok(self.directory.append_metrics(&line)?)
    }

    /// What the state file keeps of the trial: its checkpoint by path and
    /// iteration, without the options that open object storage (which may
    /// hold credentials); a restore finds it in the trial's directory.
    pub(crate) fn saved_record(&self) -> TrialRecord {
        let mut record = self.record.clone();
        record.latest_checkpoint = record
            .latest_checkpoint
            .map(|(checkpoint, iteration)| (Checkpoint::from_directory(checkpoint.path()), iteration));
        record
    }

    /// Writes `params.json`: the trial's current config.
    pub(crate) fn write_params(&self) -> Result<(), TuneError> {
        let json = serde_json::to_vec_pretty(&self.record.view.config).unwrap_or_default();
        Ok(self.directory.write_file("params.json", json)?)
    }

    /// Writes `progress.csv`: a row per result.
    pub(crate) fn write_progress_csv(&self) -> Result<(), TuneError> {
        let rows: Vec<Vec<(String, String)>> = self
            .history
            .iter()
            .map(|metrics| metrics.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
            .collect();
        crate::result_grid::write_csv(&self.directory, "progress.csv", &rows)
    }
}
