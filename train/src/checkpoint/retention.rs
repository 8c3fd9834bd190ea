//! Which of a run's checkpoints stay: the latest, which the run restarts
//! from, and `num_to_keep` more, the best by the score metric or else the
//! newest.

use std::cmp::Ordering;

use super::{Checkpoint, CheckpointMetadata};
use crate::{CheckpointConfig, ScoreMode};

/// The kept checkpoints of a run and the policy that picks them.
#[derive(Debug)]
pub(crate) struct Retention {
    policy: CheckpointConfig,
    kept: Vec<(Checkpoint, CheckpointMetadata)>,
}

impl Retention {
    /// The policy, with no checkpoint yet.
    pub(crate) fn new(policy: CheckpointConfig) -> Self {
        Retention {
            policy,
            kept: Vec::new(),
        }
    }

    /// Adds a committed checkpoint; returns the ones that no longer stay.
    pub(crate) fn add(&mut self, checkpoint: Checkpoint, metadata: CheckpointMetadata) -> Vec<Checkpoint> {
        self.kept.retain(|(kept, _)| *kept != checkpoint);
        self.kept.push((checkpoint, metadata));
        self.kept.sort_by_key(|(_, metadata)| metadata.index);
        let Some(keep) = self.policy.num_to_keep else {
            return Vec::new();
        };
        let latest = self.kept.pop().expect("just pushed");
        let policy = &self.policy;
        self.kept.sort_by(|a, b| better(policy, &a.1, &b.1));
        let dropped = self.kept.split_off(keep.min(self.kept.len()));
        self.kept.push(latest);
        self.kept.sort_by_key(|(_, metadata)| metadata.index);
        dropped.into_iter().map(|(checkpoint, _)| checkpoint).collect()
    }

    /// The newest checkpoint: where a restart begins.
    pub(crate) fn latest(&self) -> Option<&(Checkpoint, CheckpointMetadata)> {
        self.kept.last()
    }

    /// The kept checkpoints, best first.
    pub(crate) fn best_first(&self) -> Vec<(Checkpoint, CheckpointMetadata)> {
        let mut ranked = self.kept.clone();
        ranked.sort_by(|a, b| better(&self.policy, &a.1, &b.1));
        ranked
    }
}

/// Orders the better checkpoint first: by score when there is a score
/// metric (one without it last), else newest first.
fn better(policy: &CheckpointConfig, a: &CheckpointMetadata, b: &CheckpointMetadata) -> Ordering {
    let Some(metric) = &policy.score_metric else {
        return b.index.cmp(&a.index);
    };
    match (a.metrics.get(metric), b.metrics.get(metric)) {
        (Some(x), Some(y)) => {
            let order = match policy.mode {
                ScoreMode::Max => y.total_cmp(&x),
                ScoreMode::Min => x.total_cmp(&y),
            };
            order.then(b.index.cmp(&a.index))
        }
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => b.index.cmp(&a.index),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;

    fn report(index: u64, accuracy: f64) -> (Checkpoint, CheckpointMetadata) {
        let metadata = CheckpointMetadata {
            index,
            metrics: Metrics::new().with("accuracy", accuracy),
        };
        (Checkpoint::from_directory(format!("checkpoint_{index}")), metadata)
    }

    fn indices(retention: &Retention) -> Vec<u64> {
        retention.best_first().iter().map(|(_, m)| m.index).collect()
    }

    #[test]
    fn the_best_by_score_stay_with_the_latest() {
        let policy = CheckpointConfig {
            num_to_keep: Some(2),
            score_metric: Some("accuracy".into()),
            mode: ScoreMode::Max,
        };
        let mut retention = Retention::new(policy);
        let mut dropped = Vec::new();
        for (index, accuracy) in [(0, 0.5), (1, 0.9), (2, 0.7), (3, 0.8), (4, 0.6)] {
            let (checkpoint, metadata) = report(index, accuracy);
            dropped.extend(retention.add(checkpoint, metadata));
        }
        assert_eq!(indices(&retention), [1, 3, 4], "best two, then the latest");
        assert_eq!(retention.latest().unwrap().1.index, 4);
        let dropped: Vec<_> = dropped.iter().map(|c| c.path().display().to_string()).collect();
        assert_eq!(dropped, ["checkpoint_0", "checkpoint_2"]);
    }

    #[test]
    fn without_a_score_the_newest_stay_and_min_mode_prefers_low_scores() {
        let mut newest = Retention::new(CheckpointConfig {
            num_to_keep: Some(1),
            ..CheckpointConfig::default()
        });
        let mut lowest = Retention::new(CheckpointConfig {
            num_to_keep: Some(1),
            score_metric: Some("accuracy".into()),
            mode: ScoreMode::Min,
        });
        for (index, accuracy) in [(0, 0.5), (1, 0.2), (2, 0.7), (3, 0.9)] {
            let (checkpoint, metadata) = report(index, accuracy);
            newest.add(checkpoint.clone(), metadata.clone());
            lowest.add(checkpoint, metadata);
        }
        assert_eq!(indices(&newest), [3, 2]);
        assert_eq!(indices(&lowest), [1, 3]);
    }

    #[test]
    fn with_no_limit_every_checkpoint_stays() {
        let mut retention = Retention::new(CheckpointConfig::default());
        for index in 0..5 {
            let (checkpoint, metadata) = report(index, 0.1);
            assert!(retention.add(checkpoint, metadata).is_empty());
        }
        assert_eq!(indices(&retention), [4, 3, 2, 1, 0]);
    }
}
