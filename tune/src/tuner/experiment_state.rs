//! The experiment's state file, `experiment_state.json`: every trial's
//! status, config and latest checkpoint, rewritten atomically as they
//! change (in object storage too, for an experiment kept there), so that
//! `Tuner::restore` can finish an interrupted experiment.

use raylet_train::{Metrics, RunDirectory};
use serde::{Deserialize, Serialize};

use super::trial_state::TrialRecord;
use crate::{Mode, TuneError};

const STATE_FILE: &str = "experiment_state.json";

/// What the state file holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ExperimentState {
    pub(crate) name: String,
    pub(crate) trainable: String,
    pub(crate) metric: Option<String>,
    pub(crate) mode: Mode,
    pub(crate) num_samples: usize,
    /// The searcher said it has no more trials.
    pub(crate) searcher_finished: bool,
    pub(crate) trials: Vec<TrialRecord>,
}

/// Writes the state file in the experiment's directory (and its folder in
/// object storage), whole.
pub(crate) fn save(directory: &RunDirectory, state: &ExperimentState) -> Result<(), TuneError> {
    let json = serde_json::to_vec_pretty(state).map_err(|e| TuneError::Experiment {
        path: directory.location().join(STATE_FILE),
        message: format!("encoding the state: {e}"),
    })?;
    Ok(directory.write_file(STATE_FILE, json)?)
}

/// The state of the experiment in `directory`, or `None` where it has none.
pub(crate) fn load(directory: &RunDirectory) -> Result<Option<ExperimentState>, TuneError> {
    let Some(bytes) = directory.read_file(STATE_FILE)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| TuneError::Experiment {
            path: directory.location().join(STATE_FILE),
            message: format!("the state file does not parse: {e}"),
        })
}

/// The results in a trial's `metrics.jsonl`, skipping a torn last line.
pub(crate) fn read_history(trial: &RunDirectory) -> Result<Vec<Metrics>, TuneError> {
    let Some(bytes) = trial.read_file(RunDirectory::METRICS_FILE)? else {
        return Ok(Vec::new());
    };
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// Keeps the results up to `iteration` in the trial's `metrics.jsonl`
/// (those after it will be reported again when the trial resumes from its
/// checkpoint there).
pub(crate) fn truncate_history(
    trial: &RunDirectory,
    history: &mut Vec<Metrics>,
    iteration: u64,
) -> Result<(), TuneError> {
    history.retain(|metrics| metrics.get("training_iteration").unwrap_or(0.0) as u64 <= iteration);
    let mut text = String::new();
    for metrics in history.iter() {
        text.push_str(&serde_json::to_string(metrics).unwrap_or_default());
        text.push('\n');
    }
    Ok(trial.write_file(RunDirectory::METRICS_FILE, text)?)
}
