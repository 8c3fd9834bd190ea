//! A trial as searchers, schedulers and results see it: its name, status,
//! hyperparameters and latest result.

use std::fmt;

use raylet_train::Metrics;
use serde::{Deserialize, Serialize};

use crate::TrialConfig;

/// Where a trial is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TrialStatus {
    /// Made, waiting for a free slot.
    Pending,
    Running,
    /// Stopped by its scheduler for now; it resumes from its latest checkpoint.
    Paused,
    /// Finished, or stopped for good by a scheduler or stopper.
    Terminated,
    /// Failed more often than it may.
    Error,
}

impl TrialStatus {
    pub fn is_finished(self) -> bool {
        matches!(self, TrialStatus::Terminated | TrialStatus::Error)
    }
}

impl fmt::Display for TrialStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrialStatus::Pending => "PENDING",
            TrialStatus::Running => "RUNNING",
            TrialStatus::Paused => "PAUSED",
            TrialStatus::Terminated => "TERMINATED",
            TrialStatus::Error => "ERROR",
        })
    }
}

/// One trial's public state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialView {
    /// `trial_00042`: also its directory's name.
    pub id: String,
    pub status: TrialStatus,
    pub config: TrialConfig,
    /// Its latest report, with `training_iteration` and `time_total_s`.
    pub last_result: Option<Metrics>,
    /// How many reports it made.
    pub iteration: u64,
    /// Whether it reported a checkpoint that it can resume from.
    pub has_checkpoint: bool,
}

impl TrialView {
    /// A new trial with `config`, waiting to run.
    pub fn pending(id: String, config: TrialConfig) -> Self {
        TrialView {
            id,
            status: TrialStatus::Pending,
            config,
            last_result: None,
            iteration: 0,
            has_checkpoint: false,
        }
    }
}
