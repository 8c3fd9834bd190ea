//! `TrialEvent`: what a trial tells the driver, sent from its trainable's
//! context and thread, and returned by the trial actor's `step`.

use raylet_train::{Checkpoint, Metrics};
use serde::{Deserialize, Serialize};

/// What a trial tells the driver.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum TrialEvent {
    Report {
        metrics: Metrics,
        checkpoint: Option<Checkpoint>,
    },
    /// The trainable returned.
    Finished,
    /// The trainable returned after the scheduler stopped or paused it.
    Stopped,
    /// The trainable failed or panicked.
    Failed(String),
}

impl TrialEvent {
    /// Whether the trial's run is over: anything but a report.
    pub(crate) fn ends_the_run(&self) -> bool {
        !matches!(self, TrialEvent::Report { .. })
    }
}
