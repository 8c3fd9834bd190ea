//! What a finished run hands back: every report, the latest checkpoint,
//! and the kept checkpoints ranked by score.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Checkpoint, Metrics};

/// One report of rank 0, as the driver got it.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The report's number in the run: 0 for the first. A try that
    /// restarts from checkpoint `k` numbers its reports from `k + 1` again.
    pub index: u64,
    /// The try of the run it came from.
    pub attempt: u32,
    /// How many workers that try had.
    pub world_size: usize,
    pub metrics: Metrics,
    pub checkpoint: Option<Checkpoint>,
}

/// The outcome of [`Trainer::fit`](crate::Trainer::fit).
#[derive(Clone, Debug)]
pub struct TrainResult {
    /// The metrics of the last report.
    pub metrics: Metrics,
    /// Every report, in the order the driver got them.
    pub metrics_history: Vec<Report>,
    /// The latest checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// The kept checkpoints with their metrics, best first.
    pub best_checkpoints: Vec<(Checkpoint, Metrics)>,
    /// The run's directory.
    pub path: PathBuf,
    /// How many tries failed and were restarted.
    pub failures: u32,
    pub elapsed: Duration,
}

impl TrainResult {
    /// The best kept checkpoint by the run's score metric (the newest
    /// without one).
    pub fn best_checkpoint(&self) -> Option<&Checkpoint> {
        self.best_checkpoints.first().map(|(checkpoint, _)| checkpoint)
    }
}
