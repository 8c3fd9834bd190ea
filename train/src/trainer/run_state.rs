//! What the driver keeps of a run across its tries: the reports so far and
//! the kept checkpoints, on disk as they come.

use std::time::Duration;

use crate::checkpoint::{Retention, RunDirectory};
use crate::trainer::result::{Report, TrainResult};
use crate::{Checkpoint, CheckpointConfig, CheckpointMetadata, TrainError};

pub(super) struct RunState {
    directory: RunDirectory,
    retention: Retention,
    history: Vec<Report>,
}

impl RunState {
    /// The state of a run in `directory`, with the checkpoints an earlier
    /// run of the same name left there.
    pub(super) fn resume(directory: RunDirectory, policy: CheckpointConfig) -> Result<Self, TrainError> {
        let mut retention = Retention::new(policy);
        for (checkpoint, metadata) in directory.committed()? {
            for dropped in retention.add(checkpoint, metadata) {
                remove_checkpoint(&dropped)?;
            }
        }
        Ok(RunState {
            directory,
            retention,
            history: Vec::new(),
        })
    }

    pub(super) fn directory(&self) -> &RunDirectory {
        &self.directory
    }

    /// The checkpoint a try starts from.
    pub(super) fn latest(&self) -> Option<Checkpoint> {
        self.retention.latest().map(|(checkpoint, _)| checkpoint.clone())
    }

    /// The number of a try's first report: one past the latest checkpoint's.
    pub(super) fn next_report(&self) -> u64 {
        self.retention.latest().map_or(0, |(_, metadata)| metadata.index + 1)
    }

    /// Keeps a report of rank 0: in the history, in `metrics.jsonl`, and its
    /// checkpoint under the retention policy.
    pub(super) fn record(&mut self, report: Report) -> Result<(), TrainError> {
        let line = serde_json::json!({
            "index": report.index,
            "attempt": report.attempt,
            "metrics": report.metrics,
            "checkpoint": report.checkpoint.as_ref().map(|c| c.path().display().to_string()),
        });
        self.directory.append_metrics(&line)?;
        if let Some(checkpoint) = &report.checkpoint {
            let metadata = CheckpointMetadata {
                index: report.index,
                metrics: report.metrics.clone(),
            };
            for dropped in self.retention.add(checkpoint.clone(), metadata) {
                remove_checkpoint(&dropped)?;
            }
        }
        self.history.push(report);
        Ok(())
    }

    pub(super) fn into_result(self, failures: u32, elapsed: Duration) -> TrainResult {
        let best_checkpoints = self.retention.best_first();
        TrainResult {
            metrics: self.history.last().map(|r| r.metrics.clone()).unwrap_or_default(),
            checkpoint: self.retention.latest().map(|(checkpoint, _)| checkpoint.clone()),
            best_checkpoints: best_checkpoints
                .into_iter()
                .map(|(c, metadata)| (c, metadata.metrics))
                .collect(),
            metrics_history: self.history,
            path: self.directory.root().to_path_buf(),
            failures,
            elapsed,
        }
    }
}

fn remove_checkpoint(checkpoint: &Checkpoint) -> Result<(), TrainError> {
    checkpoint.remove()
}
