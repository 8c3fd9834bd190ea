//! The experiment's state file, `experiment_state.json`: every trial's
//! status, config and latest checkpoint, rewritten atomically as they
//! change, so that `Tuner::restore` can finish an interrupted experiment.

use std::path::{Path, PathBuf};

use raylet_train::Metrics;
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

/// The state file of the experiment in `directory`.
pub(crate) fn path(directory: &Path) -> PathBuf {
    directory.join(STATE_FILE)
}

pub(crate) fn save(directory: &Path, state: &ExperimentState) -> Result<(), TuneError> {
    let target = path(directory);
    let temporary = directory.join(format!(".{STATE_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(state).map_err(|e| TuneError::Experiment {
        path: target.clone(),
        message: format!("encoding the state: {e}"),
    })?;
    std::fs::write(&temporary, json).map_err(|e| TuneError::io(format!("writing {}", temporary.display()), e))?;
    std::fs::rename(&temporary, &target).map_err(|e| TuneError::io(format!("replacing {}", target.display()), e))
}

pub(crate) fn load(directory: &Path) -> Result<ExperimentState, TuneError> {
    let path = path(directory);
    let bytes = std::fs::read(&path).map_err(|e| TuneError::Experiment {
        path: path.clone(),
        message: format!("no experiment to restore here ({e})"),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| TuneError::Experiment {
        path,
        message: format!("the state file does not parse: {e}"),
    })
}

/// The results in a trial's `metrics.jsonl`, skipping a torn last line.
pub(crate) fn read_history(file: &Path) -> Vec<Metrics> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Keeps the results up to `iteration` in `file` (those after it will be
/// reported again when the trial resumes from its checkpoint there).
pub(crate) fn truncate_history(file: &Path, history: &mut Vec<Metrics>, iteration: u64) -> Result<(), TuneError> {
    history.retain(|metrics| metrics.get("training_iteration").unwrap_or(0.0) as u64 <= iteration);
    let mut text = String::new();
    for metrics in history.iter() {
        text.push_str(&serde_json::to_string(metrics).unwrap_or_default());
        text.push('\n');
    }
    std::fs::write(file, text).map_err(|e| TuneError::io(format!("rewriting {}", file.display()), e))
}
